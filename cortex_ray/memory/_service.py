"""The memory service: CoALA's long-term memories in PostgreSQL with pgvector.

Three kinds of memory share one table. EPISODIC rows record what happened (steps, turns,
run results), SEMANTIC rows are facts about the world and people, PROCEDURAL rows record
changes to the agent's persona and skills (which the agent cannot make itself: it proposes
them, and a person approves).

Bitemporal facts
----------------
Every row has two time axes:

- valid time, ``[valid_from, valid_to)``: when the fact is true in the world
  (``valid_to`` NULL: still true);
- record time: ``recorded_at``, when the row was written (the database's transaction
  time), and ``superseded_at``, the record time at which ``valid_to`` was set, with
  ``superseded_by`` naming the row that bounded it.

Writing a SEMANTIC fact F with subject S valid from V at record time R (serialised per
(organisation, agent, subject) by a transaction-scoped advisory lock):

- the predecessor P is the row of S with the greatest ``valid_from <= V`` whose interval
  is open or contains V; it is closed: ``P.valid_to = V``, ``P.superseded_at = R``,
  ``P.superseded_by = F.id``;
- if a row of S is valid from a later time (F arrived out of order), F arrives already
  bounded: ``F.valid_to`` = that successor's ``valid_from``, ``F.superseded_at = R``,
  ``F.superseded_by`` = the successor's id.

So the rows of one subject always tile time from the first ``valid_from`` on, and
exactly one of them is open-ended. Subjects are normalised (lower-case, trimmed, single
spaces) before they are compared. EPISODIC and PROCEDURAL rows are never superseded.

Reads:

- latest (the default): ``valid_to IS NULL``;
- as of valid time T and record time K (either may be given; the other defaults to now):
  ``recorded_at <= K AND valid_from <= T AND (valid_to IS NULL OR superseded_at > K OR
  valid_to > T)``, i.e. "what did we believe at K to be true at T".

Known limit: a row keeps one ``valid_to``/``superseded_at`` pair, so when an out-of-order
fact later shortens an interval that an earlier supersession had already closed, the
earlier closing is overwritten; an as-of read with K between those two record times can
then see the shortened row next to its successor. :meth:`MemoryService.facts` keeps one
fact per subject (the greatest ``valid_from``), which gives the right answer there.

Model latency never holds a transaction open: :meth:`MemoryService.prepare` embeds and
scores importance first, and :meth:`MemoryService.write_prepared` only inserts, inside the
caller's transaction (the cycle writes its ledger row and memory rows atomically). With
``importance_mode="background"`` (the default) no write waits on the model at all: the
memory is written with the heuristic score and rescored by the model after the write
(``ImportanceRescorer``).

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

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID, uuid4

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg import sql
from psycopg.types.json import Jsonb

from cortex_ray._exceptions import (
    AccessDeniedError,
    ConfigurationError,
    InvalidRequestError,
    ModelError,
    NotFoundError,
)
from cortex_ray._types import (
    EMBEDDING_DIM,
    MemoryKind,
    MemoryRecord,
    MemorySnapshot,
    Principal,
    PrincipalKind,
    ProceduralProposal,
    ProposalStatus,
    ScoredMemory,
    Turn,
    utcnow,
)
from cortex_ray.memory._extraction import (
    FACTS_SCHEMA,
    facts_prompt,
    normalise_subject,
    validate_facts,
)
from cortex_ray.memory._importance import (
    MAX_IMPORTANCE,
    MIN_IMPORTANCE,
    HeuristicImportanceScorer,
    ImportanceRescorer,
    ImportanceScorer,
    ModelImportanceScorer,
)
from cortex_ray.memory._recall import (
    COLUMNS,
    memory_from_row,
    recall_statement,
    scored_from_row,
    visibility,
)
from cortex_ray.models import Embedder, ModelClient, embed, structured_call
from cortex_ray.settings import STRUCTURED_RETRIES, MemoryOptions
from cortex_ray.storage import Conn, Database

__all__ = ["MemoryService", "PreparedMemory", "importance_scorer_for"]

log = logging.getLogger("cortex_ray.memory")

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


def importance_scorer_for(
    options: MemoryOptions,
    model: ModelClient | None,
    *,
    structured_retries: int = STRUCTURED_RETRIES,
) -> ImportanceScorer:
    """The scorer the memory options ask for: the model's, with the heuristic as its fallback
    (``structured_retries``: ``Settings.models.structured_retries``).

    Returns the heuristic alone when no model is configured or
    ``importance_scoring == "heuristic"``. The model's scorer waits at most
    ``importance_timeout_s`` and, with ``importance_mode == "background"``, is deferred:
    memories are written with the heuristic score and rescored after the write.
    """
    heuristic = HeuristicImportanceScorer()
    if model is None or options.importance_scoring == "heuristic":
        return heuristic
    return ModelImportanceScorer(
        model,
        structured_retries,
        heuristic,
        timeout_s=options.importance_timeout_s,
        deferred=options.importance_mode == "background",
    )


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays do not compare to one bool
class PreparedMemory:
    """A memory ready to insert: its record plus its embedding (float32, unit length).

    ``record.recorded_at`` is a placeholder until the row is written: the database stamps
    the real record time.
    """

    record: MemoryRecord
    embedding: NDArray[np.float32]
    idempotency_key: str | None = None
    """Written with the row; a row with this key already there is returned instead."""
    rescore: bool = False
    """Written with the fallback importance: the model rescores it after the write."""


def _proposal(row: dict[str, Any]) -> ProceduralProposal:
    value = row["value"]
    return ProceduralProposal(
        id=row["id"],
        org_id=row["org_id"],
        agent_id=row["agent_id"],
        field=row["field"],
        value=tuple(value) if isinstance(value, list) else value,
        rationale=row["rationale"],
        status=ProposalStatus(row["status"]),
        proposed_by=row["proposed_by"],
        decided_by=row["decided_by"],
        proposed_at=row["proposed_at"],
        decided_at=row["decided_at"],
    )


def _agent_principal_id(agent_id: UUID) -> str:
    # The id Agent.principal() gives an agent's own principal.
    return f"agent:{agent_id}"


class MemoryService:
    """Writes, recalls and reads long-term memory, and gates procedural edits.

    Args:
        db: The database (its pool registers pgvector and sets iterative HNSW scans).
        embedder: Embeds memories and queries; must produce 384-dimensional vectors.
        options: ``Settings.memory``: recall weights, ``recall_k``, ``recall_candidates``,
            recency decay, the background rescoring's bounds.
        importance: Scores a memory's importance when the writer gives none. A deferred
            ``ModelImportanceScorer`` (``importance_mode="background"``) is not waited for:
            the memory is written with its fallback's score and rescored in the background
            (``importance_rescore_concurrency`` at once, ``importance_rescore_queue`` waiting);
            :meth:`aclose` stops that.
        structured_retries: Retries of a malformed fact extraction
            (``Settings.models.structured_retries``).

    Raises:
        ConfigurationError: The embedder's dimension does not match the schema.
    """

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        options: MemoryOptions,
        importance: ImportanceScorer,
        *,
        structured_retries: int = STRUCTURED_RETRIES,
    ) -> None:
        if embedder.dim != EMBEDDING_DIM:
            raise ConfigurationError(
                f"the embedder makes {embedder.dim}-dimensional vectors but memories are "
                f"stored as vector({EMBEDDING_DIM}): use a {EMBEDDING_DIM}-dimensional model"
            )
        self.db = db
        self.embedder = embedder
        self.options = options
        self.structured_retries = structured_retries
        self.importance = importance
        self.rescorer: ImportanceRescorer | None = None
        if isinstance(importance, ModelImportanceScorer) and importance.deferred:
            self.rescorer = ImportanceRescorer(
                importance,
                self._set_importance,
                concurrency=options.importance_rescore_concurrency,
                queue_size=options.importance_rescore_queue,
            )

    async def aclose(self) -> None:
        """Stop the background importance scoring (memories still waiting keep their
        heuristic score). The database is its owner's to close."""
        if self.rescorer is not None:
            await self.rescorer.aclose()

    async def rescored(self) -> None:
        """Wait until the background importance scoring has nothing left to do."""
        if self.rescorer is not None:
            await self.rescorer.drain()

    async def _set_importance(self, org_id: str, memory_id: UUID, importance: float) -> bool:
        # Only that row's importance: a rescoring never touches content or time.
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "UPDATE memories SET importance = %s WHERE org_id = %s AND id = %s",
                (importance, org_id, memory_id),
            )
            return cur.rowcount == 1

    # writing ------------------------------------------------------------------------------

    async def _record(
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
    ) -> tuple[MemoryRecord, bool]:
        """The record to write, and whether the model rescores it after the write."""
        if not content.strip():
            raise InvalidRequestError("a memory needs content")
        rescore = False
        if importance is None:
            scorer = self.importance
            if self.rescorer is not None and isinstance(scorer, ModelImportanceScorer):
                # Never wait on the model here: the fallback now, the model after the write.
                scorer, rescore = scorer.fallback, True
            scored = await scorer.score(kind, content)
            # A third-party scorer may stray outside the scale the table enforces.
            importance = min(MAX_IMPORTANCE, max(MIN_IMPORTANCE, float(scored)))
        elif not MIN_IMPORTANCE <= importance <= MAX_IMPORTANCE:
            raise InvalidRequestError(f"importance must be between 1 and 10, got {importance}")
        record = MemoryRecord(
            org_id=org_id,
            agent_id=agent_id,
            kind=kind,
            content=content,
            subject=normalise_subject(subject),
            importance=importance,
            valid_from=valid_from or utcnow(),
            run_id=run_id,
            session_id=session_id,
            step_index=step_index,
            metadata=dict(metadata or {}),
        )
        return record, rescore

    async def prepare(
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
    ) -> PreparedMemory:
        """Embed a memory and score its importance, outside any transaction.

        Args:
            org_id: The organisation.
            agent_id: The agent whose memory it is.
            kind: EPISODIC, SEMANTIC or PROCEDURAL.
            content: The text recalled later.
            subject: For SEMANTIC facts, what the fact is about: a newer fact with the same
                (normalised) subject supersedes the older one.
            valid_from: When it became true or happened (default: now).
            importance: 1..10; scored by the service's ``ImportanceScorer`` when None.
            run_id: The autonomous run that produced it.
            session_id: The interactive session that produced it.
            step_index: The run step that produced it (with ``run_id``: written once).
            metadata: Free-form JSON-serialisable details.
            idempotency_key: The writer's key (a tool's ``ToolContext.idempotency_key``):
                a row with this key already written is returned instead of a new one.

        Raises:
            InvalidRequestError: Empty content or importance outside 1..10.
        """
        (prepared,) = await self.prepare_many(
            [
                {
                    "org_id": org_id,
                    "agent_id": agent_id,
                    "kind": kind,
                    "content": content,
                    "subject": subject,
                    "valid_from": valid_from,
                    "importance": importance,
                    "run_id": run_id,
                    "session_id": session_id,
                    "step_index": step_index,
                    "metadata": metadata,
                    "idempotency_key": idempotency_key,
                }
            ]
        )
        return prepared

    async def prepare_many(self, items: Sequence[Mapping[str, Any]]) -> list[PreparedMemory]:
        """:meth:`prepare` for several memories, embedded in one batch.

        Args:
            items: Each a mapping of :meth:`prepare`'s keyword arguments.
        """
        # Importance first and one at a time: model calls are sequential anyway, and the
        # order stays deterministic for scripted models.
        records = []
        for item in items:
            fields = dict(item)
            key = fields.pop("idempotency_key", None)
            record, rescore = await self._record(**fields)
            records.append((record, key, rescore))
        if not records:
            return []
        vectors = await embed(self.embedder, [r.content for r, _, _ in records])
        out = []
        for (record, key, rescore), vector in zip(records, vectors, strict=True):
            embedding = np.array(vector, dtype=np.float32)
            embedding.setflags(write=False)
            out.append(
                PreparedMemory(
                    record=record, embedding=embedding, idempotency_key=key, rescore=rescore
                )
            )
        return out

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
        facts = [p.record for p in prepared if self._supersedes(p.record)]
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
            found = await self._by_key(conn, p.record.org_id, p.idempotency_key)
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
                query = _INSERT_SUPERSEDING_QUIET if self._supersedes(r) else _INSERT_QUIET
                await conn.execute(query, params)
            else:
                query = _INSERT_SUPERSEDING if self._supersedes(r) else _INSERT
                cur = await conn.execute(query, params)
                row = await cur.fetchone()
                if row is None:  # ON CONFLICT: a writer that bypassed the key's lock won
                    assert key is not None
                    found = await self._by_key(conn, r.org_id, key)
                    assert found is not None
                    written.append(found)
                    continue
                written.append(memory_from_row(row))
            if p.rescore and self.rescorer is not None:
                # Queued now, applied once the row is visible (after the caller commits).
                self.rescorer.submit(r.org_id, r.id, r.kind, r.content)
        return written

    @staticmethod
    async def _by_key(conn: Conn, org_id: str, key: str) -> MemoryRecord | None:
        cur = await conn.execute(_BY_KEY, (org_id, key))
        row = await cur.fetchone()
        return None if row is None else memory_from_row(row)

    @staticmethod
    def _supersedes(record: MemoryRecord) -> bool:
        return record.kind is MemoryKind.SEMANTIC and record.subject is not None

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

        Takes :meth:`prepare`'s arguments. With an ``idempotency_key`` that a write already
        stored, returns that write's row and writes nothing (also when two such writes run
        at once: the key is locked in the transaction).

        Raises:
            InvalidRequestError: Empty content or importance outside 1..10.
            psycopg.errors.UniqueViolation: The run step's memory of this kind exists.
        """
        if idempotency_key is not None:
            # A retry finds its row without embedding or scoring anything.
            async with self.db.connection() as conn:
                found = await self._by_key(conn, org_id, idempotency_key)
            if found is not None:
                return found
        prepared = await self.prepare(
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

    # reading ------------------------------------------------------------------------------

    async def recall(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        query: str,
        k: int | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        exclude_run: UUID | None = None,
    ) -> list[ScoredMemory]:
        """The ``k`` memories that best answer ``query``, by Generative Agents' score.

        Reads the latest memories, or those as of ``valid_at``/``known_at`` when either is
        given (see the module docstring). One SQL statement.

        Args:
            org_id: The organisation.
            agent_id: The agent whose memories are searched.
            query: The text to recall for.
            k: How many to return (default ``options.recall_k``).
            kinds: Only these kinds (default: all).
            valid_at: Valid time of an as-of read.
            known_at: Record time of an as-of read.
            exclude_run: Leave out the memories this run wrote (its own steps).

        Returns:
            Scored memories, best first; ties go to the most recently recorded.
        """
        k = self.options.recall_k if k is None else k
        if k <= 0:
            return []
        embedding = (await embed(self.embedder, [query]))[0]
        visible, params = visibility(valid_at, known_at)
        statement = recall_statement(
            with_kinds=kinds is not None, visible=visible, without_run=exclude_run is not None
        )
        decay = self.options.recency_decay_per_hour
        params |= {
            "org_id": org_id,
            "agent_id": agent_id,
            "query": np.asarray(embedding, dtype=np.float32),
            "n": max(self.options.recall_candidates, k),
            "k": k,
            # Python's clock, not the database's: recency works in hours, where a little
            # skew between the two does not change the order.
            "now": utcnow(),
            "decay": decay,
            "recency_floor": 1.0 - decay,
            "alpha": self.options.recall_alpha,
            "beta": self.options.recall_beta,
            "gamma": self.options.recall_gamma,
        }
        if kinds is not None:
            params["kinds"] = [MemoryKind(kind).value for kind in kinds]
        if exclude_run is not None:
            params["exclude_run"] = exclude_run
        async with self.db.connection() as conn:  # one statement: one round trip
            cur = await conn.execute(statement, params)
            return [scored_from_row(row) for row in await cur.fetchall()]

    async def snapshot(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        query: str,
        k: int | None = None,
        exclude_run: UUID | None = None,
    ) -> MemorySnapshot:
        """THE long-term-memory read of a decision cycle: the latest memories, recalled once.

        Exactly one SQL statement (nearest and most recent candidates together), scored
        in Python.

        Args:
            org_id: The organisation.
            agent_id: The agent.
            query: What the cycle is about (the objective or the person's message).
            k: How many memories (default ``options.recall_k``).
            exclude_run: The run this cycle belongs to: its own steps are already in
                working memory as observations, so its memories are not recalled.
        """
        taken_at = utcnow()
        recalled = await self.recall(
            org_id=org_id, agent_id=agent_id, query=query, k=k, exclude_run=exclude_run
        )
        return MemorySnapshot(query=query, recalled=tuple(recalled), taken_at=taken_at)

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

    # learning from a session --------------------------------------------------------------

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

        Args:
            org_id: The organisation.
            agent_id: The agent that held the conversation.
            session_id: The session, recorded on each fact.
            conversation: The session's turns.
            model: The model to ask. With None nothing is extracted and ``[]`` returned:
                without a model there is no way to tell facts from chatter.

        Returns:
            The facts written. ``[]`` also when the model fails or its output is still
            malformed after ``structured_retries`` retries (logged, not raised):
            a lost extraction must not fail the end of a session.
        """
        if model is None or not conversation:
            return []
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
        prepared = await self.prepare_many(
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
                }
                for subject, fact in pairs
            ]
        )
        async with self.db.transaction() as conn:
            return await self.write_prepared(conn, prepared)

    # procedural memory --------------------------------------------------------------------

    async def propose_edit(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        field: Literal["persona", "skills"],
        value: str | Sequence[str],
        rationale: str,
        proposed_by: Principal,
        idempotency_key: str | None = None,
        run_id: UUID | None = None,
        step_index: int | None = None,
        session_id: UUID | None = None,
    ) -> ProceduralProposal:
        """Store a PENDING edit of an agent's persona or skills, for a person to decide.

        This is the only way procedural memory changes from inside the agent: nothing
        takes effect until :meth:`decide_proposal` approves it. With an
        ``idempotency_key`` already stored, the proposal stored then is returned (as it
        is now) and nothing is written, also when two such calls run at once.

        Args:
            org_id: The organisation.
            agent_id: The agent to change.
            field: ``"persona"`` (a string) or ``"skills"`` (a list of strings).
            value: The new persona, or the new full list of skills.
            rationale: Why, in the proposer's words.
            proposed_by: Who proposes (the agent's own principal, typically).
            idempotency_key: The proposing tool's key (``ToolContext.idempotency_key``).
            run_id: The run that proposes it.
            step_index: The run step that proposes it.
            session_id: The session that proposes it.

        Raises:
            AccessDeniedError: The proposer belongs to another organisation.
            InvalidRequestError: The value does not fit the field.
            NotFoundError: No such agent in the organisation.
        """
        if proposed_by.org_id != org_id:
            raise AccessDeniedError("a principal may only propose edits in its own organisation")
        stored: str | list[str]
        if field == "persona":
            if not isinstance(value, str):
                raise InvalidRequestError("a persona edit takes a string")
            stored = value
        elif field == "skills":
            if isinstance(value, str) or not all(isinstance(s, str) for s in value):
                raise InvalidRequestError("a skills edit takes a list of strings")
            stored = [s.strip() for s in value if s.strip()]
        else:
            raise InvalidRequestError(f"procedural edits change persona or skills, not {field!r}")
        try:
            async with self.db.transaction() as conn:
                # A concurrent twin waits here for the first to commit, then does nothing;
                # either way the key's row is read back.
                cur = await conn.execute(
                    """
                    INSERT INTO procedural_proposals (org_id, id, agent_id, field, value,
                                                      rationale, status, proposed_by,
                                                      idempotency_key, run_id, step_index,
                                                      session_id)
                    VALUES (%s, %s, %s, %s, %s, %s, 'PENDING', %s, %s, %s, %s, %s)
                    ON CONFLICT (org_id, idempotency_key) WHERE idempotency_key IS NOT NULL
                    DO NOTHING
                    RETURNING *
                    """,
                    (
                        org_id,
                        uuid4(),
                        agent_id,
                        field,
                        Jsonb(stored),
                        rationale,
                        proposed_by.id,
                        idempotency_key,
                        run_id,
                        step_index,
                        session_id,
                    ),
                )
                row = await cur.fetchone()
                if row is None:
                    cur = await conn.execute(
                        "SELECT * FROM procedural_proposals "
                        "WHERE org_id = %s AND idempotency_key = %s",
                        (org_id, idempotency_key),
                    )
                    row = await cur.fetchone()
        except psycopg.errors.ForeignKeyViolation as exc:
            raise NotFoundError(f"agent {agent_id} not found in organisation {org_id!r}") from exc
        assert row is not None
        return _proposal(row)

    async def _get_proposal(
        self, conn: Conn, org_id: str, proposal_id: UUID, *, lock: bool
    ) -> ProceduralProposal:
        query = "SELECT * FROM procedural_proposals WHERE org_id = %s AND id = %s"
        cur = await conn.execute(query + (" FOR UPDATE" if lock else ""), (org_id, proposal_id))
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"proposal {proposal_id} not found in organisation {org_id!r}")
        return _proposal(row)

    async def decide_proposal(
        self, *, org_id: str, proposal_id: UUID, approver: Principal, approve: bool
    ) -> ProceduralProposal:
        """Approve or reject a pending procedural edit.

        Approval, in one transaction, changes the agent's persona or skills, writes a
        PROCEDURAL memory recording the change, and marks the proposal APPROVED.

        Args:
            org_id: The organisation.
            proposal_id: The proposal.
            approver: A person (a USER principal of the organisation, not the agent).
            approve: True to approve, False to reject.

        Raises:
            AccessDeniedError: The approver is not a person of this organisation, or is the
                agent itself.
            NotFoundError: No such proposal in the organisation.
            InvalidRequestError: The proposal was already decided.
        """
        if approver.kind is not PrincipalKind.USER or approver.org_id != org_id:
            raise AccessDeniedError(
                "only a person of the organisation may decide a procedural edit"
            )
        async with self.db.transaction() as conn:
            proposal = await self._get_proposal(conn, org_id, proposal_id, lock=False)
        self._check_decidable(proposal, approver)
        prepared: PreparedMemory | None = None
        if approve:
            # Embedding and importance before the transaction, like every write.
            prepared = await self.prepare(
                org_id=org_id,
                agent_id=proposal.agent_id,
                kind=MemoryKind.PROCEDURAL,
                content=_change_text(proposal),
                subject=proposal.field,
                metadata={"proposal_id": str(proposal.id), "approved_by": approver.id},
            )
        status = ProposalStatus.APPROVED if approve else ProposalStatus.REJECTED
        async with self.db.transaction() as conn:
            # Re-read under a row lock: a concurrent decision may have won meanwhile.
            proposal = await self._get_proposal(conn, org_id, proposal_id, lock=True)
            self._check_decidable(proposal, approver)
            if prepared is not None:
                column = sql.Identifier(proposal.field)
                value = (
                    list(proposal.value) if isinstance(proposal.value, tuple) else proposal.value
                )
                await conn.execute(
                    sql.SQL(
                        "UPDATE agents SET {column} = %s, updated_at = now() "
                        "WHERE org_id = %s AND id = %s"
                    ).format(column=column),
                    (value, org_id, proposal.agent_id),
                )
                await self.write_prepared(conn, [prepared])
            cur = await conn.execute(
                """
                UPDATE procedural_proposals
                SET status = %s, decided_by = %s, decided_at = now()
                WHERE org_id = %s AND id = %s
                RETURNING *
                """,
                (status.value, approver.id, org_id, proposal_id),
            )
            row = await cur.fetchone()
        assert row is not None
        return _proposal(row)

    @staticmethod
    def _check_decidable(proposal: ProceduralProposal, approver: Principal) -> None:
        if approver.id == _agent_principal_id(proposal.agent_id):
            raise AccessDeniedError("an agent may not decide edits of its own procedural memory")
        if proposal.status is not ProposalStatus.PENDING:
            raise InvalidRequestError(
                f"proposal {proposal.id} is already {proposal.status.value.lower()}"
            )

    async def proposals(
        self, *, org_id: str, agent_id: UUID, status: ProposalStatus | None = None
    ) -> list[ProceduralProposal]:
        """An agent's procedural edit proposals, oldest first (only ``status`` when given)."""
        wanted = None if status is None else status.value
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM procedural_proposals
                WHERE org_id = %s AND agent_id = %s AND (%s::text IS NULL OR status = %s)
                ORDER BY proposed_at, id
                """,
                (org_id, agent_id, wanted, wanted),
            )
            return [_proposal(row) for row in await cur.fetchall()]


def _change_text(proposal: ProceduralProposal) -> str:
    if isinstance(proposal.value, tuple):
        return f"skills changed to: {', '.join(proposal.value) or '(none)'}"
    return f"{proposal.field} changed to: {proposal.value}"
