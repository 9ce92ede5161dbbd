"""Writing prepared memories inside a transaction: supersession of facts, idempotent keys.

The bitemporal model these statements keep is described in ``cortex_ray.memory._service``:
a SEMANTIC fact with a subject closes its predecessor and, arriving out of order, is bounded
by its successor, all in one statement; subjects and idempotency keys are locked first, in
one global order. Nothing here calls a model: memories come prepared
(``cortex_ray.memory._prepare``).

Idempotent writes
-----------------
A write may carry an idempotency key (a tool passes its step's, ``ToolContext.idempotency_key``;
unique per organisation). Inside the write's transaction the key is locked (an advisory
lock, taken in the same global order as the subjects') and looked up first: when a row with
that key exists, it is returned and nothing is written, so a retried fact never supersedes
its own first write. The INSERT also says ``ON CONFLICT (org_id, idempotency_key) DO
NOTHING`` on the partial unique index, so no writer can ever store a key twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg.types.json import Jsonb

from cortex_ray._types import MemoryKind, MemoryRecord
from cortex_ray.memory._importance import ImportanceRescorer
from cortex_ray.memory._prepare import MemoryPreparer, PreparedMemory
from cortex_ray.memory._recall import COLUMNS, memory_from_row
from cortex_ray.storage import Conn, Database

__all__ = ["MemoryWriter", "set_importance"]

_INSERT_TEMPLATE = sql.SQL(
    """
    INSERT INTO memories (org_id, id, agent_id, kind, subject, content, embedding, importance,
                          valid_from, run_id, session_id, step_index, metadata, idempotency_key)
    VALUES (%(org_id)s, %(id)s, %(agent_id)s, %(kind)s, %(subject)s, %(content)s,
            %(embedding)s, %(importance)s, %(valid_from)s, %(run_id)s, %(session_id)s,
            %(step_index)s, %(metadata)s, %(idempotency_key)s)
    ON CONFLICT (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    {returning}
    """
)

# One statement per fact: close the predecessor, bound the new row by its successor (if
# it arrived out of order) and insert it. now() is the transaction's time, so the new row's
# recorded_at and the predecessor's superseded_at are the same instant R. A keyed write
# reaches this statement only after finding no row with its key under the key's lock (the
# UPDATE of a CTE runs even when the INSERT does nothing), so ON CONFLICT is the index's
# guarantee, not the path a retry takes.
_INSERT_SUPERSEDING_TEMPLATE = sql.SQL(
    """
    WITH pred AS (
        SELECT id FROM memories
        WHERE org_id = %(org_id)s AND agent_id = %(agent_id)s AND kind = 'SEMANTIC'
          AND subject = %(subject)s AND valid_from <= %(valid_from)s
          AND (valid_to IS NULL OR valid_to > %(valid_from)s)
        ORDER BY valid_from DESC, recorded_at DESC
        LIMIT 1
    ), succ AS (
        SELECT id, valid_from FROM memories
        WHERE org_id = %(org_id)s AND agent_id = %(agent_id)s AND kind = 'SEMANTIC'
          AND subject = %(subject)s AND valid_from > %(valid_from)s
        ORDER BY valid_from, recorded_at
        LIMIT 1
    ), closed AS (
        UPDATE memories
        SET valid_to = %(valid_from)s, superseded_at = now(), superseded_by = %(id)s
        WHERE org_id = %(org_id)s AND id IN (SELECT id FROM pred)
    )
    INSERT INTO memories (org_id, id, agent_id, kind, subject, content, embedding, importance,
                          valid_from, valid_to, superseded_at, superseded_by, run_id,
                          session_id, step_index, metadata, idempotency_key)
    VALUES (%(org_id)s, %(id)s, %(agent_id)s, %(kind)s, %(subject)s, %(content)s,
            %(embedding)s, %(importance)s, %(valid_from)s,
            (SELECT valid_from FROM succ), (SELECT now() FROM succ), (SELECT id FROM succ),
            %(run_id)s, %(session_id)s, %(step_index)s, %(metadata)s, %(idempotency_key)s)
    ON CONFLICT (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    {returning}
    """
)

# Each statement with its row returned (write_prepared) and without (insert_prepared),
# rendered to bytes once: psycopg would otherwise render a Composed at every execute. Plain
# ASCII SQL with simple identifiers renders the same without a connection.
_RETURNING = sql.SQL("RETURNING {cols}").format(cols=COLUMNS)
_INSERT = _INSERT_TEMPLATE.format(returning=_RETURNING).as_bytes(None)
_INSERT_QUIET = _INSERT_TEMPLATE.format(returning=sql.SQL("")).as_bytes(None)
_INSERT_SUPERSEDING = _INSERT_SUPERSEDING_TEMPLATE.format(returning=_RETURNING).as_bytes(None)
_INSERT_SUPERSEDING_QUIET = _INSERT_SUPERSEDING_TEMPLATE.format(returning=sql.SQL("")).as_bytes(
    None
)
_BY_KEY = (
    sql.SQL("SELECT {cols} FROM memories WHERE org_id = %s AND idempotency_key = %s")
    .format(cols=COLUMNS)
    .as_bytes(None)
)


async def set_importance(db: Database, org_id: str, memory_id: UUID, importance: float) -> bool:
    """Set one row's importance (the background rescoring's ``apply``); False when the row
    is not there (yet)."""
    # Only that row's importance: a rescoring never touches content or time.
    async with db.transaction() as conn:
        cur = await conn.execute(
            "UPDATE memories SET importance = %s WHERE org_id = %s AND id = %s",
            (importance, org_id, memory_id),
        )
        return cur.rowcount == 1


class MemoryWriter:
    """Inserts prepared memories, superseding facts, once per idempotency key.

    Args:
        db: The database (:meth:`write` opens its own transaction).
        preparer: Prepares what :meth:`write` writes.
        rescorer: Where a memory written with its fallback importance is queued for the
            model's rescoring, or None.
    """

    def __init__(
        self, db: Database, preparer: MemoryPreparer, rescorer: ImportanceRescorer | None
    ) -> None:
        self.db = db
        self.preparer = preparer
        self.rescorer = rescorer

    async def write_prepared(
        self, conn: Conn, prepared: Sequence[PreparedMemory]
    ) -> list[MemoryRecord]:
        """Insert prepared memories inside the caller's transaction, superseding facts.

        A memory with an idempotency key that an earlier write already stored is not
        written again: the row stored then is returned in its place.

        Raises:
            psycopg.errors.UniqueViolation: A memory of this kind was already written for
                the same run step; the caller's transaction is then aborted.
        """
        return await self._insert(conn, prepared, returning=True)

    async def insert_prepared(self, conn: Conn, prepared: Sequence[PreparedMemory]) -> None:
        """:meth:`write_prepared` without reading the rows back, for a writer that already
        holds what it wrote (the cycle's step memory): no row crosses the wire or becomes a
        record, and in a pipelined transaction the INSERT waits for nothing.

        Raises:
            psycopg.errors.UniqueViolation: As :meth:`write_prepared` (raised where the
                caller's transaction or pipeline next waits for the server).
        """
        await self._insert(conn, prepared, returning=False)

    async def _insert(
        self, conn: Conn, prepared: Sequence[PreparedMemory], *, returning: bool
    ) -> list[MemoryRecord]:
        facts = [p.record for p in prepared if _supersedes(p.record)]
        keyed = [p for p in prepared if p.idempotency_key is not None]
        # Lock every subject and key first, in one global order, so that two transactions
        # writing overlapping sets cannot deadlock.
        locks = {f"memories:{r.org_id}:{r.agent_id}:{r.subject}" for r in facts}
        locks.update(f"memories-key:{p.record.org_id}:{p.idempotency_key}" for p in keyed)
        for lock in sorted(locks):
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
        # Under the key's lock, a key written before (committed) is visible: return that row.
        earlier: dict[tuple[str, str], MemoryRecord] = {}
        for p in keyed:
            assert p.idempotency_key is not None
            found = await _by_key(conn, p.record.org_id, p.idempotency_key)
            if found is not None:
                earlier[(p.record.org_id, p.idempotency_key)] = found
        written = []
        for p in prepared:
            r = p.record
            key = p.idempotency_key
            if key is not None and (r.org_id, key) in earlier:
                if returning:
                    written.append(earlier[(r.org_id, key)])
                continue
            params = {
                "org_id": r.org_id,
                "id": r.id,
                "agent_id": r.agent_id,
                "kind": r.kind.value,
                "subject": r.subject,
                "content": r.content,
                "embedding": p.embedding,
                "importance": r.importance,
                "valid_from": r.valid_from,
                "run_id": r.run_id,
                "session_id": r.session_id,
                "step_index": r.step_index,
                "metadata": Jsonb(r.metadata),
                "idempotency_key": key,
            }
            if not returning:
                query = _INSERT_SUPERSEDING_QUIET if _supersedes(r) else _INSERT_QUIET
                await conn.execute(query, params)
            else:
                query = _INSERT_SUPERSEDING if _supersedes(r) else _INSERT
                cur = await conn.execute(query, params)
                row = await cur.fetchone()
                if row is None:  # ON CONFLICT: a writer that bypassed the key's lock won
                    assert key is not None
                    found = await _by_key(conn, r.org_id, key)
                    assert found is not None
                    written.append(found)
                    continue
                written.append(memory_from_row(row))
            if p.rescore and self.rescorer is not None:
                # Queued now, applied once the row is visible (after the caller commits).
                self.rescorer.submit(r.org_id, r.id, r.kind, r.content)
        return written

    async def write(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        kind: MemoryKind,
        content: str,
        subject: str | None = None,
        valid_from: datetime | None = None,
        importance: float | None = None,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        step_index: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> MemoryRecord:
        """Prepare and write one memory in its own transaction.

        Takes :meth:`MemoryPreparer.prepare`'s arguments. With an ``idempotency_key`` that a
        write already stored, returns that write's row and writes nothing (also when two
        such writes run at once: the key is locked in the transaction).

        Raises:
            InvalidRequestError: Empty content or importance outside 1..10.
            psycopg.errors.UniqueViolation: The run step's memory of this kind exists.
        """
        if idempotency_key is not None:
            # A retry finds its row without embedding or scoring anything.
            async with self.db.connection() as conn:
                found = await _by_key(conn, org_id, idempotency_key)
            if found is not None:
                return found
        prepared = await self.preparer.prepare(
            org_id=org_id,
            agent_id=agent_id,
            kind=kind,
            content=content,
            subject=subject,
            valid_from=valid_from,
            importance=importance,
            run_id=run_id,
            session_id=session_id,
            step_index=step_index,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        async with self.db.transaction() as conn:
            (record,) = await self.write_prepared(conn, [prepared])
        return record


async def _by_key(conn: Conn, org_id: str, key: str) -> MemoryRecord | None:
    """The memory written with idempotency key ``key``, if any."""
    cur = await conn.execute(_BY_KEY, (org_id, key))
    row = await cur.fetchone()
    return None if row is None else memory_from_row(row)


def _supersedes(record: MemoryRecord) -> bool:
    return record.kind is MemoryKind.SEMANTIC and record.subject is not None
