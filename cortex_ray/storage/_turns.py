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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConflictError,
    InvalidRequestError,
    LeaseLost,
    NotFoundError,
)
from cortex_ray._types import (
    SessionStatus,
    Turn,
    TurnEvent,
    TurnEventKind,
    TurnResult,
)
from cortex_ray.observability import current_traceparent, submission_span
from cortex_ray.storage._database import Conn, Database

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


class TurnStatus(StrEnum):
    """Where an accepted turn is: waiting, being driven, or ended (with a reply or refusal,
    or failed with the reason)."""

    ACCEPTED = "ACCEPTED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"

    @property
    def ended(self) -> bool:
        return self in (TurnStatus.DONE, TurnStatus.FAILED)


class TurnLeaseLostError(LeaseLost):
    """A turn's lease was taken over (it expired) or the turn ended: this driver's outcome
    is not recorded; the new holder's is."""


class StoredTurnEvent(BaseModel):
    """One event a turn emitted, with its sequence number in the turn (1, 2, ...; 0 is the
    ``started`` event the API sends before any of them)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    event: TurnEvent


class TurnRecord(BaseModel):
    """One ``session_turns`` row."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    org_id: str
    session_id: UUID
    ordinal: int
    caller_id: str
    message: str
    status: TurnStatus
    reply: str | None = None
    refused: str | None = None
    reason: str | None = None
    events: tuple[StoredTurnEvent, ...] = ()
    attempts: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    accepted_at: datetime
    finished_at: datetime | None = None
    trace_parent: str | None = None
    """The W3C ``traceparent`` the turn was accepted under: its driver's spans join it."""

    def result(self) -> TurnResult:
        """The ``TurnResult`` of an ended turn, rebuilt from what it stored."""
        observations = tuple(
            e.event.observation
            for e in self.events
            if e.event.kind is TurnEventKind.OBSERVATION and e.event.observation is not None
        )
        refused = self.refused
        if self.reply is None and refused is None:
            refused = self.reason or "no reply"
        return TurnResult(
            session_id=self.session_id,
            reply=self.reply,
            observations=observations,
            refused=refused,
        )

    @property
    def last_seq(self) -> int:
        """The sequence number of the turn's last stored event (0: none)."""
        return self.events[-1].seq if self.events else 0


@dataclass(frozen=True, slots=True)
class TurnRef:
    """Where a turn is: organisation, session, turn."""

    org_id: str
    session_id: UUID
    turn_id: UUID


@dataclass(frozen=True, slots=True)
class TurnLease:
    """A driver's hold on a RUNNING turn: its owner and fencing token."""

    turn: TurnRecord
    owner: str
    token: int

    def idempotency_key(self, round_index: int) -> str:
        """The key of a tool call in round ``round_index`` of this turn (same on every
        attempt, so an idempotent tool does not repeat its effect)."""
        return f"turn:{self.turn.id}:{round_index}"


@dataclass(frozen=True, slots=True)
class TurnClaim:
    """What ``claim`` found: the lease (``claimed``), the ended turn (``ended``), or that it
    must wait for an earlier turn or a live holder (``wait``)."""

    outcome: Literal["claimed", "ended", "wait"]
    turn: TurnRecord
    lease: TurnLease | None = None


class SessionMessage(Turn):
    """A message of the conversation as a person reads it: with its turn, the turn's status
    and, for a turn that ended without a reply, why."""

    turn_id: UUID | None = None
    turn_status: TurnStatus | None = None
    refused: str | None = None


def _record(row: dict[str, Any]) -> TurnRecord:
    return TurnRecord(
        id=row["id"],
        org_id=row["org_id"],
        session_id=row["session_id"],
        ordinal=row["ordinal"],
        caller_id=row["caller_id"],
        message=row["message"],
        status=TurnStatus(row["status"]),
        reply=row["reply"],
        refused=row["refused"],
        reason=row["reason"],
        events=tuple(StoredTurnEvent.model_validate(e) for e in row["events"] or ()),
        attempts=row["attempts"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        accepted_at=row["accepted_at"],
        finished_at=row["finished_at"],
        trace_parent=row.get("trace_parent"),
    )


def _events_json(events: Sequence[TurnEvent]) -> Jsonb:
    return Jsonb(
        [
            StoredTurnEvent(seq=i, event=e).model_dump(mode="json", exclude_none=True)
            for i, e in enumerate(events, start=1)
        ]
    )


async def _lock_session(conn: Conn, org_id: str, session_id: UUID) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT status, caller_id FROM sessions WHERE org_id = %s AND id = %s FOR UPDATE",
        (org_id, session_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"session {session_id} not found in organisation {org_id!r}")
    return row


async def _append_messages(
    conn: Conn, org_id: str, session_id: UUID, turn_id: UUID, turns: Sequence[Turn]
) -> None:
    """Append a turn's messages (the session's row is locked by the caller: contiguous seq)."""
    if not turns:
        return
    cur = await conn.execute(
        "SELECT coalesce(max(seq), -1) AS last FROM session_messages "
        "WHERE org_id = %s AND session_id = %s",
        (org_id, session_id),
    )
    row = await cur.fetchone()
    seq = (row["last"] if row else -1) + 1
    async with conn.cursor() as c:
        await c.executemany(
            """
            INSERT INTO session_messages (org_id, session_id, seq, role, content, tool, turn_id)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            """,
            [
                (org_id, session_id, seq + i, t.role, t.content, t.tool, turn_id)
                for i, t in enumerate(turns)
            ],
        )


class TurnStore:
    """The SQL of accepted turns."""

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
                session = await _lock_session(conn, org_id, session_id)
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
        return _record(inserted)

    async def get(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnRecord:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM session_turns WHERE org_id = %s AND session_id = %s AND id = %s",
                (org_id, session_id, turn_id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"turn {turn_id} not found in session {session_id}")
        return _record(row)

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

    async def claim(
        self,
        org_id: str,
        session_id: UUID,
        turn_id: UUID,
        *,
        owner: str,
        ttl_s: float,
        max_attempts: int,
    ) -> TurnClaim:
        """Take the turn's lease if it is this turn's time to run.

        ``wait`` while an earlier turn of the session has not ended or another driver holds
        a live lease on a turn of the session (``owner`` re-takes its own lease at once: a
        restarted actor of the same name). A turn already driven ``max_attempts`` times ends
        FAILED here instead (its user message goes into the history): ``ended``.
        """
        async with self.db.transaction() as conn:
            await _lock_session(conn, org_id, session_id)
            cur = await conn.execute(
                "SELECT * FROM session_turns WHERE org_id = %s AND session_id = %s AND id = %s "
                "FOR UPDATE",
                (org_id, session_id, turn_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"turn {turn_id} not found in session {session_id}")
            turn = _record(row)
            if turn.status.ended:
                return TurnClaim("ended", turn)
            cur = await conn.execute(
                """
                SELECT 1 FROM session_turns
                WHERE org_id = %s AND session_id = %s AND status IN ('ACCEPTED', 'RUNNING')
                  AND (ordinal < %s
                       OR (lease_expires_at > now() AND lease_owner IS DISTINCT FROM %s))
                LIMIT 1
                """,
                (org_id, session_id, turn.ordinal, owner),
            )
            if await cur.fetchone() is not None:
                return TurnClaim("wait", turn)
            if turn.attempts >= max_attempts:
                reason = (
                    f"the turn was interrupted {turn.attempts} time(s) before it could end "
                    f"(limit {max_attempts}); it was not completed"
                )
                ended = await self._end(
                    conn, turn, TurnStatus.FAILED, reason=reason, turns=[_user(turn)]
                )
                return TurnClaim("ended", ended)
            cur = await conn.execute(
                """
                UPDATE session_turns
                SET status = 'RUNNING', attempts = attempts + 1, lease_owner = %s,
                    lease_token = lease_token + 1,
                    lease_expires_at = now() + make_interval(secs => %s)
                WHERE org_id = %s AND session_id = %s AND id = %s
                RETURNING *
                """,
                (owner, ttl_s, org_id, session_id, turn_id),
            )
            claimed = await cur.fetchone()
        assert claimed is not None
        record = _record(claimed)
        return TurnClaim("claimed", record, TurnLease(record, owner, claimed["lease_token"]))

    async def renew(self, lease: TurnLease, ttl_s: float) -> bool:
        """Extend a held lease; ``False`` if it was lost (taken over, or the turn ended)."""
        turn = lease.turn
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE session_turns SET lease_expires_at = now() + make_interval(secs => %s)
                WHERE org_id = %s AND session_id = %s AND id = %s AND status = 'RUNNING'
                  AND lease_token = %s
                """,
                (ttl_s, turn.org_id, turn.session_id, turn.id, lease.token),
            )
            return cur.rowcount == 1

    async def finish(
        self,
        conn: Conn,
        lease: TurnLease,
        *,
        turns: Sequence[Turn],
        reply: str | None,
        refused: str | None,
        events: Sequence[TurnEvent],
    ) -> None:
        """End a turn DONE with its messages, inside the caller's transaction (which also
        writes its audit rows and memory).

        Raises:
            TurnLeaseLostError: The lease is no longer this driver's; nothing is written.
        """
        turn = await self._fence(conn, lease)
        await self._end(
            conn, turn, TurnStatus.DONE, reply=reply, refused=refused, events=events, turns=turns
        )

    async def fail(self, lease: TurnLease, reason: str, events: Sequence[TurnEvent] = ()) -> None:
        """End a driven turn FAILED with ``reason`` (its user message goes into the history).

        Raises:
            TurnLeaseLostError: The lease is no longer this driver's; nothing is written.
        """
        async with self.db.transaction() as conn:
            turn = await self._fence(conn, lease)
            await self._end(
                conn, turn, TurnStatus.FAILED, reason=reason, events=events, turns=[_user(turn)]
            )

    async def release(self, lease: TurnLease) -> None:
        """Give the lease up without ending the turn (a driver shutting down): another
        driver may take it at once."""
        turn = lease.turn
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                UPDATE session_turns SET lease_owner = NULL, lease_expires_at = NULL
                WHERE org_id = %s AND session_id = %s AND id = %s AND status = 'RUNNING'
                  AND lease_token = %s
                """,
                (turn.org_id, turn.session_id, turn.id, lease.token),
            )

    async def orphans(self, grace_s: float, limit: int = 1000) -> list[TurnRef]:
        """Turns not ended whose lease is missing or expired, accepted over ``grace_s``
        ago, in sessions where no turn holds a live lease (a turn queued behind a live one
        is waiting, not orphaned): oldest first, across organisations."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT t.org_id, t.session_id, t.id FROM session_turns t
                WHERE t.status IN ('ACCEPTED', 'RUNNING')
                  AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now())
                  AND t.accepted_at <= now() - make_interval(secs => %s)
                  AND NOT EXISTS (
                      SELECT 1 FROM session_turns live
                      WHERE live.org_id = t.org_id AND live.session_id = t.session_id
                        AND live.status = 'RUNNING' AND live.lease_expires_at > now())
                ORDER BY t.accepted_at, t.ordinal
                LIMIT %s
                """,
                (grace_s, limit),
            )
            rows = await cur.fetchall()
        return [TurnRef(r["org_id"], r["session_id"], r["id"]) for r in rows]

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

    # internals ----------------------------------------------------------------------------

    @staticmethod
    async def _fence(conn: Conn, lease: TurnLease) -> TurnRecord:
        turn = lease.turn
        await _lock_session(conn, turn.org_id, turn.session_id)
        cur = await conn.execute(
            """
            SELECT * FROM session_turns
            WHERE org_id = %s AND session_id = %s AND id = %s AND status = 'RUNNING'
              AND lease_token = %s
            FOR UPDATE
            """,
            (turn.org_id, turn.session_id, turn.id, lease.token),
        )
        row = await cur.fetchone()
        if row is None:
            raise TurnLeaseLostError(f"turn {turn.id}: the lease of {lease.owner} was taken over")
        return _record(row)

    @staticmethod
    async def _end(
        conn: Conn,
        turn: TurnRecord,
        status: TurnStatus,
        *,
        reply: str | None = None,
        refused: str | None = None,
        reason: str | None = None,
        events: Sequence[TurnEvent] = (),
        turns: Sequence[Turn] = (),
    ) -> TurnRecord:
        await _append_messages(conn, turn.org_id, turn.session_id, turn.id, turns)
        cur = await conn.execute(
            """
            UPDATE session_turns
            SET status = %s, reply = %s, refused = %s, reason = %s, events = %s,
                lease_owner = NULL, lease_expires_at = NULL, finished_at = now()
            WHERE org_id = %s AND session_id = %s AND id = %s
            RETURNING *
            """,
            (
                status.value,
                reply,
                refused,
                reason,
                _events_json(events),
                turn.org_id,
                turn.session_id,
                turn.id,
            ),
        )
        row = await cur.fetchone()
        assert row is not None
        return _record(row)


def _user(turn: TurnRecord) -> Turn:
    return Turn(role="user", content=turn.message)
