"""Knowledge: hybrid search with citations; a collection's source freshness and health."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from cortex_ray import NotFoundError
from cortex_ray.knowledge import Fusion
from serve._deps import MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.knowledge import FreshnessBody, HealthReportBody, KnowledgeHit, KnowledgeSearch

__all__ = ["knowledge_router"]

CollectionPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")]


def knowledge_router() -> APIRouter:
    """Knowledge search, and a collection's source freshness and health."""
    router = org_router()

    @router.get(
        "/knowledge/search",
        response_model=KnowledgeSearch,
        tags=["knowledge"],
        responses={
            403: {"model": ApiError, "description": "knowledge_search not granted"},
            503: {"model": ApiError, "description": "this runtime has no knowledge store"},
        },
    )
    async def search_knowledge(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        query: Annotated[str, Query(pattern=r"^[^\x00]{1,2000}$")],
        collection: Annotated[
            list[str] | None, Query(max_length=16, description="search only these collections")
        ] = None,
        k: Annotated[int, Query(ge=1, le=50)] = 10,
        fusion: Fusion | None = None,
        rerank: bool = True,
    ) -> KnowledgeSearch:
        """Hybrid search (BM25 in PostgreSQL + pgvector, fused, reranked when a reranker is
        available) over the organisation's published knowledge; every hit carries its
        citation. Allowed to admins and to callers granted ``knowledge_search``."""
        result = await state.runtime.search_knowledge(
            org,
            query,
            collection=collection or None,
            k=k,
            fusion=fusion,
            rerank=rerank,
            principal=principal,
        )
        return KnowledgeSearch(
            query=result.query,
            hits=[KnowledgeHit.of(h) for h in result.hits],
            tiers=result.tiers,
            fusion=result.fusion,
            reranked=result.reranked,
            reranker=result.reranker,
            skipped=result.skipped,
            publications=result.publications,
        )

    admins: dict[int | str, dict[str, Any]] = {
        403: {"model": ApiError, "description": "admins only"}
    }

    @router.put(
        "/knowledge/collections/{collection}/freshness",
        status_code=204,
        tags=["graph", "knowledge"],
        responses=admins,
    )
    async def set_freshness(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        collection: CollectionPath,
        body: FreshnessBody,
    ) -> None:
        """How often the collection's sources (or one, ``path``) should be updated: older
        than ``expectedIntervalS`` is STALE, than ``expiresAfterS`` (default four intervals)
        EXPIRED. Admins."""
        await state.runtime.set_freshness_policy(
            org,
            collection,
            body.expected_interval_s,
            expires_after_s=body.expires_after_s,
            path=body.path,
            principal=principal,
        )

    @router.post(
        "/knowledge/collections/{collection}/health",
        response_model=HealthReportBody,
        status_code=201,
        tags=["graph", "knowledge"],
        responses=admins,
    )
    async def check_health(
        state: StateDep, org: OrgPath, principal: MemberDep, collection: CollectionPath
    ) -> HealthReportBody:
        """Check every source of the collection now and persist the report. Admins."""
        report = await state.runtime.check_source_health(org, collection, principal=principal)
        return HealthReportBody.of(report)

    @router.get(
        "/knowledge/collections/{collection}/health",
        response_model=HealthReportBody,
        tags=["graph", "knowledge"],
    )
    async def get_health(
        state: StateDep, org: OrgPath, principal: MemberDep, collection: CollectionPath
    ) -> HealthReportBody:
        """The collection's latest health report (404 before its first check)."""
        report = await state.runtime.source_health(org, collection, principal=principal)
        if report is None:
            raise NotFoundError(f"collection {collection!r} has no health report yet")
        return HealthReportBody.of(report)

    return router
