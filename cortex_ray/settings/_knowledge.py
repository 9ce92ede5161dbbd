"""Options of knowledge search (``cortex_ray.knowledge``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Fusion", "RetrievalConfig"]


class Fusion(StrEnum):
    """How the lexical and dense rankings are combined."""

    RRF = "rrf"
    """Reciprocal-rank fusion: ``Σ 1 / (rrf_k + rank)`` over the lists a passage appears in."""
    WEIGHTED = "weighted"
    """Min-max normalised scores, ``w · bm25 + (1 - w) · cosine``."""
    ZSCORE = "zscore"
    """Standardised scores (minus the list's mean, over its standard deviation),
    ``w · bm25 + (1 - w) · cosine``; a passage one list did not return counts one standard
    deviation below that list's lowest."""


class RetrievalConfig(BaseModel):
    """Knowledge search: ``Settings.knowledge``, ``CORTEX_KNOWLEDGE__<FIELD>`` (defaults
    measured on wiki-ir-dev and at 1M passages; see docs/knowledge.md)."""

    # The attribute docstrings are the fields' descriptions (the settings table shows them).
    model_config = ConfigDict(use_attribute_docstrings=True)

    fusion: Fusion = Fusion.ZSCORE
    """How the lexical and dense rankings are combined: zscore, weighted or rrf."""
    rrf_k: int = Field(default=60, ge=1)
    """The k of reciprocal-rank fusion (fusion=rrf)."""
    bm25_weight: float = Field(default=0.3, ge=0.0, le=1.0)
    """Weight of the normalised BM25 score against cosine (fusion=zscore or weighted)."""
    postings_per_term: int = Field(default=10_000, ge=10)
    """Impact-ordered postings read per query term before the exact rescore."""
    bm25_candidates: int = Field(default=100, ge=1)
    """Passages the lexical ranking hands to fusion."""
    dense_candidates: int = Field(default=100, ge=1)
    """Passages the vector ranking hands to fusion."""
    sections: int = Field(default=8, ge=0)
    """Sections surfaced by the section vectors, whose passages may be embedded lazily."""
    lazy_passages: int = Field(default=32, ge=0)
    """At most this many passage vectors are computed while answering one query."""
    ef_search: int = Field(default=100, ge=10)
    """HNSW ef_search of the vector scans (recall against speed)."""
    rerank_candidates: int = Field(default=30, ge=1)
    """Fused results the reranker (if any) reorders."""
    exact_fallback_passages: int = Field(default=50_000, ge=0)
    """When HNSW returns fewer than asked and the searched publication holds at most this many
    passages, search its vectors exactly instead."""
    bm25_stem: bool = True
    """BM25 analyzer of new collections: English Snowball stemming (a collection keeps the
    analyzer of its first generation; docs/knowledge.md, "Analyzer")."""
    bm25_identifiers: bool = True
    """BM25 analyzer of new collections: snake_case, camelCase, dotted and kebab names give
    their whole and their parts as terms."""
    health_check_interval_s: float | None = Field(default=900.0, gt=0)
    """Where the API runs, how often the source health monitor checks each collection that
    has a freshness policy (a collection checked more recently is left alone); unset: never
    (docs/graph.md, "Source health")."""
    health_report_retention_days: float | None = Field(default=30.0, gt=0)
    """The sweeper deletes source health reports older than this, except each collection's
    latest (the only one warnings and the API read); unset: kept forever. At the default
    interval a collection gets 96 reports a day: 30 days is ~2,900, a month of history to
    tell when a source went stale (docs/graph.md, "Source health")."""
