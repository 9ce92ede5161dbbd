"""``python -m jobs.ingest --graph-only``: the rule-based graph extractor over a collection's
published versions not extracted yet, without ingesting (docs/graph.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from cortex_ray import InvalidRequestError
from cortex_ray.graph import DETERMINISTIC, EXTRACTOR_VERSION, GraphWriter
from cortex_ray.knowledge import list_files
from jobs._entry import bulk_dsn
from jobs._pipeline import ROW_SCHEMA, extract_graph
from jobs._reports import GraphOnlyReport

__all__ = ["run_graph_only"]


def run_graph_only(
    org: str, collection: str, paths: Sequence[Path], *, dsn: str
) -> GraphOnlyReport:
    """The deterministic extractor over the collection's published versions that it has
    not extracted (``rules-N``), without ingesting: each version's file is found under
    ``paths`` by its registry key and read again (its content hash must be the version's),
    on Ray Data tasks, the ingestion's ``extract_graph`` stage. Idempotent: an extracted
    version is in the ledger and skipped next time, and a fact is never written twice.
    A file that changed since is reported, not extracted (the next ingestion extracts it)."""
    import ray

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise InvalidRequestError(f"no such file or folder: {', '.join(missing)}")
    started = time.perf_counter()
    on_disk = {f.key: f for f in list_files(paths)}
    with GraphWriter(dsn) as writer:
        todo = writer.published_versions(
            org, collection=collection, method=DETERMINISTIC, method_version=EXTRACTOR_VERSION
        )
        run = writer.begin_run(org, collection=collection)
        report = GraphOnlyReport(org, collection, run, published=len(todo))
        report.not_found = [v.key for v in todo if v.key not in on_disk]
        rows = [
            {"kind": "file", "key": v.key, "status": "written", "source_id": v.source_id,
             "version": v.version, "path": on_disk[v.key].path}
            for v in todo
            if v.key in on_disk
        ]  # fmt: skip
        try:
            if rows:
                if not ray.is_initialized():
                    ray.init()
                table = pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
                blocks = max(1, min(len(rows) // 64, 64))  # tasks of about 64 files
                # (map_batches is typed for plain callables; extract_graph takes keywords)
                ds: Any = ray.data.from_arrow(table).repartition(blocks)
                ds = ds.map_batches(
                    extract_graph,
                    fn_kwargs={"dsn": bulk_dsn(dsn), "org_id": org, "run_id": run},
                    batch_size=None,
                    batch_format="pyarrow",
                )
                for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                    assert isinstance(batch, pa.Table)
                    for row in batch.to_pylist():
                        if row["kind"] != "graph":
                            continue
                        if row["status"] == "extracted":
                            report.files += 1
                            report.assertions += row["assertions"] or 0
                        else:
                            report.changed.append(row["key"])
        except BaseException as exc:
            writer.finish_run(org, run, failed=repr(exc)[:500])
            raise
        writer.finish_run(org, run)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
