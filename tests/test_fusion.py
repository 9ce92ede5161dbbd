"""Fusion of the lexical and dense rankings (issue 15, point 2): what each method computes,
and the default through the real store (PostgreSQL BM25 + pgvector, packaged MiniLM)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from knowledge_fixtures import ingest

from cortex_ray import Settings
from cortex_ray.knowledge import Fusion, KnowledgeService, KnowledgeWriter, RetrievalConfig, fuse
from cortex_ray.knowledge._types import Tier
from cortex_ray.models import SentenceTransformerEmbedder
from cortex_ray.storage import Database


def _z(scores: list[float]) -> list[float]:
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return [(s - mean) / sd for s in scores]


def test_zscore_standardises_each_list_and_weights_them() -> None:
    lexical = [(1, 12.0), (2, 6.0), (3, 3.0)]
    dense = [(2, 0.71), (1, 0.62), (3, 0.60)]
    fused = dict(
        fuse({Tier.BM25: lexical, Tier.PASSAGE_DENSE: dense}, Fusion.ZSCORE, bm25_weight=0.2)
    )
    zb, zd = _z([12.0, 6.0, 3.0]), _z([0.71, 0.62, 0.60])
    assert fused[1] == pytest.approx(0.2 * zb[0] + 0.8 * zd[1])
    assert fused[2] == pytest.approx(0.2 * zb[1] + 0.8 * zd[0])
    assert fused[3] == pytest.approx(0.2 * zb[2] + 0.8 * zd[2])


def test_zscore_counts_a_passage_a_list_missed_one_spread_below_its_lowest() -> None:
    lexical = [(1, 9.0), (2, 3.0)]
    dense = [(3, 0.8), (1, 0.5)]
    rankings = {Tier.BM25: lexical, Tier.PASSAGE_DENSE: dense}
    fused = dict(fuse(rankings, Fusion.ZSCORE, bm25_weight=0.5))
    # Each list of two standardises to +1 / -1; passage 2 (lexical only) gets dense's lowest
    # minus one, passage 3 (dense only) lexical's: agreement beats one list's enthusiasm.
    assert fused == pytest.approx(
        {1: 0.5 * 1 + 0.5 * -1, 2: 0.5 * -1 + 0.5 * -2, 3: 0.5 * -2 + 0.5 * 1}
    )
    assert [pid for pid, _ in fuse(rankings, Fusion.ZSCORE, bm25_weight=0.5)] == [1, 3, 2]


def test_a_list_without_spread_tells_nothing_apart_and_empty_lists_are_ignored() -> None:
    flat = [(1, 0.5), (2, 0.5)]
    fused = fuse({Tier.BM25: [], Tier.PASSAGE_DENSE: flat}, Fusion.ZSCORE, bm25_weight=0.2)
    assert fused == [(1, 0.0), (2, 0.0)]  # ties by passage id
    assert fuse({Tier.BM25: [], Tier.PASSAGE_DENSE: []}, Fusion.ZSCORE) == []


def test_the_default_is_the_measured_fusion() -> None:
    config = RetrievalConfig()
    assert config.fusion is Fusion.ZSCORE
    assert Settings().knowledge.fusion is Fusion.ZSCORE


DOCS = {
    "weather.md": b"# get_weather_forecast\n\nReturns the forecast for a city: temperature, "
    b"rain and wind for the next days.\n",
    "stocks.md": b"# stock_price\n\nLooks up the latest trading price of a company's shares on "
    b"an exchange.\n",
    "recipes.md": b"# recipe_search\n\nFinds dishes to cook from a list of ingredients and a "
    b"calorie limit.\n",
}


@pytest.fixture(scope="module")
def writer(db: Database) -> Iterator[KnowledgeWriter]:
    with KnowledgeWriter(db.dsn) as w:
        yield w


async def test_the_default_fusion_runs_through_the_store(
    writer: KnowledgeWriter, db: Database, org: str, minilm: SentenceTransformerEmbedder
) -> None:
    ingest(writer, org, "tools", DOCS, embedder=minilm)  # type: ignore[arg-type]
    service = KnowledgeService(db, minilm)
    # A paraphrase (dense's strength) and an exact name (BM25's) both come out on top.
    for query, path in [
        ("will it be raining in Paris tomorrow?", "weather.md"),
        ("stock_price", "stocks.md"),
        ("what can I cook with eggs and spinach under 500 kcal", "recipes.md"),
    ]:
        result = await service.search(org, query, k=3)
        assert result.fusion is Fusion.ZSCORE
        assert result.hits[0].path == path, (query, [h.path for h in result.hits])
