"""Turn leases: a driver claims a turn (RUNNING, a fencing token, an expiry it renews),
ends it fenced (DONE or FAILED, with its messages), or gives it up; turns whose driver
died are orphans any driver may take again (see ``_turns``)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from psycopg.types.json import Jsonb

from cortex_ray._exceptions import NotFoundError
from cortex_ray._types import Turn, TurnEvent
from cortex_ray.storage._database import Conn, Database
from cortex_ray.storage._turn_records import (
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

__all__ = ["TurnLeaseRows"]


def _events_json(events: Sequence[TurnEvent]) -> Jsonb:
    return Jsonb(
        [
            StoredTurnEvent(seq=i, event=e).model_dump(mode="json", exclude_none=True)
            for i, e in enumerate(events, start=1)
        ]
    )


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


class TurnLeaseRows:
    """The lease half of ``TurnStore``: claim, renew, finish, fail, release, orphans."""

    db: Database

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
            await lock_session(conn, org_id, session_id)
            cur = await conn.execute(
                "SELECT * FROM session_turns WHERE org_id = %s AND session_id = %s AND id = %s "
                "FOR UPDATE",
                (org_id, session_id, turn_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"turn {turn_id} not found in session {session_id}")
            turn = turn_of(row)
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
                    lease_token = lease_token + 1, events = '[]',
                    lease_expires_at = now() + make_interval(secs => %s)
                WHERE org_id = %s AND session_id = %s AND id = %s
                RETURNING *
                """,
                (owner, ttl_s, org_id, session_id, turn_id),
            )
            claimed = await cur.fetchone()
        assert claimed is not None
        record = turn_of(claimed)
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

    async def append_event(self, lease: TurnLease, event: TurnEvent) -> int | None:
        """Store one event of the attempt ``lease`` drives as it happens (a reconnecting
        client follows them live); its sequence number, ``None`` if the lease was lost.
        Each attempt's events start from 1 (``claim`` clears them); the turn's end writes the
        same list whole."""
        turn = lease.turn
        body = Jsonb(event.model_dump(mode="json", exclude_none=True))
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE session_turns
                SET events = events || jsonb_build_array(
                    jsonb_build_object('seq', jsonb_array_length(events) + 1, 'event', %s::jsonb))
                WHERE org_id = %s AND session_id = %s AND id = %s AND status = 'RUNNING'
                  AND lease_token = %s
                RETURNING jsonb_array_length(events) AS seq
                """,
                (body, turn.org_id, turn.session_id, turn.id, lease.token),
            )
            row = await cur.fetchone()
        return None if row is None else int(row["seq"])

    async def resumable(self, org_id: str, session_id: UUID, owner: str) -> list[UUID]:
        """The turns of a session not ended that ``owner`` may take now (no live lease, or
        a lease of its own), in ordinal order: what the successor of a driver known dead
        drives again at once (it takes its predecessor's leases back, as ``claim`` lets the
        same owner do), instead of once the leases expire."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT id FROM session_turns
                WHERE org_id = %s AND session_id = %s AND status IN ('ACCEPTED', 'RUNNING')
                  AND (lease_expires_at IS NULL OR lease_expires_at <= now()
                       OR lease_owner = %s)
                ORDER BY ordinal
                """,
                (org_id, session_id, owner),
            )
            rows = await cur.fetchall()
        return [r["id"] for r in rows]

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

    # internals ----------------------------------------------------------------------------

    @staticmethod
    async def _fence(conn: Conn, lease: TurnLease) -> TurnRecord:
        turn = lease.turn
        await lock_session(conn, turn.org_id, turn.session_id)
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
        return turn_of(row)

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
        return turn_of(row)


def _user(turn: TurnRecord) -> Turn:
    return Turn(role="user", content=turn.message)
