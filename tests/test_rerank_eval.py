"""The reranking benchmark's LLM reranker (bench/rerank_eval.py) on the packaged SmolLM2.

What the measurement rests on: the scorer is a core ``Reranker``; reusing the KV cache of
the shared prompt prefix between pairs gives the scores a fresh model gives (to float
noise); and it reorders knowledge search through the core's rerank stage, named.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_modules import load_bench
from knowledge_fixtures import ingest

from cortex_ray.knowledge import KnowledgeService, KnowledgeWriter, RetrievalConfig
from cortex_ray.models import TEST_MODEL_NAME, HashEmbedder, Reranker, packaged_model_path
from cortex_ray.settings import default_data_dir
from cortex_ray.storage import Database

DOCS = [
    "Ray actors keep state between method calls.",
    "Bananas are a yellow fruit rich in potassium.",
    "PostgreSQL stores rows in tables; pgvector adds vector columns.",
]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return packaged_model_path(TEST_MODEL_NAME, default_data_dir())  # as LlamaCppClient does


@pytest.fixture(scope="module")
def writer(db: Database) -> Iterator[KnowledgeWriter]:
    with KnowledgeWriter(db.dsn) as w:
        yield w


async def test_prefix_reuse_scores_as_a_fresh_model_does(model_path: Path) -> None:
    rerank_eval = load_bench("rerank_eval")
    warm = rerank_eval.LlamaYesNoReranker(model_path, threads=1)
    assert isinstance(warm, Reranker) and warm.name.startswith("llm-yes-no:")
    hits = await warm.rerank("what keeps state in ray", DOCS)
    assert sorted(h.index for h in hits) == [0, 1, 2]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    by_index = {h.index: h.score for h in hits}
    for i, doc in enumerate(DOCS):  # each pair alone, on a model that saw nothing before
        fresh = rerank_eval.LlamaYesNoReranker(model_path, threads=1)
        (alone,) = await fresh.rerank("what keeps state in ray", [doc])
        fresh.close()
        assert alone.score == pytest.approx(by_index[i], abs=1e-3)
    assert len(await warm.rerank("q", DOCS, top_n=2)) == 2
    warm.close()


async def test_it_reranks_knowledge_search_through_the_core(
    model_path: Path, writer: KnowledgeWriter, db: Database, org: str
) -> None:
    rerank_eval = load_bench("rerank_eval")
    reranker = rerank_eval.LlamaYesNoReranker(model_path, threads=1)
    ingest(
        writer, org, "docs", {f"d{i}.md": f"# D{i}\n\n{d}\n".encode() for i, d in enumerate(DOCS)}
    )
    service = KnowledgeService(
        db, HashEmbedder(384), config=RetrievalConfig(rerank_candidates=3), reranker=reranker
    )
    result = await service.search(org, "ray actors state", k=3)
    assert result.reranked and result.reranker == reranker.name
    scores = [h.rerank_score for h in result.hits]
    assert None not in scores and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert reranker.pairs == len(result.hits)
    reranker.close()
