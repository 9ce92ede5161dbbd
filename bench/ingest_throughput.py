"""Ingestion throughput (issue 5): the lexical tier on Ray Data vs a single-process baseline.

OURS      ``jobs.ingest.run_ingest`` with ``embed=False`` (the lexical tier: passages, their
          BM25 postings and the sections, without vectors) on a fresh local Ray started with
          1 CPU, then with 2 CPUs; each run into a new collection, so every file is new. Timed
          from the call to the published generation: listing, the checking pass (SHA-256,
          UTF-8), the source registry and health events, splitting, writing, publishing.
          Starting Ray is not included (printed apart).
BASELINE  the simplest program doing the same work in one process: for each file with a
          supported extension, read it whole, split it with the same splitter, count terms
          with the same tokeniser, and COPY sections, passages and postings (with the same
          BM25 impacts) into tables equivalent to the store's (same columns, same indexes),
          committing every ~5,000 passages. No registry, no hashing, no health events.
          Its tables have the store's foreign keys too (each postings row is checked against
          its passage): ``--no-foreign-keys`` measures it without them. It writes into
          indexed tables, as the simplest program would; the job's first load of a
          collection stages its postings and builds their indexes at publish
          (docs/knowledge.md, "Bulk loads"), which is most of its lead.

Runs: baseline, ours on 1 CPU, ours on 2 CPUs, baseline again (the machine may be shared:
the two baseline runs show the drift). Targets: ours(1 CPU) ≥ 0.8× the baseline's MB/s,
ours(2 CPUs) ≥ 1.5×, against the mean of the two baseline runs.

Corpus: a folder of text, e.g. the Linux kernel's Documentation/ (docs/ingestion.md has the
commands). Run: ``.venv/bin/python bench/ingest_throughput.py DIR [--cpus 1,2] [--check]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench._scratch import scratch_data_dir
from cortex_ray import reclaim_signals, run_main
from cortex_ray.knowledge import (
    SplitPassage,
    detect_format,
    list_files,
    split_stream,
    term_counts,
    tf_factor,
)
from cortex_ray.storage import EmbeddedPostgres, migrate

MB = 1 << 20

# Tables equivalent to kb_source_versions / kb_sections / kb_passages / kb_postings
# (migrations 0004, 0005): the same columns, indexes and foreign keys (a postings row is
# checked against its passage, as in the store), postings partitioned by collection (one
# partition here, COPYed through the parent), ids assigned by the program so that postings
# can be copied without a round trip. ``--no-foreign-keys`` leaves the foreign keys out.
BASELINE_DDL = """
DROP SCHEMA IF EXISTS bench_ingest CASCADE;
CREATE SCHEMA bench_ingest;
CREATE TABLE bench_ingest.versions (
    org_id text NOT NULL, source_id uuid NOT NULL, version integer NOT NULL,
    PRIMARY KEY (org_id, source_id, version));
CREATE TABLE bench_ingest.sections (
    org_id text NOT NULL, id bigint NOT NULL, source_id uuid NOT NULL, version integer NOT NULL,
    ordinal integer NOT NULL, collection text NOT NULL, heading_path text[] NOT NULL,
    line_start integer NOT NULL, line_end integer NOT NULL, byte_start bigint NOT NULL,
    byte_end bigint NOT NULL, summary_text text NOT NULL, embedding halfvec(384),
    PRIMARY KEY (org_id, id), UNIQUE (org_id, source_id, version, ordinal));
CREATE INDEX ON bench_ingest.sections USING hnsw (embedding halfvec_cosine_ops);
CREATE TABLE bench_ingest.passages (
    org_id text NOT NULL, id bigint NOT NULL, source_id uuid NOT NULL, version integer NOT NULL,
    ordinal integer NOT NULL, section_ordinal integer NOT NULL, collection text NOT NULL,
    collection_id bigint NOT NULL,
    text text NOT NULL, line_start integer NOT NULL, line_end integer NOT NULL,
    byte_start bigint NOT NULL, byte_end bigint NOT NULL, length integer NOT NULL,
    embedding halfvec(384),
    PRIMARY KEY (org_id, id), UNIQUE (org_id, source_id, version, ordinal),
    UNIQUE (collection_id, id));
CREATE INDEX ON bench_ingest.passages (org_id, source_id, version, section_ordinal);
CREATE INDEX ON bench_ingest.passages USING hnsw (embedding halfvec_cosine_ops);
CREATE INDEX ON bench_ingest.passages (org_id, collection, id) WHERE embedding IS NULL;
CREATE TABLE bench_ingest.postings (
    org_id text NOT NULL, collection_id bigint NOT NULL, passage_id bigint NOT NULL,
    term text NOT NULL, tf integer NOT NULL, impact real NOT NULL,
    PRIMARY KEY (collection_id, passage_id, term)) PARTITION BY LIST (collection_id);
CREATE INDEX ON bench_ingest.postings (collection_id, term, impact DESC) INCLUDE (passage_id);
CREATE TABLE bench_ingest.postings_1 PARTITION OF bench_ingest.postings FOR VALUES IN (1);
"""
FOREIGN_KEYS_DDL = """
ALTER TABLE bench_ingest.sections ADD FOREIGN KEY (org_id, source_id, version)
    REFERENCES bench_ingest.versions ON DELETE CASCADE;
ALTER TABLE bench_ingest.passages ADD FOREIGN KEY (org_id, source_id, version)
    REFERENCES bench_ingest.versions ON DELETE CASCADE;
ALTER TABLE bench_ingest.postings ADD FOREIGN KEY (collection_id, passage_id)
    REFERENCES bench_ingest.passages (collection_id, id) ON DELETE CASCADE;
"""
AVGDL = 100.0  # what the store uses for a collection's first generation
COLLECTION_ID = 1  # the baseline's one collection: its postings partition


def baseline(dsn: str, root: Path, foreign_keys: bool = True) -> tuple[float, int, int]:
    """(seconds, bytes split, passages)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BASELINE_DDL)
        if foreign_keys:
            conn.execute(FOREIGN_KEYS_DDL)
    started = time.perf_counter()
    org, collection = "bench", "baseline"
    versions: list[tuple[object, ...]] = []
    sections: list[tuple[object, ...]] = []
    passages: list[tuple[object, ...]] = []
    postings: list[tuple[object, ...]] = []
    next_id = 0
    total_bytes = total_passages = 0
    with psycopg.connect(dsn) as conn:

        def flush() -> None:
            with conn.cursor() as cur:
                for table, columns, rows in (
                    ("versions", "org_id, source_id, version", versions),
                    (
                        "sections",
                        "org_id, id, source_id, version, ordinal, collection, "
                        "heading_path, line_start, line_end, byte_start, byte_end, summary_text",
                        sections,
                    ),
                    (
                        "passages",
                        "org_id, id, source_id, version, ordinal, section_ordinal, "
                        "collection, collection_id, text, line_start, line_end, byte_start, "
                        "byte_end, length",
                        passages,
                    ),
                    ("postings", "org_id, collection_id, passage_id, term, tf, impact", postings),
                ):
                    with cur.copy(f"COPY bench_ingest.{table} ({columns}) FROM STDIN") as copy:
                        for row in rows:
                            copy.write_row(row)
            conn.commit()
            versions.clear()
            sections.clear()
            passages.clear()
            postings.clear()

        for f in list_files([root]):
            fmt = detect_format(Path(f.path))
            if fmt is None:
                continue
            data = Path(f.path).read_bytes()
            if not data:
                continue
            source = uuid.uuid4()
            versions.append((org, source, 1))
            total_bytes += len(data)
            for r in split_stream([data], fmt):
                next_id += 1
                span = r.span
                if isinstance(r, SplitPassage):
                    text = r.text.replace("\x00", "\ufffd")
                    tf, length = term_counts(text)
                    passages.append(
                        (
                            org,
                            next_id,
                            source,
                            1,
                            r.ordinal,
                            r.section_ordinal,
                            collection,
                            COLLECTION_ID,
                            text,
                            span.line_start,
                            span.line_end,
                            span.byte_start,
                            span.byte_end,
                            length,
                        )
                    )
                    postings.extend(
                        (org, COLLECTION_ID, next_id, term, n, tf_factor(n, length, AVGDL))
                        for term, n in tf.items()
                    )
                    total_passages += 1
                else:
                    sections.append(
                        (
                            org,
                            next_id,
                            source,
                            1,
                            r.ordinal,
                            collection,
                            list(r.heading_path),
                            span.line_start,
                            span.line_end,
                            span.byte_start,
                            span.byte_end,
                            r.summary_text,
                        )
                    )
            if len(passages) >= 5000:
                flush()
        flush()
    return time.perf_counter() - started, total_bytes, total_passages


def ours(dsn: str, root: Path, cpus: int) -> tuple[float, float, int, int]:
    """(seconds, Ray start-up seconds, bytes split, passages)."""
    import ray

    from jobs.ingest import run_ingest

    t0 = time.perf_counter()
    # Ray runs its workers at nice 15 by default; the baseline runs at nice 0. On a shared
    # machine that alone starves the workers, so start them at the baseline's priority.
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 (Ray reads this exact name)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    startup = time.perf_counter() - t0
    try:
        report = run_ingest(
            "bench", f"ours-{cpus}cpu-{uuid.uuid4().hex[:6]}", [root], dsn=dsn, embed=False,
            graph=False,  # the lexical tier alone; bench/graph_extraction_cost.py adds the graph
        )  # fmt: skip
    finally:
        ray.shutdown()
    if report.failed:
        print(f"  note: {report.failed} read failures: {report.failures[:3]}")
    return report.seconds, startup, report.bytes_read, report.passages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--cpus", default="1,2", help="Ray CPU counts to measure")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--no-foreign-keys", action="store_true", help="baseline tables without foreign keys"
    )
    args = parser.parse_args()
    fks = not args.no_foreign_keys
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = list(list_files([args.corpus]))
    print(
        f"Ingestion throughput, lexical tier: {args.corpus} ({len(files)} files, "
        f"{sum(f.size for f in files) / MB:.1f} MiB on disk)"
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at start"
    )
    with scratch_data_dir(args.data_dir) as data_dir:
        embedded = None
        dsn = args.database_url
        if dsn is None:
            embedded = EmbeddedPostgres(data_dir / "pg")
            dsn = embedded.dsn
        try:
            migrate(dsn)
            rows: list[tuple[str, float, int, int, str]] = []
            secs, nbytes, npass = baseline(dsn, args.corpus, fks)
            rows.append(("baseline (1 process)", secs, nbytes, npass, ""))
            print(f"  baseline done: {secs:.1f} s", flush=True)
            for cpus in [int(c) for c in args.cpus.split(",")]:
                secs, startup, nbytes, npass = ours(dsn, args.corpus, cpus)
                rows.append(
                    (
                        f"cortex-ray job, {cpus} CPU",
                        secs,
                        nbytes,
                        npass,
                        f"(+{startup:.1f} s ray.init)",
                    )
                )
                print(f"  {cpus} CPU done: {secs:.1f} s", flush=True)
            secs, nbytes, npass = baseline(dsn, args.corpus, fks)
            rows.append(("baseline again", secs, nbytes, npass, ""))
        finally:
            if embedded is not None:
                embedded.stop()
    print()
    print(f"{'run':<26} {'seconds':>8} {'MiB':>7} {'MiB/s':>7} {'passages':>9} {'passages/s':>10}")
    for name, secs, nbytes, npass, note in rows:
        print(
            f"{name:<26} {secs:8.1f} {nbytes / MB:7.1f} {nbytes / MB / secs:7.2f} {npass:9d} "
            f"{npass / secs:10.0f} {note}"
        )
    base_rate = (rows[0][2] / rows[0][1] + rows[-1][2] / rows[-1][1]) / 2
    print()
    failed = False
    targets = {1: 0.8, 2: 1.5}
    for name, secs, nbytes, _, _ in rows[1:-1]:
        cpus = int(name.split(", ")[1].split()[0])
        ratio = nbytes / secs / base_rate
        target = targets.get(cpus)
        verdict = "" if target is None else ("PASS" if ratio >= target else "FAIL")
        failed |= verdict == "FAIL"
        shown = f"target >= {target}x" if target else ""
        print(
            f"ratio {cpus} CPU / baseline (mean of both runs): {ratio:.2f}x   {shown}   {verdict}"
        )
    if args.check and failed:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(run_main(main))
