"""Semantic memory: the facts believed at a time, a subject's history, and the post-session
extraction that learns facts from a conversation.

Facts are written (and superseded) like every memory, by ``cortex_ray.memory._writes``; the
reads here follow the bitemporal rules of ``cortex_ray.memory._service``.

The extraction is idempotent per session: its n-th fact carries the key
``session-end:<session>:<n>`` (``extraction_keys``), and a pass that finds facts of its
session already stored returns them and writes nothing (before asking the model, and again
under a lock of the session's extraction inside the write's transaction, so that two passes
at once write one set). A retried end (after a crash between the facts' commit and the
session's end) or a second end therefore leaves one copy of each fact.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from psycopg import sql

from cortex_ray._exceptions import ModelError
from cortex_ray._types import MemoryKind, MemoryRecord, Turn, utcnow
from cortex_ray.memory._extraction import (
    FACTS_SCHEMA,
    extraction_keys,
    facts_prompt,
    normalise_subject,
    validate_facts,
)
from cortex_ray.memory._prepare import MemoryPreparer
from cortex_ray.memory._recall import COLUMNS, memory_from_row, visibility
from cortex_ray.memory._writes import MemoryWriter
from cortex_ray.models import ModelClient, structured_call
from cortex_ray.storage import Conn, Database

__all__ = ["SemanticFacts"]

log = logging.getLogger("cortex_ray.memory")


class SemanticFacts:
    """Reads SEMANTIC facts as of a time, and extracts new ones from a session.

    Args:
        db: The database.
        preparer: Prepares extracted facts (outside the transaction).
        writer: Writes them (superseding what was known about their subjects).
        structured_retries: Retries of a malformed fact extraction
            (``Settings.models.structured_retries``).
    """

    def __init__(
        self,
        db: Database,
        preparer: MemoryPreparer,
        writer: MemoryWriter,
        *,
        structured_retries: int,
    ) -> None:
        self.db = db
        self.preparer = preparer
        self.writer = writer
        self.structured_retries = structured_retries

    async def history(self, *, org_id: str, agent_id: UUID, subject: str) -> list[MemoryRecord]:
        """Every version of the facts about ``subject``, by ``valid_from``.

        Args:
            org_id: The organisation.
            agent_id: The agent.
            subject: The subject (normalised before comparing).
        """
        key = normalise_subject(subject)
        if key is None:
            return []
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT {cols} FROM memories WHERE org_id = %s AND agent_id = %s "
                    "AND kind = 'SEMANTIC' AND subject = %s ORDER BY valid_from, recorded_at"
                ).format(cols=COLUMNS),
                (org_id, agent_id, key),
            )
            return [memory_from_row(row) for row in await cur.fetchall()]

    async def facts(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
    ) -> list[MemoryRecord]:
        """The SEMANTIC facts believed at ``known_at`` to hold at ``valid_at``.

        With neither time, the latest facts. One fact per subject (the one with the
        greatest ``valid_from``); facts without a subject are all returned.

        Args:
            org_id: The organisation.
            agent_id: The agent.
            valid_at: Valid time (default: now).
            known_at: Record time (default: now).

        Returns:
            Facts ordered by subject (subject-less last), then ``valid_from``.
        """
        visible, params = visibility(valid_at, known_at)
        statement = sql.SQL(
            """
            SELECT * FROM (
                SELECT DISTINCT ON (coalesce(subject, id::text)) {cols}
                FROM memories
                WHERE org_id = %(org_id)s AND agent_id = %(agent_id)s AND kind = 'SEMANTIC'
                  AND {visible}
                ORDER BY coalesce(subject, id::text), valid_from DESC, recorded_at DESC
            ) AS latest
            ORDER BY subject NULLS LAST, valid_from, recorded_at
            """
        ).format(cols=COLUMNS, visible=visible)
        params |= {"org_id": org_id, "agent_id": agent_id}
        async with self.db.transaction() as conn:
            cur = await conn.execute(statement, params)
            return [memory_from_row(row) for row in await cur.fetchall()]

    async def extract_facts(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        session_id: UUID,
        conversation: Sequence[Turn],
        model: ModelClient | None,
    ) -> list[MemoryRecord]:
        """The post-session pass: durable facts from a conversation, as SEMANTIC memories.

        One structured call asks for up to 8 ``{subject, fact}`` pairs; each becomes a fact
        with a normalised subject, so it supersedes what was known about that subject.

        Idempotent per session (see the module docstring): when facts of ``session_id``'s
        extraction are stored already, they are returned, the model is not asked, and
        nothing is written.

        Args:
            org_id: The organisation.
            agent_id: The agent that held the conversation.
            session_id: The session, recorded on each fact.
            conversation: The session's turns.
            model: The model to ask. With None nothing is extracted and ``[]`` returned:
                without a model there is no way to tell facts from chatter.

        Returns:
            The facts written (or found). ``[]`` also when the model fails or its output is
            still malformed after ``structured_retries`` retries (logged, not raised):
            a lost extraction must not fail the end of a session.
        """
        if model is None or not conversation:
            return []
        keys = extraction_keys(session_id)
        async with self.db.connection() as conn:
            earlier = await _extracted(conn, org_id, keys)
        if earlier:
            log.info("facts of session %s were extracted already: none written", session_id)
            return earlier
        try:
            pairs = await structured_call(
                model,
                facts_prompt(conversation),
                schema=FACTS_SCHEMA,
                validate=validate_facts,
                schema_name="facts",
                retries=self.structured_retries,
                temperature=0.0,
            )
        except ModelError as exc:  # StructuredOutputError included
            log.warning("fact extraction for session %s skipped: %s", session_id, exc)
            return []
        if not pairs:
            return []
        now = utcnow()
        prepared = await self.preparer.prepare_many(
            [
                {
                    "org_id": org_id,
                    "agent_id": agent_id,
                    "kind": MemoryKind.SEMANTIC,
                    "content": fact,
                    "subject": subject,
                    "valid_from": now,
                    "session_id": session_id,
                    "metadata": {"source": "extraction"},
                    "idempotency_key": key,
                }
                for (subject, fact), key in zip(pairs, keys, strict=False)
            ]
        )
        async with self.db.transaction() as conn:
            # One pass of a session writes at a time; a later one finds the facts under
            # the lock (taken before the writer's subject and key locks, and only here, so
            # it cannot deadlock with them).
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"memories-extraction:{org_id}:{session_id}",),
            )
            earlier = await _extracted(conn, org_id, keys)
            if earlier:
                log.info("facts of session %s were extracted meanwhile: none written", session_id)
                return earlier
            return await self.writer.write_prepared(conn, prepared)


async def _extracted(conn: Conn, org_id: str, keys: Sequence[str]) -> list[MemoryRecord]:
    """The facts stored under ``keys`` (a session's extraction keys), in the pass's order."""
    cur = await conn.execute(
        sql.SQL(
            "SELECT {cols}, idempotency_key FROM memories "
            "WHERE org_id = %s AND idempotency_key = ANY(%s)"
        ).format(cols=COLUMNS),
        (org_id, list(keys)),
    )
    order = {key: n for n, key in enumerate(keys)}
    rows = sorted(await cur.fetchall(), key=lambda row: order[row["idempotency_key"]])
    return [memory_from_row(row) for row in rows]
