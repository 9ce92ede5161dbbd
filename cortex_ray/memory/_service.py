"""The memory service: CoALA's long-term memories in PostgreSQL with pgvector.

``MemoryService`` is the one way in, composed of one part per concern (see its docstring):
preparing (``_prepare``), writing with supersession (``_writes``), recall and the cycle's
snapshot (``_snapshot``), semantic facts and their extraction (``_facts``), procedural
edits (``_procedural``). This docstring describes the model they share.

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

Idempotent writes (a tool's retried step writes once) are described in
``cortex_ray.memory._writes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Literal
from uuid import UUID

from cortex_ray._exceptions import ConfigurationError
from cortex_ray._types import (
    EMBEDDING_DIM,
    MemoryKind,
    MemoryRecord,
    MemorySnapshot,
    Principal,
    ProceduralProposal,
    ProposalStatus,
    ScoredMemory,
    Turn,
)
from cortex_ray.memory._facts import SemanticFacts
from cortex_ray.memory._importance import (
    ImportanceRescorer,
    ImportanceScorer,
    ModelImportanceScorer,
)
from cortex_ray.memory._prepare import MemoryPreparer, PreparedMemory
from cortex_ray.memory._procedural import ProceduralEdits
from cortex_ray.memory._snapshot import MemoryRecall
from cortex_ray.memory._writes import MemoryWriter, set_importance
from cortex_ray.models import Embedder, ModelClient
from cortex_ray.settings import STRUCTURED_RETRIES, MemoryOptions
from cortex_ray.storage import Conn, Database

__all__ = ["MemoryService"]


class MemoryService:
    """Writes, recalls and reads long-term memory, and gates procedural edits.

    A thin façade composed of one part per concern, each taking only what it needs:
    ``preparer`` (embedding and importance, outside transactions), ``writer`` (inserts,
    supersession, idempotency keys), ``recaller`` (``recall`` and the cycle's ``snapshot``),
    ``semantic`` (facts as of a time, history, extraction) and ``procedural`` (proposed and
    decided edits). Composition rather than mixins: a part's collaborators are explicit
    constructor arguments (procedural edits write through the writer, extraction through the
    preparer and the writer), so no part reaches into another's state through a shared
    ``self``, and each can be read and tested alone. The public methods below are one-line
    delegations with today's signatures; their parts document them in full.

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
                partial(set_importance, db),
                concurrency=options.importance_rescore_concurrency,
                queue_size=options.importance_rescore_queue,
            )
        self.preparer = MemoryPreparer(embedder, importance, self.rescorer)
        self.writer = MemoryWriter(db, self.preparer, self.rescorer)
        self.recaller = MemoryRecall(db, embedder, options)
        self.semantic = SemanticFacts(
            db, self.preparer, self.writer, structured_retries=structured_retries
        )
        self.procedural = ProceduralEdits(db, self.preparer, self.writer)

    async def aclose(self) -> None:
        """Stop the background importance scoring (memories still waiting keep their
        heuristic score). The database is its owner's to close."""
        if self.rescorer is not None:
            await self.rescorer.aclose()

    async def rescored(self) -> None:
        """Wait until the background importance scoring has nothing left to do."""
        if self.rescorer is not None:
            await self.rescorer.drain()

    # episodic (and every kind's) writes: _prepare, _writes -------------------------------

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
        """Embed a memory and score its importance, outside any transaction
        (:meth:`MemoryPreparer.prepare`)."""
        return await self.preparer.prepare(
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

    async def prepare_many(self, items: Sequence[Mapping[str, Any]]) -> list[PreparedMemory]:
        """:meth:`prepare` for several memories, embedded in one batch
        (:meth:`MemoryPreparer.prepare_many`)."""
        return await self.preparer.prepare_many(items)

    async def write_prepared(
        self, conn: Conn, prepared: Sequence[PreparedMemory]
    ) -> list[MemoryRecord]:
        """Insert prepared memories inside the caller's transaction, superseding facts
        (:meth:`MemoryWriter.write_prepared`)."""
        return await self.writer.write_prepared(conn, prepared)

    async def insert_prepared(self, conn: Conn, prepared: Sequence[PreparedMemory]) -> None:
        """:meth:`write_prepared` without reading the rows back
        (:meth:`MemoryWriter.insert_prepared`)."""
        await self.writer.insert_prepared(conn, prepared)

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
        """Prepare and write one memory in its own transaction (:meth:`MemoryWriter.write`)."""
        return await self.writer.write(
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

    # retrieval: _snapshot -----------------------------------------------------------------

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
        """The ``k`` memories that best answer ``query``, by Generative Agents' score
        (:meth:`MemoryRecall.recall`)."""
        return await self.recaller.recall(
            org_id=org_id,
            agent_id=agent_id,
            query=query,
            k=k,
            kinds=kinds,
            valid_at=valid_at,
            known_at=known_at,
            exclude_run=exclude_run,
        )

    async def snapshot(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        query: str,
        k: int | None = None,
        exclude_run: UUID | None = None,
    ) -> MemorySnapshot:
        """THE long-term-memory read of a decision cycle: the latest memories, recalled once,
        in one SQL statement (:meth:`MemoryRecall.snapshot`)."""
        return await self.recaller.snapshot(
            org_id=org_id, agent_id=agent_id, query=query, k=k, exclude_run=exclude_run
        )

    # semantic memory: _facts --------------------------------------------------------------

    async def history(self, *, org_id: str, agent_id: UUID, subject: str) -> list[MemoryRecord]:
        """Every version of the facts about ``subject``, by ``valid_from``
        (:meth:`SemanticFacts.history`)."""
        return await self.semantic.history(org_id=org_id, agent_id=agent_id, subject=subject)

    async def facts(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
    ) -> list[MemoryRecord]:
        """The SEMANTIC facts believed at ``known_at`` to hold at ``valid_at``
        (:meth:`SemanticFacts.facts`)."""
        return await self.semantic.facts(
            org_id=org_id, agent_id=agent_id, valid_at=valid_at, known_at=known_at
        )

    async def extract_facts(
        self,
        *,
        org_id: str,
        agent_id: UUID,
        session_id: UUID,
        conversation: Sequence[Turn],
        model: ModelClient | None,
    ) -> list[MemoryRecord]:
        """The post-session pass: durable facts from a conversation, as SEMANTIC memories
        (:meth:`SemanticFacts.extract_facts`)."""
        return await self.semantic.extract_facts(
            org_id=org_id,
            agent_id=agent_id,
            session_id=session_id,
            conversation=conversation,
            model=model,
        )

    # procedural memory: _procedural -------------------------------------------------------

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
        """Store a PENDING edit of an agent's persona or skills, for a person to decide
        (:meth:`ProceduralEdits.propose_edit`)."""
        return await self.procedural.propose_edit(
            org_id=org_id,
            agent_id=agent_id,
            field=field,
            value=value,
            rationale=rationale,
            proposed_by=proposed_by,
            idempotency_key=idempotency_key,
            run_id=run_id,
            step_index=step_index,
            session_id=session_id,
        )

    async def decide_proposal(
        self, *, org_id: str, proposal_id: UUID, approver: Principal, approve: bool
    ) -> ProceduralProposal:
        """Approve or reject a pending procedural edit
        (:meth:`ProceduralEdits.decide_proposal`)."""
        return await self.procedural.decide_proposal(
            org_id=org_id, proposal_id=proposal_id, approver=approver, approve=approve
        )

    async def proposals(
        self, *, org_id: str, agent_id: UUID, status: ProposalStatus | None = None
    ) -> list[ProceduralProposal]:
        """An agent's procedural edit proposals, oldest first
        (:meth:`ProceduralEdits.proposals`)."""
        return await self.procedural.proposals(org_id=org_id, agent_id=agent_id, status=status)
