"""Context graph retrieval latency (issue 19, point 6): p50/p95 of ``GraphStore.search`` at
depth 2 with budgets (``per_entity`` 10, ``max_facts`` 50) and of a depth-1 search, over a
record of ``--assertions`` assertions (default 1,000,000) among ``--entities`` entities, as a
member who may not read one of the two collections (so every statement applies the reader
filter). Target: depth-2 p95 ≤ 50 ms at 1M assertions.

The graph: entity degrees follow a Zipf-like law (a few hubs, a long tail), 20 predicates,
1,000 sources in two collections ("open", and "closed" whose readers exclude the member),
every assertion with an evidence span. It is loaded with COPY (the bulk path; the
``graph_assert`` write path is measured by bench/graph_projection.py's "recorded" line),
then ANALYZEd. Seeds are names of random entities picked by degree rank (a mix of hubs and
tail). The store is warmed with one pass before the measured one (docs: FACTS, page cache).

Run: ``.venv/bin/python bench/graph_retrieval.py --assertions 1000000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from _scratch import scratch_data_dir

from cortex_ray import Settings, run_main, run_stoppable
from cortex_ray.graph import GraphStore, Reader
from cortex_ray.knowledge import KnowledgeWriter
from cortex_ray.storage import Database

PREDICATES = [f"rel_{i}" for i in range(20)]


def build(dsn: str, org: str, entities: int, assertions: int, rng: random.Random) -> float:
    started = time.perf_counter()
    with KnowledgeWriter(dsn) as kw:
        sources = []
        for collection in ("open", "closed"):
            files = [
                (f"{collection}/doc-{i}.md", f"h-{collection}-{i}", 10_000) for i in range(500)
            ]
            sources += [
                (s.source_id, collection) for s in kw.register_sources(org, collection, files)
            ]
    ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(entities)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        run = conn.execute(
            "INSERT INTO graph_extraction_runs (org_id, method, method_version) "
            "VALUES (%s, 'bench', '1') RETURNING id",
            (org,),
        ).fetchone()[0]  # type: ignore[index]
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO graph_predicates (org_id, name) SELECT %s, unnest(%s::text[])",
                (org, PREDICATES),
            )
            with cur.copy(
                "COPY graph_entities (org_id, id, type, canonical_name, key) FROM STDIN"
            ) as copy:
                for i, ident in enumerate(ids):
                    copy.write_row((org, ident, f"type_{i % 8}", f"Entity {i}", f"entity {i}"))
            with cur.copy(
                "COPY graph_entity_aliases (org_id, entity_id, alias, key) FROM STDIN"
            ) as copy:
                for i, ident in enumerate(ids):
                    copy.write_row((org, ident, f"Entity {i}", f"entity {i}"))
            # Zipf-like degrees: endpoint ranks drawn as floor(entities * u^3).
            with cur.copy(
                "COPY graph_assertions (org_id, subject_id, predicate, object_id, source_id, "
                "source_version, collection, confidence, method, method_version, run_id, "
                "byte_start, byte_end, line_start, line_end, valid_from, fingerprint) FROM STDIN"
            ) as copy:
                for n in range(assertions):
                    s = ids[int(entities * rng.random() ** 3)]
                    o = ids[int(entities * rng.random() ** 3)]
                    src, collection = sources[n % len(sources)]
                    start = rng.randrange(9000)
                    copy.write_row((
                        org, s, PREDICATES[n % 20], o, src, 1, collection, round(rng.random(), 3),
                        "bench", "1", run, start, start + 12, 1 + start // 80, 1 + start // 80,
                        "2026-01-01T00:00:00Z", f"b{n}",
                    ))  # fmt: skip
        conn.execute(
            "INSERT INTO kb_collection_readers VALUES (%s, 'closed', 'someone-else')", (org,)
        )
        conn.execute("ANALYZE graph_entities, graph_entity_aliases, graph_assertions, kb_sources")
    return time.perf_counter() - started


async def measure(store: GraphStore, org: str, seeds: list[str], **kw: int) -> list[float]:
    reader = Reader("member")
    times = []
    for seed in seeds:
        started = time.perf_counter()
        await store.search(org, reader, terms=[seed], **kw)
        times.append((time.perf_counter() - started) * 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "max_ms": round(times[-1], 1),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(7)
    org = f"gbench-{uuid.uuid4().hex[:8]}"
    with scratch_data_dir(args.data_dir) as data_dir:
        db = await Database.open(
            Settings(data_dir=data_dir, database_url=args.database_url).storage
        )
        try:
            load_s = await asyncio.to_thread(
                build, db.dsn, org, args.entities, args.assertions, rng
            )
            print(f"loaded {args.assertions} assertions among {args.entities} entities in "
                  f"{load_s:.0f} s", flush=True)  # fmt: skip
            store = GraphStore(db)
            seeds = [
                f"Entity {int(args.entities * rng.random() ** 2)}" for _ in range(args.queries)
            ]
            results: dict[str, object] = {
                "assertions": args.assertions,
                "entities": args.entities,
                "queries": args.queries,
                "load_s": round(load_s, 1),
            }
            for name, kw in (
                ("depth2_per10_max50", {"depth": 2, "per_entity": 10, "max_facts": 50}),
                ("depth1_per10_max50", {"depth": 1, "per_entity": 10, "max_facts": 50}),
            ):
                await measure(store, org, seeds[: max(20, args.queries // 4)], **kw)  # warm-up
                results[name] = summary(await measure(store, org, seeds, **kw))
                print(name, results[name], flush=True)
            return results
        finally:
            await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--assertions", type=int, default=1_000_000)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--database-url")
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    print(json.dumps(run_stoppable(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
