"""Retrieval quality (issue 5): nDCG@10, recall@100 and MRR@10 on any BEIR-layout folder.

Rows, side by side, on the same store:

bm25            ``KnowledgeService.search(tiers=["bm25"])``: BM25 computed in PostgreSQL
dense           ``tiers=["passage_dense"]``: MiniLM passage vectors, pgvector HNSW (halfvec)
rrf             BM25 + dense, reciprocal-rank fusion (k=60)
weighted@w      BM25 + dense, min-max normalised score fusion, BM25 weight w
zscore@w        BM25 + dense, standardised score fusion, BM25 weight w
default         BM25 + dense, fused as ``RetrievalConfig()``'s defaults (what users get)
fused+rerank    skipped unless a cross-encoder is available (none ships in a package here)
bm25s (ref)     the ``bm25s`` library on the SAME tokens (the store's analyzer), k1/b equal
                to ours

Each corpus document becomes one source (path = its ``_id``) with one section and one
passage (``title`` + newline + ``text``); each document is embedded once with MiniLM
(cached under ``--cache``) and the vector is both its section vector (written at ingest)
and its passage vector (written as a backfill would), so "dense" covers every passage.

The collection is written with ``--analyzer`` (default: the settings' default analyzer;
``plain``, ``stem``, ``identifiers`` or ``stem+identifiers``), and the reference tokenises
with the same one.

Run: ``.venv/bin/python bench/retrieval_eval.py /work/shared/eval/wiki-ir-dev``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _scratch import scratch_data_dir

from cortex_ray import Settings, run_main, run_stoppable
from cortex_ray.knowledge import (
    BM25_B,
    BM25_K1,
    Analyzer,
    Fusion,
    KnowledgeService,
    KnowledgeWriter,
    RetrievalConfig,
    Span,
    SplitPassage,
    SplitSection,
)
from cortex_ray.models import SentenceTransformerEmbedder
from cortex_ray.storage import Database

K = 100


def load_beir(folder: Path) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    docs: dict[str, str] = {}
    with (folder / "corpus.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            title = row.get("title") or ""
            docs[str(row["_id"])] = f"{title}\n{row['text']}" if title else row["text"]
    queries: dict[str, str] = {}
    with (folder / "queries.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            queries[str(row["_id"])] = row["text"]
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with (folder / "qrels" / "test.tsv").open() as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if i == 0 and not parts[-1].lstrip("-").isdigit():
                continue  # header
            qrels[parts[0]][parts[1]] = int(parts[2])
    queries = {q: t for q, t in queries.items() if q in qrels}
    return docs, queries, dict(qrels)


def metrics(ranked: list[str], rels: dict[str, int]) -> tuple[float, float, float]:
    dcg = sum((2 ** rels.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rels.values(), reverse=True)[:10]
    idcg = sum((2**r - 1) / math.log2(i + 2) for i, r in enumerate(ideal))
    relevant = {d for d, r in rels.items() if r > 0}
    recall = len(relevant & set(ranked[:K])) / max(len(relevant), 1)
    mrr = next((1 / (i + 1) for i, d in enumerate(ranked[:10]) if d in relevant), 0.0)
    return (dcg / idcg if idcg else 0.0), recall, mrr


def embed_corpus(
    docs: dict[str, str], embedder: SentenceTransformerEmbedder, cache: Path | None
) -> np.ndarray:
    """MiniLM vectors of every document, cached on disk by the corpus' hash."""
    digest = hashlib.sha256("\x00".join(f"{k}\x01{v}" for k, v in docs.items()).encode())
    path = cache / f"minilm-{digest.hexdigest()[:16]}.npy" if cache else None
    if path is not None and path.exists():
        return np.load(path)
    texts = list(docs.values())
    out = np.zeros((len(texts), 384), np.float32)
    for start in range(0, len(texts), 512):
        out[start : start + 512] = embedder.embed_sync(texts[start : start + 512])
        print(f"  embedded {min(start + 512, len(texts))}/{len(texts)}", end="\r", flush=True)
    print()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, out)
    return out


def ingest(
    dsn: str, org: str, docs: dict[str, str], vectors: np.ndarray, analyzer: Analyzer
) -> None:
    """One source per document, one section (vector eager) and one passage each.

    A document here is one section holding one passage, so the section vector and the
    passage vector are the same MiniLM vector of the document's text (embedded once); the
    passage vectors go in through ``write_passage_vectors``, as a backfill job would.
    """
    with KnowledgeWriter(dsn) as writer:
        gen = writer.begin_generation(org, "eval", analyzer=analyzer)
        for n, (doc_id, vector) in enumerate(zip(docs, vectors, strict=True)):
            text = docs[doc_id]
            data = text.encode()
            source = writer.register_source(
                org, "eval", doc_id, hashlib.sha256(data).hexdigest(), len(data)
            )
            span = Span(1, text.count("\n") + 1, 0, len(data))
            title = text.split("\n", 1)[0] if "\n" in text else ""
            writer.write_passages(gen, source, [SplitPassage(0, 0, text, span)])
            section = SplitSection(0, (title,) if title else (), span, text[:1000])
            writer.write_sections(gen, source, [section], vector[None, :])
            if n % 500 == 0:
                print(f"  ingested {n}/{len(docs)}", end="\r", flush=True)
        report = writer.publish(gen)
        print(
            f"\n  published: {report.passages} passages, {report.terms} terms, "
            f"avgdl {report.avgdl:.1f}, publish {report.publish_ms:.0f} ms"
        )
        ids = writer.passages_to_embed(org, "eval", len(docs))
        row = {doc_id: i for i, doc_id in enumerate(docs)}
        rows = writer.conn.execute(
            "SELECT p.id, s.path FROM kb_passages p JOIN kb_sources s "
            "ON s.org_id = p.org_id AND s.id = p.source_id WHERE p.org_id = %s",
            (org,),
        ).fetchall()
        path_of = {r["id"]: r["path"] for r in rows}
        pids = [pid for pid, _ in ids]
        writer.write_passage_vectors(org, pids, vectors[[row[path_of[p]] for p in pids]])


async def run(args: argparse.Namespace) -> None:
    docs, queries, qrels = load_beir(args.folder)
    if args.limit:
        queries = dict(list(queries.items())[: args.limit])
    print(f"{args.folder}: {len(docs)} documents, {len(queries)} queries with qrels")
    analyzer: Analyzer = args.analyzer
    print(f"  analyzer: {analyzer.name}")
    embedder = SentenceTransformerEmbedder()
    with scratch_data_dir(args.data_dir) as data_dir:
        settings = Settings(data_dir=data_dir, database_url=args.database_url)
        db = await Database.open(settings.storage)
        org = f"eval-{uuid.uuid4().hex[:8]}"
        try:
            t0 = time.perf_counter()
            vectors = await asyncio.to_thread(embed_corpus, docs, embedder, args.cache)
            t1 = time.perf_counter()
            await asyncio.to_thread(ingest, db.dsn, org, docs, vectors, analyzer)
            t2 = time.perf_counter()
            print(f"  embed {t1 - t0:.1f} s, write + publish + passage vectors {t2 - t1:.1f} s")
            service = KnowledgeService(
                db, embedder, config=RetrievalConfig(bm25_candidates=K, dense_candidates=K)
            )

            modes: dict[str, dict[str, object]] = {
                "bm25": {"tiers": ["bm25"]},
                "dense": {"tiers": ["passage_dense"]},
                "rrf": {"fusion": Fusion.RRF, "tiers": ["bm25", "passage_dense"]},
            }
            for w in args.weights:
                modes[f"weighted@{w:g}"] = {
                    "fusion": Fusion.WEIGHTED,
                    "weight": w,
                    "tiers": ["bm25", "passage_dense"],
                }
            for w in args.zweights:
                modes[f"zscore@{w:g}"] = {
                    "fusion": Fusion.ZSCORE,
                    "weight": w,
                    "tiers": ["bm25", "passage_dense"],
                }
            default = RetrievalConfig()
            modes["default"] = {"tiers": ["bm25", "passage_dense"]}
            print(f"  default fusion: {default.fusion.value}, BM25 weight {default.bm25_weight:g}")
            rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
            latency: dict[str, list[float]] = defaultdict(list)
            skipped: set[str] = set()
            for name, mode in modes.items():
                for qid, text in queries.items():
                    started = time.perf_counter()
                    result = await service.search(
                        org,
                        text,
                        k=K,
                        tiers=mode["tiers"],  # type: ignore[arg-type]
                        fusion=mode.get("fusion"),  # type: ignore[arg-type]
                        bm25_weight=mode.get("weight"),  # type: ignore[arg-type]
                        lazy=False,
                        track_usage=False,
                    )
                    latency[name].append((time.perf_counter() - started) * 1000)
                    rows[name].append(metrics([h.path for h in result.hits], qrels[qid]))
                    skipped.update(result.skipped)

            # The reference: bm25s on the store's tokens, same k1 and b, Lucene idf.
            import bm25s

            ids = list(docs)
            model = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
            model.index([analyzer.tokenize(docs[d]) for d in ids], show_progress=False)
            vocab = model.vocab_dict
            for qid, text in queries.items():
                terms = [t for t in analyzer.query_terms(text) if t in vocab]
                if not terms:
                    rows["bm25s (ref)"].append(metrics([], qrels[qid]))
                    continue
                scores = model.get_scores(terms)
                top = np.argsort(-scores, kind="stable")[:K]
                rows["bm25s (ref)"].append(
                    metrics([ids[i] for i in top if scores[i] > 0], qrels[qid])
                )

            print()
            print(f"{'run':<16} {'nDCG@10':>8} {'R@100':>8} {'MRR@10':>8} {'p50 ms':>8}")
            summary = {}
            for name in [*modes, "fused+rerank", "bm25s (ref)"]:
                if name == "fused+rerank":
                    reason = "; ".join(sorted(skipped)) or "no reranker configured"
                    print(f"{name:<16} {'skipped':>8}  ({reason})")
                    continue
                m = np.mean(np.array(rows[name]), axis=0)
                summary[name] = m
                p50 = f"{np.percentile(latency[name], 50):8.1f}" if name in latency else " " * 8
                print(f"{name:<16} {m[0]:8.4f} {m[1]:8.4f} {m[2]:8.4f} {p50}")
            print()
            gap = summary["bm25s (ref)"][0] - summary["bm25"][0]
            best_single = max(summary["bm25"][0], summary["dense"][0])
            fused = {
                n: v[0]
                for n, v in summary.items()
                if n == "rrf" or n.startswith(("weighted", "zscore"))
            }
            best_fused = max(fused, key=lambda n: fused[n])
            print(
                f"BM25 vs reference: nDCG@10 gap {gap:+.4f} "
                f"→ {'PASS' if abs(gap) <= 0.01 else 'FAIL'} (target within 0.01)"
            )
            print(
                f"fused vs best single ({best_single:.4f}): rrf {fused['rrf']:.4f} "
                f"→ {'PASS' if fused['rrf'] >= best_single else 'FAIL'}; best fusion "
                f"{best_fused} {fused[best_fused]:.4f} "
                f"→ {'PASS' if fused[best_fused] >= best_single else 'FAIL'}"
            )
            ours = summary["default"][0]
            print(
                f"default ({default.fusion.value}@{default.bm25_weight:g}) {ours:.4f} vs best "
                f"single {best_single:.4f}: ratio {ours / best_single:.4f} "
                f"→ {'PASS' if ours >= best_single else 'FAIL'} (target ≥ the better single)"
            )
        finally:
            await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv"
    )
    parser.add_argument("--weights", type=float, nargs="*", default=[0.05, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument(
        "--zweights", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5], help="zscore@w rows"
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N queries")
    parser.add_argument(
        "--analyzer",
        type=Analyzer.parse,
        default=Analyzer.configured(RetrievalConfig()),
        help="the BM25 analyzer of the collection and the reference: plain, stem, "
        "identifiers or stem+identifiers (default: the settings' default)",
    )
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
