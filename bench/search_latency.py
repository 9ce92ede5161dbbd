"""Hybrid candidate generation latency (issue 5): p50/p95 of BM25 + dense candidates (no
rerank, no query embedding) at a given scale, with BM25 top-10 agreement against exact BM25.

Corpus: real text (``--text``: folders of .rst/.md/.txt/.yaml/.c/.h/extension-less files, or
BEIR ``corpus.jsonl`` files), cut into paragraphs of 200–1,200 bytes, grouped into
sources of 50 passages and spread over 10 collections (one collection = a 10% filter).
Vectors are synthetic but structured: 256 random topic centres in 384 dimensions, each
source drawn to one topic and each passage its centre plus noise (so neighbourhoods exist,
unlike uniform noise). Queries are 2–5 consecutive words of random passages; the query
vector is a random topic centre plus noise.

Measured (each a separate pass over the same queries, after one warm-up pass):

one client        BM25 (impact-ordered + exact rescore) and HNSW passage search run
                  concurrently on two pooled connections, as ``KnowledgeService.search`` does
filter 10%        the same, restricted to one of the 10 collections
4 clients         four concurrent clients, unfiltered
agreement         |top-10 ∩ exact top-10| / 10 against BM25 over ALL postings of the terms
publish           the first publication (vocabulary from scratch) and an incremental one
                  after 1% of the sources changed

Run: ``.venv/bin/python bench/search_latency.py --passages 100000 --text DIR [--text DIR]``
(``--data-dir D --reuse`` keeps the built corpus in D and measures it again on later runs.)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _scratch import scratch_data_dir

from cortex_ray import Settings, run_main, run_stoppable
from cortex_ray.knowledge import (
    PLAIN,
    KnowledgeService,
    KnowledgeWriter,
    RetrievalConfig,
    Span,
    SplitPassage,
    vector_literal,
)
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database

COLLECTIONS = 10
PER_SOURCE = 50
TOPICS = 256
DIM = 384


def paragraphs(sources: list[Path]) -> Iterator[str]:
    for source in sources:
        if source.is_file() and source.suffix == ".jsonl":
            with source.open() as f:
                for line in f:
                    row = json.loads(line)
                    yield f"{row.get('title', '')}\n{row['text']}".strip()
            continue
        for path in sorted(source.rglob("*")):
            if (
                path.suffix not in {".rst", ".md", ".txt", ".yaml", "", ".c", ".h"}
                or not path.is_file()
            ):
                continue
            text = path.read_text(errors="replace")
            buf = ""
            for para in text.split("\n\n"):
                para = para.strip()
                if not para:
                    continue
                buf = f"{buf}\n\n{para}" if buf else para
                if len(buf) >= 200:
                    yield buf[:1200]
                    buf = ""


def build(dsn: str, org: str, texts: list[str], rng: np.random.Generator) -> dict[str, float]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with KnowledgeWriter(dsn) as writer:
        gens = {f"c{i}": writer.begin_generation(org, f"c{i}") for i in range(COLLECTIONS)}
        for s, start in enumerate(range(0, len(texts), PER_SOURCE)):
            collection = f"c{s % COLLECTIONS}"
            chunk = texts[start : start + PER_SOURCE]
            digest = hashlib.sha256("\x00".join(chunk).encode()).hexdigest()
            source = writer.register_source(org, collection, f"src/{s:06d}.txt", digest, 1)
            offset, passages = 0, []
            for i, text in enumerate(chunk):
                size = len(text.encode())
                passages.append(SplitPassage(i, 0, text, Span(i + 1, i + 1, offset, offset + size)))
                offset += size
            writer.write_passages(gens[collection], source, passages)
            if s % 50 == 0:
                print(f"  wrote {start + len(chunk)}/{len(texts)}", end="\r", flush=True)
        t1 = time.perf_counter()
        timings["write_s"] = t1 - t0
        publish_ms = [writer.publish(g).publish_ms for g in gens.values()]
        timings["first_publish_ms_per_collection"] = statistics.mean(publish_ms)
    print()
    return timings


def add_vectors(dsn: str, org: str, rng: np.random.Generator, centres: np.ndarray) -> float:
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX IF EXISTS kb_passages_embedding")
        rows = conn.execute(
            "SELECT id, source_id FROM kb_passages WHERE org_id = %s ORDER BY id", (org,)
        ).fetchall()
        topic_of: dict[object, int] = {}
        conn.execute("CREATE TEMP TABLE vec_stage (id bigint PRIMARY KEY, vec halfvec(384))")
        with conn.cursor().copy("COPY vec_stage (id, vec) FROM STDIN") as copy:
            for pid, source_id in rows:
                topic = topic_of.setdefault(source_id, int(rng.integers(0, TOPICS)))
                v = centres[topic] + rng.normal(scale=0.35, size=DIM)
                copy.write_row((pid, vector_literal(v / np.linalg.norm(v))))
        conn.execute(
            "UPDATE kb_passages p SET embedding = s.vec FROM vec_stage s "
            "WHERE p.org_id = %s AND p.id = s.id",
            (org,),
        )
        conn.execute("VACUUM ANALYZE kb_passages")
        conn.execute("VACUUM ANALYZE kb_postings")
        conn.execute("SET maintenance_work_mem = '2GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        t1 = time.perf_counter()
        conn.execute(
            "CREATE INDEX kb_passages_embedding ON kb_passages "
            "USING hnsw (embedding halfvec_cosine_ops)"
        )
        print(f"  HNSW build {time.perf_counter() - t1:.1f} s")
    return time.perf_counter() - t0


def percentiles(values: list[float]) -> str:
    v = np.array(values)
    return f"p50 {np.percentile(v, 50):6.1f} ms  p95 {np.percentile(v, 95):6.1f} ms"


async def measure(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(11)
    random.seed(11)
    texts: list[str] = []
    for text in paragraphs(args.text):
        texts.append(text)
        if len(texts) >= args.passages:
            break
    if len(texts) < args.passages:
        print(f"only {len(texts)} paragraphs in the given text; using them all")
    print(f"{len(texts)} passages, {COLLECTIONS} collections, sources of {PER_SOURCE}")
    centres = rng.normal(size=(TOPICS, DIM))
    with scratch_data_dir(args.data_dir) as data_dir:
        settings = Settings(data_dir=data_dir, database_url=args.database_url, pool_max_size=16)
        db = await Database.open(settings.storage)
        # --reuse: a corpus built by an earlier run into the same --data-dir (same passages)
        # is measured again as it is, so that settings can be compared without a rebuild.
        marker = data_dir / f"search-latency-{len(texts)}.org"
        reused = args.reuse and marker.exists()
        org = marker.read_text().strip() if reused else f"lat-{uuid.uuid4().hex[:8]}"
        try:
            if reused:
                print(f"  reusing {org} from {marker}")
            else:
                build_t = await asyncio.to_thread(build, db.dsn, org, texts, rng)
                vec_s = await asyncio.to_thread(add_vectors, db.dsn, org, rng, centres)
                marker.write_text(org)
                print(
                    f"  write {build_t['write_s']:.1f} s "
                    f"({len(texts) / build_t['write_s']:.0f} passages/s), first publish "
                    f"{build_t['first_publish_ms_per_collection']:.0f} ms per collection, "
                    f"vectors + HNSW {vec_s:.1f} s"
                )
            if args.build_only:
                return

            config = RetrievalConfig(ef_search=args.ef_search)
            if args.postings_per_term:
                config.postings_per_term = args.postings_per_term
            service = KnowledgeService(db, HashEmbedder(DIM), config=config)
            queries = []
            for _ in range(args.queries):
                i = random.randrange(len(texts))
                words = PLAIN.tokenize(texts[i])  # surface words; the store's analyzer reads them
                n = random.randint(2, 5)
                at = random.randrange(max(len(words) - n, 1))
                q = " ".join(words[at : at + n]) or "kernel"
                topic_vec = centres[random.randrange(TOPICS)]
                v = topic_vec + rng.normal(scale=0.35, size=DIM)
                queries.append((q, (v / np.linalg.norm(v)).astype(np.float32)))

            everything = await service.publication(org)
            one = await service.publication(org, "c3")

            async def candidates(pub: object, q: str, v: np.ndarray) -> float:
                t0 = time.perf_counter()
                await asyncio.gather(
                    service.lexical(org, pub, q, 100),  # type: ignore[arg-type]
                    service.passage_dense(org, pub, v, 100),  # type: ignore[arg-type]
                )
                return (time.perf_counter() - t0) * 1000

            # Warm-up: one untimed pass over every query. A pass over only a few left the
            # first timed pass (one client) reading pages the later passes found cached: on
            # this VM pages untouched for about a minute are reclaimed (docs/benchmarks.md),
            # so the first pass measured the cold store and the 4-client pass the warm one.
            for q, v in queries:
                await candidates(everything, q, v)

            single = [await candidates(everything, q, v) for q, v in queries]
            filtered = [await candidates(one, q, v) for q, v in queries]

            async def client(chunk: list[tuple[str, np.ndarray]]) -> list[float]:
                return [await candidates(everything, q, v) for q, v in chunk]

            t0 = time.perf_counter()
            parts = await asyncio.gather(*(client(queries[i::4]) for i in range(4)))
            wall = time.perf_counter() - t0
            concurrent = [x for p in parts for x in p]

            agree, exact_ms = [], []
            for q, _ in queries:
                fast = await service.lexical(org, everything, q, 10)
                t0 = time.perf_counter()
                exact = await service.lexical(org, everything, q, 10, exact=True)
                exact_ms.append((time.perf_counter() - t0) * 1000)
                if exact:
                    agree.append(len({i for i, _ in fast} & {i for i, _ in exact}) / len(exact))

            bm25_only = []
            for q, _ in queries:
                t0 = time.perf_counter()
                await service.lexical(org, everything, q, 100)
                bm25_only.append((time.perf_counter() - t0) * 1000)
            dense_only = []
            for _, v in queries:
                t0 = time.perf_counter()
                await service.passage_dense(org, everything, v, 100)
                dense_only.append((time.perf_counter() - t0) * 1000)
            filtered_counts = [
                len(await service.passage_dense(org, one, v, 100)) for _, v in queries[:50]
            ]

            # Incremental publish: 1% of one collection's sources change (a reused corpus
            # would drift with each run, so it is left as built).
            inc_ms = (
                None
                if args.reuse
                else await asyncio.to_thread(incremental_publish, db.dsn, org, texts)
            )

            print()
            print(f"hybrid candidates, one client     {percentiles(single)}")
            print(
                f"hybrid candidates, 10% filter     {percentiles(filtered)}  "
                f"(dense rows returned: min {min(filtered_counts)} of 100)"
            )
            print(
                f"hybrid candidates, 4 clients      {percentiles(concurrent)}  "
                f"({len(concurrent) / wall:.0f} queries/s)"
            )
            print(f"  BM25 alone                      {percentiles(bm25_only)}")
            print(f"  HNSW alone (ef_search {args.ef_search})        {percentiles(dense_only)}")
            print(f"  exact BM25 (all postings)       {percentiles(exact_ms)}")
            print(
                f"BM25 top-10 agreement with exact  {statistics.mean(agree):.3f} "
                f"over {len(agree)} queries"
            )
            if inc_ms is not None:
                print(
                    f"incremental publish (1% of a collection's sources changed): {inc_ms:.0f} ms"
                )
            p95 = lambda xs: float(np.percentile(xs, 95))  # noqa: E731
            print()
            print(
                f"targets: one client p95 ≤ 50 ms → "
                f"{'PASS' if p95(single) <= 50 else 'FAIL'}; agreement ≥ 0.95 → "
                f"{'PASS' if statistics.mean(agree) >= 0.95 else 'FAIL'}; "
                f"filter p95 ≤ 100 ms → {'PASS' if p95(filtered) <= 100 else 'FAIL'}; "
                f"4 clients p95 ≤ 100 ms → {'PASS' if p95(concurrent) <= 100 else 'FAIL'}"
            )
        finally:
            await db.close()


def incremental_publish(dsn: str, org: str, texts: list[str]) -> float:
    with KnowledgeWriter(dsn) as writer:
        gen = writer.begin_generation(org, "c0")
        import psycopg

        with psycopg.connect(dsn) as conn:
            paths = [
                r[0]
                for r in conn.execute(
                    "SELECT s.path FROM kb_sources s WHERE s.org_id = %s AND s.collection = 'c0' "
                    "ORDER BY s.path",
                    (org,),
                ).fetchall()
            ]
        changed = set(paths[::100])
        for path in paths:
            if path in changed:
                text = f"changed {path} " + texts[hash(path) % len(texts)]
                source = writer.register_source(
                    org, "c0", path, hashlib.sha256(text.encode()).hexdigest(), len(text)
                )
                size = len(text.encode())
                writer.write_passages(gen, source, [SplitPassage(0, 0, text, Span(1, 1, 0, size))])
            else:
                row = writer.conn.execute(
                    "SELECT id FROM kb_sources WHERE org_id = %s AND collection = 'c0' "
                    "AND path = %s",
                    (org, path),
                ).fetchone()
                assert row is not None
                writer.carry_forward(gen, row["id"])
        return writer.publish(gen).publish_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument(
        "--text",
        type=Path,
        action="append",
        required=True,
        help="a folder of .rst/.md/.txt files or a BEIR corpus.jsonl",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ef-search", type=int, default=100)
    parser.add_argument("--postings-per-term", type=int, default=None)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --data-dir: measure the corpus an earlier --reuse run built there "
        "(build it if absent); skips the incremental publish",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="with --data-dir --reuse: build the corpus and stop (measure it later, on an "
        "idle machine: a build beside other work still gives a store that measures the same)",
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_stoppable(measure(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(run_main(main))
