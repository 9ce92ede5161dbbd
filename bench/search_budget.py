"""BM25 agreement against exact BM25, and BM25 latency, for several budgets of impact-ordered
postings per term (``RetrievalConfig.postings_per_term``) and rescore pools, side by side on
one corpus built by ``bench/search_latency.py --data-dir D --reuse`` (same ``--text`` and
``--passages``, so the same queries are drawn).

Run: ``.venv/bin/python bench/search_budget.py --data-dir D --passages 1000000 --text DIR...
--grid 3000:100,10000:100`` (each ``postings_per_term:bm25_candidates``; the rescore pool
is ``2 · bm25_candidates`` at k = 10 and ``max(200, 2 · bm25_candidates)`` at k = 100).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from search_latency import paragraphs

from cortex_ray import Settings, run_main, run_stoppable
from cortex_ray.knowledge import PLAIN, KnowledgeService, RetrievalConfig
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database


def draw_queries(texts: list[str], n: int) -> list[str]:
    """2–5 consecutive words of random passages (as the latency benchmark draws them)."""
    random.seed(11)
    queries = []
    for _ in range(n):
        words = PLAIN.tokenize(texts[random.randrange(len(texts))])  # surface words
        m = random.randint(2, 5)
        at = random.randrange(max(len(words) - m, 1))
        queries.append(" ".join(words[at : at + m]) or "kernel")
    return queries


async def measure(args: argparse.Namespace) -> None:
    texts: list[str] = []
    for text in paragraphs(args.text):
        texts.append(text)
        if len(texts) >= args.passages:
            break
    marker = args.data_dir / f"search-latency-{len(texts)}.org"
    if not marker.exists():
        sys.exit(f"{marker} is missing: build the corpus with search_latency.py --reuse first")
    org = marker.read_text().strip()
    grid = [tuple(int(x) for x in cell.split(":")) for cell in args.grid.split(",")]
    db = await Database.open(Settings(data_dir=args.data_dir, pool_max_size=4).storage)
    try:
        queries = draw_queries(texts, args.queries)
        exact_service = KnowledgeService(db, HashEmbedder(384))
        pub = await exact_service.publication(org)
        exact = {
            q: {i for i, _ in await exact_service.lexical(org, pub, q, 10, exact=True)}
            for q in queries
        }
        print(f"{len(texts)} passages, {len(queries)} queries; exact BM25 is the reference")
        print(f"{'postings/term':>13} {'candidates':>10} {'agreement':>9}   BM25 k=100")
        for per_term, candidates in grid:
            config = RetrievalConfig(postings_per_term=per_term, bm25_candidates=candidates)
            service = KnowledgeService(db, HashEmbedder(384), config=config)
            for q in queries[:20]:  # warm-up
                await service.lexical(org, pub, q, 100)
            agree, ms = [], []
            for q in queries:
                t0 = time.perf_counter()
                await service.lexical(org, pub, q, 100)
                ms.append((time.perf_counter() - t0) * 1000)
                fast = {i for i, _ in await service.lexical(org, pub, q, 10)}
                if exact[q]:
                    agree.append(len(fast & exact[q]) / len(exact[q]))
            print(
                f"{per_term:>13} {candidates:>10} {statistics.mean(agree):>9.3f}   "
                f"p50 {np.percentile(ms, 50):5.1f} ms  p95 {np.percentile(ms, 95):5.1f} ms"
            )
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--passages", type=int, required=True)
    parser.add_argument("--text", type=Path, action="append", required=True)
    parser.add_argument("--queries", type=int, default=150)
    parser.add_argument("--grid", default="3000:100,6000:100,8000:100,10000:100,20000:100")
    run_stoppable(measure(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(run_main(main))
