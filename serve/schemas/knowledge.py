"""Knowledge: hybrid search with citations; source freshness and health."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from cortex_ray.graph import SourceHealthReport
from cortex_ray.knowledge import Fusion, SearchHit, Tier
from serve.schemas._common import Number, _Out


class KnowledgeHit(_Out):
    """One passage, with everything needed to cite it."""

    citation: str = Field(description="path:lines (heading › path) @vN")
    text: str
    collection: str
    source_id: UUID
    version: int
    path: str
    heading_path: list[str]
    line_start: int
    line_end: int
    byte_start: int = Field(description="offset of the passage's first byte in the file")
    byte_end: int = Field(description="offset just past its last byte")
    score: float
    bm25_score: float | None
    dense_score: float | None
    rerank_score: float | None
    tiers: list[Tier]
    warning: str | None = Field(
        default=None, description="set when the source is unhealthy (its latest health report)"
    )

    @classmethod
    def of(cls, hit: SearchHit) -> KnowledgeHit:
        return cls(
            citation=hit.citation,
            text=hit.text,
            collection=hit.collection,
            source_id=hit.source_id,
            version=hit.version,
            path=hit.path,
            heading_path=list(hit.heading_path),
            line_start=hit.line_start,
            line_end=hit.line_end,
            byte_start=hit.byte_start,
            byte_end=hit.byte_end,
            score=hit.score,
            bm25_score=hit.bm25_score,
            dense_score=hit.dense_score,
            rerank_score=hit.rerank_score,
            tiers=list(hit.tiers),
            warning=hit.warning,
        )


class KnowledgeSearch(_Out):
    query: str
    hits: list[KnowledgeHit]
    tiers: list[Tier] = Field(description="the tiers that produced candidates")
    fusion: Fusion
    reranked: bool
    reranker: str | None = Field(
        default=None, description="the reranker that reordered the hits, if one ran"
    )
    skipped: list[str] = Field(description="stages that did not run, each with its reason")
    publications: dict[str, int] = Field(description="the generation searched per collection")


class FreshnessBody(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    expected_interval_s: Number = Field(gt=0, le=10 * 365 * 86400)
    expires_after_s: Number | None = Field(default=None, gt=0, le=100 * 365 * 86400)
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
