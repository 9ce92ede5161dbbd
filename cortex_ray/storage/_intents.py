"""Step intents (crash-resume): a side-effecting step records what it is about to do,
so that a driver resuming the run after a crash finds it."""

from __future__ import annotations

from uuid import UUID

from psycopg.types.json import Jsonb

from cortex_ray._types import AgentAction
from cortex_ray.storage._database import Conn
from cortex_ray.storage._rows import StoreRows

__all__ = ["IntentRows"]


class IntentRows(StoreRows):
    """A run's step intents: inserted before a step acts, taken or cleared after."""

    async def insert_intent(
        self,
        org_id: str,
        run_id: UUID,
        step_index: int,
        action: AgentAction,
        *,
        conn: Conn | None = None,
    ) -> None:
        """Record that a side-effecting step is about to act: in its own transaction, or
        in ``conn``'s (the driver's fenced one, so a driver that lost its lease leaves no
        intent behind)."""
        if conn is None:
            async with self.db.transaction() as own:
                await self.insert_intent(org_id, run_id, step_index, action, conn=own)
            return
        await conn.execute(
            """
            INSERT INTO step_intents (org_id, run_id, step_index, action)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (org_id, run_id, step_index) DO UPDATE SET action = EXCLUDED.action,
                started_at = now()
            """,
            (org_id, run_id, step_index, Jsonb(action.model_dump(mode="json"))),
        )

    @staticmethod
    async def take_intent(
        conn: Conn, org_id: str, run_id: UUID, step_index: int
    ) -> AgentAction | None:
        """Remove and return an intent left behind by an interrupted step, if any (inside
        the caller's transaction, so the removal commits with what records it)."""
        cur = await conn.execute(
            "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s AND step_index = %s "
            "RETURNING action",
            (org_id, run_id, step_index),
        )
        row = await cur.fetchone()
        return None if row is None else AgentAction.model_validate(row["action"])

    @staticmethod
    async def clear_intent(conn: Conn, org_id: str, run_id: UUID, step_index: int) -> None:
        await conn.execute(
            "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s AND step_index = %s",
            (org_id, run_id, step_index),
        )
