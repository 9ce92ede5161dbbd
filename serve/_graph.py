"""The context graph's routes (docs/graph.md, docs/api.md): graph search and path search,
submitted triples, and a collection's readers. Each route parses, calls one ``Runtime`` use
case and renders; errors take the shapes of ``serve._errors``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from cortex_ray import NotFoundError
from cortex_ray.graph import Entity, Fact, GraphResult, SourceHealthReport, Triple
from serve._app import _ERRORS, MemberDep, OrgPath, StateDep, _member
from serve._schemas import ApiError

__all__ = ["graph_router"]


CollectionPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")]


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class EntityBody(_Out):
    id: UUID
    type: str
    name: str
    aliases: list[str] = []

    @classmethod
    def of(cls, e: Entity) -> EntityBody:
        return cls(id=e.id, type=e.type, name=e.name, aliases=list(e.aliases))


class EvidenceBody(_Out):
    byte_start: int = Field(description="offset of the evidence's first byte in the version")
    byte_end: int = Field(description="offset just past its last byte")
    line_start: int
    line_end: int


class FactBody(_Out):
    """One assertion with its provenance, both time axes and its citation."""

    id: int
    subject: EntityBody
    predicate: str
    object: EntityBody
    confidence: float
    method: str
    method_version: str
    source_id: UUID | None
    source_version: int | None
    collection: str | None
    path: str | None
    evidence: EvidenceBody | None
    citation: str = Field(description="path:lines @vN, or 'submitted by <principal>'")
    submitted_by: str | None
    valid_from: datetime
    valid_to: datetime | None
    recorded_at: datetime
    invalidated_at: datetime | None
    source_health: str | None
    findings: list[str] = Field(description="the source's latest health findings, if unhealthy")
    warning: str | None = Field(description="set when the fact's source is not healthy")

    @classmethod
    def of(cls, f: Fact) -> FactBody:
        data = f.model_dump()
        data["subject"] = EntityBody.of(f.subject)
        data["object"] = EntityBody.of(f.object)
        return cls.model_validate(data)


class GraphSearchBody(_Out):
    seeds: list[EntityBody]
    entities: list[EntityBody]
    facts: list[FactBody]
    path: list[FactBody] | None = Field(
        default=None, description="path search: the chain of facts, or null when none"
    )
    truncated: bool = Field(description="a budget stopped the expansion")
    warnings: list[str]

    @classmethod
    def of(cls, r: GraphResult) -> GraphSearchBody:
        return cls(
            seeds=[EntityBody.of(e) for e in r.seeds],
            entities=[EntityBody.of(e) for e in r.entities],
            facts=[FactBody.of(f) for f in r.facts],
            path=None if r.path is None else [FactBody.of(f) for f in r.path],
            truncated=r.truncated,
            warnings=r.warnings,
        )


class TripleBody(Triple):
    """A submitted fact (camelCase on the wire; the same limits as ``Triple``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TriplesCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    triples: list[TripleBody] = Field(min_length=1, max_length=1000)


class TriplesCreated(_Out):
    run_id: int = Field(description="the extraction run (method 'user') that recorded them")
    entities: int
    assertions: int
    closed: int = Field(description="older assertions whose validity these closed")


class ReadersBody(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    principal_ids: list[Annotated[str, Field(pattern=r"^[^\x00]{1,200}$")]] = Field(
        max_length=1000, description="none: every member reads the collection"
    )


class FreshnessBody(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    expected_interval_s: float = Field(gt=0, le=10 * 365 * 86400)
    expires_after_s: float | None = Field(default=None, gt=0, le=100 * 365 * 86400)
    path: str | None = Field(
        default=None,
        pattern=r"^[^\x00]{1,4096}$",
        description="one source's policy (its registry path); none: the collection's",
    )


class FindingBody(_Out):
    source_id: UUID
    path: str
    kind: str = Field(
        description="STALE, EXPIRED, DEGRADED, DOWN, PERMISSION_DENIED or UNKNOWN_FRESHNESS"
    )
    latest_version: int | None
    detail: str


class HealthReportBody(_Out):
    id: int
    collection: str
    checked_at: datetime
    sources: int
    findings: list[FindingBody]

    @classmethod
    def of(cls, r: SourceHealthReport) -> HealthReportBody:
        return cls.model_validate(r.model_dump())


def graph_router() -> APIRouter:
    router = APIRouter(
        prefix="/api/orgs/{org}",
        dependencies=[Depends(_member)],
        responses=dict(_ERRORS),
        tags=["graph"],
    )
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

    admins: dict[int | str, dict[str, Any]] = {
        403: {"model": ApiError, "description": "admins only"}
    }

    @router.put(
        "/knowledge/collections/{collection}/freshness",
        status_code=204,
        tags=["knowledge"],
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
        tags=["knowledge"],
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
        tags=["knowledge"],
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
