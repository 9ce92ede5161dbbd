"""The knowledge vocabulary at its boundaries: generations, source versions, search results."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from cortex_ray.knowledge._split import SplitPassage, SplitSection
from cortex_ray.settings import Fusion, RetrievalConfig

__all__ = [
    "Document",
    "Fusion",
    "GarbageReport",
    "Generation",
    "HealthEvent",
    "HealthRecord",
    "PublishReport",
    "RetrievalConfig",
    "SearchHit",
    "SearchResult",
    "SourceFile",
    "SourceVersion",
    "Tier",
]

HealthEvent = Literal["READ_OK", "READ_FAILURE", "DISAPPEARED", "SKIPPED"]


class Tier(StrEnum):
    """The retrieval tiers a result can come from."""

    BM25 = "bm25"
    SECTION_DENSE = "section_dense"
    PASSAGE_DENSE = "passage_dense"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Generation(_Frozen):
    """One ingestion run's version of a collection; picklable, so jobs can hand it around."""

    org_id: str
    collection: str
    id: int


class SourceVersion(_Frozen):
    """A registered source file: its stable id, the version of this content, and whether the
    published generation already holds exactly this content (then carry it forward)."""

    org_id: str
    collection: str
    path: str
    source_id: UUID
    version: int
    unchanged: bool


SourceFile = tuple[str, str, int]
"""What ``register_sources`` takes per file: ``(path, content hash, size in bytes)``."""
HealthRecord = tuple[str, HealthEvent, str]
"""One health event: ``(path, event, detail)``."""
Document = tuple[SourceVersion, Sequence[SplitSection], Sequence[SplitPassage]]
"""One document version's records for ``write_documents``: ``(source, sections, passages)``."""


class PublishReport(_Frozen):
    generation: int
    previous: int | None
    passages: int
    avgdl: float
    terms: int
    added_sources: int
    removed_sources: int
    publish_ms: float
    already_published: bool = False


class GarbageReport(_Frozen):
    generations: int
    source_versions: int


class SearchHit(_Frozen):
    passage_id: int
    collection: str
    source_id: UUID
    version: int
    path: str
    heading_path: tuple[str, ...]
    line_start: int
    line_end: int
    byte_start: int
    byte_end: int
    citation: str
    text: str
    score: float
    bm25_score: float | None = None
    dense_score: float | None = None
    rerank_score: float | None = None
    tiers: tuple[Tier, ...] = ()
    warning: str | None = None
    """Set when the source is unhealthy (its latest health report's findings)."""


class SearchResult(_Frozen):
    query: str
    hits: list[SearchHit]
    tiers: list[Tier]
    """The tiers that produced candidates for this query."""
    fusion: Fusion
    reranked: bool
    reranker: str | None = None
    """The reranker that reordered the hits (its ``name``), or ``None`` when none ran."""
    skipped: list[str] = []
    """Stages that did not run, each with its reason (e.g. no reranker available)."""
    publications: dict[str, int] = {}
    """The generation searched in each collection."""
    lazily_embedded: int = 0
    timings_ms: dict[str, float] = {}
