"""Diagnostics: the timeline events of runs and session turns (telemetry, pruned by age)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from psycopg.types.json import Jsonb

from cortex_ray.observability.diagnostics import DiagnosticEvent
from cortex_ray.storage._rows import StoreRows

__all__ = ["DiagnosticRows"]


class DiagnosticRows(StoreRows):
    """Timeline events appended in one COPY, and read back in write order."""

    async def append_diagnostics(
        self,
        org_id: str,
        events: Sequence[DiagnosticEvent],
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
        retention_days: float | None = None,
    ) -> None:
        """Append timeline events (already scrubbed and bounded; committed as telemetry, see
        ``Database.transaction``); with ``retention_days``, delete rows older than that
        about once an hour."""
        rows = [
            (org_id, run_id, session_id, turn_id, e.seq, e.at, e.kind, e.step, Jsonb(e.data))
            for e in events
        ]
        async with self.db.transaction(durable=False) as conn, conn.cursor() as cur:
            async with cur.copy(  # one COPY, not one INSERT an event: ~3 events a step
                "COPY diagnostics (org_id, run_id, session_id, turn_id, seq, at, kind, step,"
                " data) FROM STDIN"
            ) as copy:
                for row in rows:
                    await copy.write_row(row)
            now = datetime.now(UTC)
            if retention_days is not None and (
                self._diagnostics_pruned is None
                or now - self._diagnostics_pruned > timedelta(hours=1)
            ):
                await cur.execute(
                    "DELETE FROM diagnostics WHERE at < %s",
                    (now - timedelta(days=retention_days),),
                )
                self._diagnostics_pruned = now

    async def diagnostics(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
    ) -> list[DiagnosticEvent]:
        """A run's timeline (every attempt), or a session's (one turn's with ``turn_id``),
        in the order the events were written."""
        args: tuple[UUID | None, ...]
        if run_id is not None:
            where, args = "run_id = %s", (run_id,)
        elif turn_id is not None:
            where, args = "session_id = %s AND turn_id = %s", (session_id, turn_id)
        else:
            where, args = "session_id = %s", (session_id,)
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"SELECT seq, at, kind, step, data FROM diagnostics "
                f"WHERE org_id = %s AND {where} ORDER BY id",
                (org_id, *args),
            )
            return [DiagnosticEvent.model_validate(r) for r in await cur.fetchall()]
