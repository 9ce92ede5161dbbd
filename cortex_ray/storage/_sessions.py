"""Sessions and their messages (the prompt history of the decision cycle)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal
from uuid import UUID

from cortex_ray._exceptions import NotFoundError
from cortex_ray._types import Session, SessionStatus, Turn
from cortex_ray.storage._database import Conn
from cortex_ray.storage._rows import StoreRows

__all__ = ["SessionRows"]


class SessionRows(StoreRows):
    """Sessions, their agent's name, and their messages in order."""

    async def create_session(self, session: Session) -> Session:
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO sessions (org_id, id, agent_id, caller_id, status, created_at)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                (
                    session.org_id,
                    session.id,
                    session.agent_id,
                    session.caller_id,
                    session.status.value,
                    session.created_at,
                ),
            )
        return session

    async def get_session(self, org_id: str, session_id: UUID) -> Session:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM sessions WHERE org_id = %s AND id = %s", (org_id, session_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"session {session_id} not found in organisation {org_id!r}")
        return Session(
            id=row["id"],
            org_id=row["org_id"],
            agent_id=row["agent_id"],
            caller_id=row["caller_id"],
            status=SessionStatus(row["status"]),
            created_at=row["created_at"],
            ended_at=row["ended_at"],
        )

    async def agent_name_of(self, org_id: str, kind: Literal["run", "session"], id: UUID) -> str:
        """The name of the agent a task run or a session belongs to, in one statement (what
        a session actor shows Ray's dashboard)."""
        table = "task_runs" if kind == "run" else "sessions"
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"SELECT a.name FROM {table} x JOIN agents a "
                "ON a.org_id = x.org_id AND a.id = x.agent_id WHERE x.org_id = %s AND x.id = %s",
                (org_id, id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"{kind} {id} not found in organisation {org_id!r}")
        name: str = row["name"]
        return name

    @staticmethod
    async def end_session(conn: Conn, org_id: str, session_id: UUID, at: datetime) -> None:
        # The first end's time stands: a second, concurrent end does not rewrite it.
        await conn.execute(
            "UPDATE sessions SET status = 'ENDED', ended_at = COALESCE(ended_at, %s) "
            "WHERE org_id = %s AND id = %s",
            (at, org_id, session_id),
        )

    async def conversation(
        self, org_id: str, session_id: UUID, limit: int | None = None
    ) -> list[Turn]:
        """The session's messages in order (the newest ``limit`` when given)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT role, content, tool FROM (
                    SELECT * FROM session_messages WHERE org_id = %s AND session_id = %s
                    ORDER BY seq DESC LIMIT %s) AS recent
                ORDER BY seq
                """,
                (org_id, session_id, limit),
            )
            return [
                Turn(role=r["role"], content=r["content"], tool=r["tool"])
                for r in await cur.fetchall()
            ]

    @staticmethod
    async def append_messages(
        conn: Conn, org_id: str, session_id: UUID, turns: Sequence[Turn]
    ) -> None:
        # Serialise writers of one session so that sequence numbers stay contiguous.
        await conn.execute(
            "SELECT 1 FROM sessions WHERE org_id = %s AND id = %s FOR UPDATE", (org_id, session_id)
        )
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
                INSERT INTO session_messages (org_id, session_id, seq, role, content, tool)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                [
                    (org_id, session_id, seq + i, t.role, t.content, t.tool)
                    for i, t in enumerate(turns)
                ],
            )
