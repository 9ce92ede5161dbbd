"""The context graph (docs/graph.md): graph search and path search, submitted triples, a
collection's readers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query

from serve._deps import MemberDep, OrgPath, StateDep, org_router
from serve.schemas import ApiError
from serve.schemas.graph import GraphSearchBody, ReadersBody, TriplesCreate, TriplesCreated

__all__ = ["graph_router"]

CollectionPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")]


def graph_router() -> APIRouter:
    """The context graph."""
    router = org_router(tags=["graph"])

    denied: dict[int | str, dict[str, Any]] = {
        403: {"model": ApiError, "description": "graph_search not granted"}
    }

    @router.get("/graph/search", response_model=GraphSearchBody, responses=denied)
    async def search_graph(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        term: Annotated[
            list[str] | None, Query(max_length=16, description="names, aliases, ids to start at")
        ] = None,
        entity: Annotated[list[UUID] | None, Query(max_length=16)] = None,
        source: Annotated[
            list[UUID] | None, Query(max_length=16, description="knowledge hits' source ids")
        ] = None,
        depth: Annotated[int, Query(ge=1, le=4)] = 1,
        max_facts: Annotated[int, Query(alias="maxFacts", ge=1, le=500)] = 50,
        per_entity: Annotated[int, Query(alias="perEntity", ge=1, le=200)] = 10,
        predicate: Annotated[list[str] | None, Query(max_length=16)] = None,
        valid_at: Annotated[datetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[datetime | None, Query(alias="knownAt")] = None,
    ) -> GraphSearchBody:
        """Seeds → matching entities → neighbours within ``depth`` hops, at most
        ``perEntity`` facts per entity and ``maxFacts`` in all, as of ``validAt`` (valid
        time) and ``knownAt`` (record time). Facts from sources the caller may not read are
        left out. Admins, or callers granted ``graph_search``."""
        result = await state.runtime.search_graph(
            org,
            terms=[t for t in term or () if t.strip() and "\x00" not in t],
            entity_ids=entity or (),
            source_ids=source or (),
            depth=depth,
            max_facts=max_facts,
            per_entity=per_entity,
            predicates=predicate or None,
            valid_at=valid_at,
            known_at=known_at,
            principal=principal,
        )
        return GraphSearchBody.of(result)

    @router.get("/graph/path", response_model=GraphSearchBody, responses=denied)
    async def graph_path(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        start: Annotated[UUID, Query(alias="from")],
        end: Annotated[UUID, Query(alias="to")],
        max_depth: Annotated[int, Query(alias="maxDepth", ge=1, le=4)] = 3,
        predicate: Annotated[list[str] | None, Query(max_length=16)] = None,
        valid_at: Annotated[datetime | None, Query(alias="validAt")] = None,
        known_at: Annotated[datetime | None, Query(alias="knownAt")] = None,
    ) -> GraphSearchBody:
        """A shortest chain of facts the caller may read between two entities (``path``
        is null when there is none within ``maxDepth``)."""
        result = await state.runtime.search_graph(
            org,
            entity_ids=[start],
            path_to=end,
            depth=max_depth,
            predicates=predicate or None,
            valid_at=valid_at,
            known_at=known_at,
            principal=principal,
        )
        return GraphSearchBody.of(result)

    @router.post(
        "/graph/triples",
        response_model=TriplesCreated,
        status_code=201,
        responses={403: {"model": ApiError, "description": "graph_submit not granted"}},
    )
    async def submit_triples(
        state: StateDep, org: OrgPath, principal: MemberDep, body: TriplesCreate
    ) -> TriplesCreated:
        """Record the caller's own facts (cited as submitted by the caller). A triple with
        ``functional: true`` declares its predicate one-object-per-subject: a newer one
        closes the older one's validity (never deletes it). Admins, or writers granted
        ``graph_submit``."""
        report = await state.runtime.submit_triples(org, body.triples, principal=principal)
        return TriplesCreated(
            run_id=report.run_id,
            entities=report.entities,
            assertions=report.assertions,
            closed=report.closed,
        )

    @router.put(
        "/knowledge/collections/{collection}/readers",
        status_code=204,
        responses={403: {"model": ApiError, "description": "admins only"}},
    )
    async def set_readers(
        state: StateDep,
        org: OrgPath,
        principal: MemberDep,
        collection: CollectionPath,
        body: ReadersBody,
    ) -> None:
        """Restrict who reads a collection's facts to these principals (and admins); an
        empty list opens it to every member again. Admins."""
        await state.runtime.set_collection_readers(
            org, collection, body.principal_ids, principal=principal
        )

    return router
