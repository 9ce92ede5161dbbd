"""Accepted turns (``session_turns``): a turn is durable from the moment it is accepted.

A message is recorded as an ACCEPTED turn before any reply streams (``TurnStore.accept``),
with the next ordinal of its session. A driver takes the turn's lease to run it
(``claim``: RUNNING, a fencing token, an expiry it renews), and ends it in the same
transaction as the turn's messages, audit rows and memory (``finish``, fenced: a driver
whose lease was taken over writes nothing). A turn whose driver died keeps its lease until
it expires; then it is an orphan (``orphans``) and any driver may take it again, up to the
attempts limit, after which it ends FAILED with the reason.

Turns of one session run one at a time in ordinal order: ``claim`` grants a turn only
when every earlier turn of its session has ended and no other turn holds a live lease. Every
statement that takes locks takes the session's row first, then the turn's, so writers of
one session never deadlock.

The conversation a person reads (``history``) is the finished turns' messages in order,
then the user message of each pending turn, by ordinal; the prompt history of the decision
cycle (``Store.conversation``) has only finished turns' messages.
"""

from __future__ import annotations

from uuid import UUID, uuid4

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from cortex_ray._types import SessionStatus
from cortex_ray.observability import current_traceparent, submission_span
from cortex_ray.storage._database import Database
from cortex_ray.storage._turn_leases import TurnLeaseRows
from cortex_ray.storage._turn_records import (
    SessionMessage,
    StoredTurnEvent,
    TurnClaim,
    TurnLease,
    TurnLeaseLostError,
    TurnRecord,
    TurnRef,
    TurnStatus,
    lock_session,
    turn_of,
)

__all__ = [
    "SessionMessage",
    "StoredTurnEvent",
    "TurnClaim",
    "TurnLease",
    "TurnLeaseLostError",
    "TurnRecord",
    "TurnRef",
    "TurnStatus",
    "TurnStore",
]


class TurnStore(TurnLeaseRows):
    """The SQL of accepted turns.

    Its lease half (claim, renew, finish, fail, release, orphans) is ``TurnLeaseRows``
    (``_turn_leases``), a mixin like ``Store``'s: every method stays ``TurnStore``'s own."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def accept(
        self,
        org_id: str,
        session_id: UUID,
        caller_id: str,
        message: str,
        *,
        max_pending: int | None = None,
    ) -> TurnRecord:
        """Record a message as an ACCEPTED turn, the session's next, under the trace of the
        current span (an HTTP request's: the actor that drives the turn joins that trace).

        Raises:
            InvalidRequestError: The message is empty.
            AccessDeniedError: ``caller_id`` is not the session's caller.
            ConflictError: The session has ended, or already holds ``max_pending`` turns
                that have not ended (a busy session: try again when it answers).
        """
        if not message.strip():
            raise InvalidRequestError("the message is empty")
        # Outside a request (a Python caller, the actor's own admission), a span of its own
        # stands for the acceptance: the turn's spans, wherever driven, hang under it.
        with submission_span(
            "accept_turn", {"cortex.org_id": org_id, "cortex.session_id": str(session_id)}
        ):
            async with self.db.transaction() as conn:
                session = await lock_session(conn, org_id, session_id)
                if session["caller_id"] != caller_id:
                    raise AccessDeniedError("only the session's own caller may talk in it")
                if session["status"] != SessionStatus.OPEN.value:
                    raise ConflictError(f"session {session_id} has ended")
                cur = await conn.execute(
                    """
                    SELECT coalesce(max(ordinal), -1) AS last,
                           count(*) FILTER (WHERE status IN ('ACCEPTED', 'RUNNING')) AS pending
                    FROM session_turns WHERE org_id = %s AND session_id = %s
                    """,
                    (org_id, session_id),
                )
                row = await cur.fetchone()
                assert row is not None
                if max_pending is not None and row["pending"] >= max_pending:
                    raise ConflictError(
                        f"session {session_id} already has {row['pending']} turn(s) running or "
                        f"queued (limit {max_pending}); try again when it answers"
                    )
                cur = await conn.execute(
                    """
                    INSERT INTO session_turns (org_id, session_id, id, ordinal, caller_id, message,
                                               status, trace_parent)
                    VALUES (%s, %s, %s, %s, %s, %s, 'ACCEPTED', %s)
                    RETURNING *
                    """,
                    (
                        org_id,
                        session_id,
                        uuid4(),
                        row["last"] + 1,
                        caller_id,
                        message,
                        current_traceparent(),
                    ),
                )
                inserted = await cur.fetchone()
        assert inserted is not None
        return turn_of(inserted)

    async def get(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnRecord:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM session_turns WHERE org_id = %s AND session_id = %s AND id = %s",
                (org_id, session_id, turn_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"turn {turn_id} not found in session {session_id}")
        return turn_of(row)

    async def status(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnStatus:
        """Only the turn's status (one column): what a long poll reads."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT status FROM session_turns "
                "WHERE org_id = %s AND session_id = %s AND id = %s",
                (org_id, session_id, turn_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"turn {turn_id} not found in session {session_id}")
        return TurnStatus(row["status"])

    async def history(self, org_id: str, session_id: UUID) -> list[SessionMessage]:
        """The conversation as a person reads it: finished turns' messages in order, then
        each pending turn's user message by ordinal."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT role, content, tool, turn_id, turn_status, refused FROM (
                    SELECT 0 AS part, m.seq AS pos, m.role, m.content, m.tool, m.turn_id,
                           t.status AS turn_status,
                           CASE WHEN m.role = 'user' THEN coalesce(t.refused, t.reason) END
                               AS refused
                    FROM session_messages m
                    LEFT JOIN session_turns t
                      ON t.org_id = m.org_id AND t.session_id = m.session_id AND t.id = m.turn_id
                    WHERE m.org_id = %s AND m.session_id = %s
                    UNION ALL
                    SELECT 1, p.ordinal, 'user', p.message, NULL, p.id, p.status, NULL
                    FROM session_turns p
                    WHERE p.org_id = %s AND p.session_id = %s
                      AND p.status IN ('ACCEPTED', 'RUNNING')
                ) AS conversation
                ORDER BY part, pos
                """,
                (org_id, session_id, org_id, session_id),
            )
            rows = await cur.fetchall()
        return [
            SessionMessage(
                role=r["role"],
                content=r["content"],
                tool=r["tool"],
                turn_id=r["turn_id"],
                turn_status=None if r["turn_status"] is None else TurnStatus(r["turn_status"]),
                refused=r["refused"],
            )
            for r in rows
        ]
