"""Tool retrieval for large action spaces (issue 15, point 5): recall@k of the gold tools.

The whole corpus of the tool-retrieval development set (bench/data/bfcl-tools: 1266 function
documentations) is one agent's tool set; each query is an objective. For k = 5, 10, 20 it
prints the mean recall@k of the query's gold tools (the share of them among the k shown) and
all@k (the share of queries with every gold tool shown: what a multi-tool request needs),
for the rankers of the core's in-memory index (``cortex_ray.perceive.ToolIndex``, the one
PERCEIVE uses):

registry order  the first k tools by name (what a prompt cut to k tools without retrieval
                would show): the baseline
bm25            BM25 alone, the analyzer of the knowledge settings (--analyzer to change)
dense           MiniLM cosine alone
fused           BM25 + dense fused as ``settings.knowledge`` says (the runtime's default)
rrf, weighted@w the other fusions, for comparison

then the ratios of fused against dense alone and against registry order, per category.

A document is ``title + "\\n" + text`` (the name, the description, the parameter lines:
the layout of ``tool_document``). MiniLM vectors of the corpus and of the queries are cached
under --cache (``bench/retrieval_eval.py``'s ``embed_corpus``, its format).

Run: ``.venv/bin/python bench/tool_retrieval.py [bench/data/bfcl-tools]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from retrieval_eval import embed_corpus, load_beir

from cortex_ray import load_settings
from cortex_ray.knowledge import Analyzer, Fusion, RetrievalConfig
from cortex_ray.models import SentenceTransformerEmbedder
from cortex_ray.perceive import ToolIndex

KS = (5, 10, 20)
DATA = Path(__file__).resolve().parent / "data" / "bfcl-tools"


def _category(qid: str) -> str:
    return qid.rpartition("_")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=DATA)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cortex-ray-eval-cache"))
    parser.add_argument(
        "--analyzer",
        type=Analyzer.parse,
        default=None,
        help="plain, stem, identifiers or stem+identifiers (default: the settings')",
    )
    parser.add_argument("--weights", type=float, nargs="*", default=[0.05, 0.5])
    args = parser.parse_args()

    docs, queries, qrels = load_beir(args.folder)
    config = load_settings().knowledge
    analyzer = args.analyzer or Analyzer.configured(config)
    print(f"{args.folder}: {len(docs)} tools held, {len(queries)} queries")
    print(
        f"  analyzer {analyzer.name}; default fusion {config.fusion.value} "
        f"(bm25_weight {config.bm25_weight:g}, rrf_k {config.rrf_k})"
    )
    embedder = SentenceTransformerEmbedder()
    t0 = time.perf_counter()
    doc_vectors = embed_corpus(docs, embedder, args.cache)
    query_vectors = embed_corpus(queries, embedder, args.cache)
    t1 = time.perf_counter()
    ids = list(docs)
    index = ToolIndex(list(docs.values()), doc_vectors, analyzer)
    t2 = time.perf_counter()
    print(
        f"  vectors {t1 - t0:.1f} s (cached or embedded); index of {len(ids)} tools {t2 - t1:.2f} s"
    )

    n = max(KS)
    # Each fusion reads the same candidate lists as knowledge search (100 of each ranker).
    fusions: dict[str, RetrievalConfig] = {
        "fused": config,
        "rrf": config.model_copy(update={"fusion": Fusion.RRF}),
    }
    for w in args.weights:
        fusions[f"weighted@{w:g}"] = config.model_copy(
            update={"fusion": Fusion.WEIGHTED, "bm25_weight": w}
        )
    registry = sorted(range(len(ids)), key=lambda i: ids[i])[:n]
    rankers: dict[str, list[list[int]]] = defaultdict(list)
    took: dict[str, float] = defaultdict(float)
    for row, (qid, text) in enumerate(queries.items()):
        vector = query_vectors[row]
        rankers["registry order"].append(registry)
        started = time.perf_counter()
        rankers["bm25"].append([d for d, _ in index.bm25(text, n)])
        took["bm25"] += time.perf_counter() - started
        started = time.perf_counter()
        rankers["dense"].append([d for d, _ in index.dense(vector, n)])
        took["dense"] += time.perf_counter() - started
        for name, cfg in fusions.items():
            started = time.perf_counter()
            rankers[name].append(index.rank(text, vector, cfg)[:n])
            took[name] += time.perf_counter() - started
        del qid

    gold = [{ids.index(d) for d in qrels[q]} for q in queries]
    categories = [_category(q) for q in queries]

    def scores(ranked: list[list[int]], k: int, only: str | None = None) -> tuple[float, float]:
        rows = [
            (len(g & set(r[:k])) / len(g), float(g <= set(r[:k])))
            for r, g, c in zip(ranked, gold, categories, strict=True)
            if only is None or c == only
        ]
        return float(np.mean([a for a, _ in rows])), float(np.mean([b for _, b in rows]))

    head = " | ".join(f"recall@{k} | all@{k}" for k in KS)
    print(f"\n| ranker | {head} | ms/query |")
    print("|---|" + "---:|" * (2 * len(KS) + 1))
    table: dict[str, dict[int, tuple[float, float]]] = {}
    for name, ranked in rankers.items():
        table[name] = {k: scores(ranked, k) for k in KS}
        cells = " | ".join(f"{table[name][k][0]:.3f} | {table[name][k][1]:.3f}" for k in KS)
        ms = 1000 * took[name] / len(queries) if name in took else 0.0
        print(f"| {name} | {cells} | {ms:.2f} |")

    print("\n| ratio of fused recall@k | " + " | ".join(f"k={k}" for k in KS) + " |")
    print("|---|" + "---:|" * len(KS))
    for base in ("dense", "bm25", "registry order"):
        cells = " | ".join(f"{table['fused'][k][0] / max(table[base][k][0], 1e-9):.2f}" for k in KS)
        print(f"| ÷ {base} | {cells} |")

    print("\n| category | queries | " + " | ".join(f"fused recall@{k}" for k in KS) + " |")
    print("|---|---:|" + "---:|" * len(KS))
    for category in dict.fromkeys(categories):
        count = categories.count(category)
        cells = " | ".join(f"{scores(rankers['fused'], k, category)[0]:.3f}" for k in KS)
        print(f"| {category} | {count} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
