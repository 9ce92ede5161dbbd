"""The context graph: search, paths, submitted triples, a collection's readers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictFloat
from pydantic.alias_generators import to_camel

from cortex_ray.graph import Entity, Fact, GraphResult, Triple


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
    """A submitted fact (camelCase on the wire; the same limits as ``Triple``; its
    confidence a JSON number, as every number in a body)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    confidence: StrictFloat = Field(default=1.0, ge=0.0, le=1.0)


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
