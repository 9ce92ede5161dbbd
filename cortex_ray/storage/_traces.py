"""Trace spans kept locally, and the span of the attempt now driving a run."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from cortex_ray.storage._rows import StoreRows

__all__ = ["TraceRows"]


class TraceRows(StoreRows):
    """A run's attempt span id, and the spans of a trace an organisation may read."""

    async def set_trace_attempt(self, org_id: str, run_id: UUID, span_id: str) -> None:
        """Remember the span id of the attempt now driving the run (the next links to it)."""
        async with self.db.transaction(durable=False) as conn:
            await conn.execute(
                "UPDATE task_runs SET trace_attempt = %s WHERE org_id = %s AND id = %s",
                (span_id, org_id, run_id),
            )

    async def spans_of_trace(self, org_id: str, trace_id: str) -> list[dict[str, Any]]:
        """The locally kept spans of one trace that the organisation may read (its own and
        those that name no organisation), in start order."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM trace_spans
                WHERE trace_id = %s AND (org_id = %s OR org_id IS NULL)
                ORDER BY start_time, span_id
                """,
                (trace_id, org_id),
            )
            return list(await cur.fetchall())

    async def trace_spans(self, org_id: str, run_id: UUID) -> list[dict[str, Any]]:
        """Every locally kept span of the traces in which the organisation's run appears
        (its attempts: a span naming the run's organisation and id marks each trace), in
        start order: the organisation's own spans and those that name none (HTTP requests,
        model replicas), never another organisation's (a caller chooses its trace id, so
        two organisations' requests may share one)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM trace_spans
                WHERE trace_id IN (
                    SELECT trace_id FROM trace_spans WHERE org_id = %s AND run_id = %s
                ) AND (org_id = %s OR org_id IS NULL)
                ORDER BY start_time, span_id
                """,
                (org_id, run_id, org_id),
            )
            return list(await cur.fetchall())
