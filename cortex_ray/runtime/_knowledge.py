"""Knowledge as use cases: hybrid search over published knowledge (every hit cited, hits of
unhealthy sources flagged), freshness policies and source health (docs/graph.md, "Source
health")."""

from __future__ import annotations

from collections.abc import Sequence

import cortex_ray.graph as _graph
from cortex_ray._exceptions import InvalidRequestError, UnavailableError
from cortex_ray._types import Principal
from cortex_ray.access import UseCase
from cortex_ray.knowledge import Fusion, KnowledgeService, SearchResult
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.storage import Database

__all__ = ["KnowledgeUseCases"]


class KnowledgeUseCases:
    """Knowledge search and source health (``Runtime.search_knowledge``, ...)."""

    def __init__(self, gate: UseCaseGate, db: Database, knowledge: KnowledgeService | None) -> None:
        self.gate = gate
        self.db = db
        self.knowledge = knowledge

    async def search_knowledge(
        self,
        org_id: str,
        query: str,
        *,
        collection: Sequence[str] | None = None,
        k: int = 10,
        fusion: Fusion | None = None,
        rerank: bool = True,
        principal: Principal | None = None,
    ) -> SearchResult:
        """Hybrid search over the organisation's published knowledge, every hit cited.
        Admins, or callers granted ``knowledge_search``.

        Raises:
            UnavailableError: This runtime was built without a knowledge store.
        """
        args = {"query": query[:200], "k": k, "collection": list(collection or ())}
        caller = await self.gate.authorize(principal, UseCase.KNOWLEDGE_SEARCH, org_id, args=args)
        if self.knowledge is None:
            raise UnavailableError("this runtime was built without a knowledge store")
        for name in collection or ():
            if not name or "\x00" in name or len(name) > 128:
                raise InvalidRequestError("collection: 1 to 128 characters, no NUL")
        # A collection with readers listed is searched only by them (and admins).
        scope = await _graph.readable_scope(
            self.knowledge, org_id, caller.id, collection or None, is_admin=caller.is_admin
        )
        result = await self.knowledge.search(
            org_id, query, collection=scope, k=k, fusion=fusion, rerank=rerank
        )
        result = await self._with_source_warnings(org_id, result)
        await self.gate.audited(caller, UseCase.KNOWLEDGE_SEARCH, org_id, args=args)
        return result

    async def _with_source_warnings(self, org_id: str, result: SearchResult) -> SearchResult:
        """Hits from unhealthy sources say so (their collection's latest health report)."""
        async with self.db.connection() as conn:
            sources = [h.source_id for h in result.hits]
            warnings = await _graph.source_warnings(conn, org_id, sources)
        if not warnings:
            return result
        hits = [h.model_copy(update={"warning": warnings.get(h.source_id)}) for h in result.hits]
        return result.model_copy(update={"hits": hits})

    async def set_freshness_policy(
        self,
        org_id: str,
        collection: str,
        expected_interval_s: float,
        *,
        expires_after_s: float | None = None,
        path: str | None = None,
        principal: Principal | None = None,
    ) -> None:
        """How often a collection's sources (or one source, ``path``) are expected to be
        updated; a source not read within it is STALE, within ``expires_after_s`` (default
        four intervals) EXPIRED. Admins."""
        args = {"collection": collection, "expected_interval_s": expected_interval_s}
        caller = await self.gate.authorize(principal, UseCase.SOURCES_POLICY, org_id, args=args)
        await _graph.SourceHealthMonitor(self.db).set_policy(
            org_id, collection, expected_interval_s, expires_after_s=expires_after_s, path=path
        )
        await self.gate.audited(caller, UseCase.SOURCES_POLICY, org_id, args=args)

    async def check_source_health(
        self, org_id: str, collection: str, *, principal: Principal | None = None
    ) -> _graph.SourceHealthReport:
        """Check every source of the collection and persist the report. Admins."""
        args = {"collection": collection}
        caller = await self.gate.authorize(principal, UseCase.SOURCES_CHECK, org_id, args=args)
        report = await _graph.SourceHealthMonitor(self.db).check(org_id, collection)
        await self.gate.audited(caller, UseCase.SOURCES_CHECK, org_id, args=args)
        return report

    async def source_health(
        self, org_id: str, collection: str, *, principal: Principal | None = None
    ) -> _graph.SourceHealthReport | None:
        """The collection's latest health report (``None`` before the first check)."""
        await self.gate.authorize(principal, UseCase.SOURCES_HEALTH, org_id)
        return await _graph.SourceHealthMonitor(self.db).latest(org_id, collection)
