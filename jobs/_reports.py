"""What the ingestion job reports: its progress as it goes (to stderr: a bar on a terminal,
a line every few seconds otherwise) and its outcome (one JSON object on stdout), tallied
from the rows the pipeline yields."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as Bar

from cortex_ray.observability import metrics

__all__ = ["GraphOnlyReport", "IngestReport", "Progress", "ProgressReporter", "count_row"]


@dataclass
class Progress:
    """What the driver knows so far; handed to the progress callback after every block."""

    total_files: int
    total_bytes: int
    files: int = 0
    bytes: int = 0
    passages: int = 0


@dataclass
class IngestReport:
    """The outcome of one run: counts, the generation and what publishing reported."""

    org: str
    collection: str
    generation: int
    files: int = 0  # every file listed under the roots
    bytes: int = 0  # their total size
    read: int = 0  # split and written (new content)
    unchanged: int = 0  # same content hash as the published version: carried forward
    skipped: dict[str, int] = field(default_factory=dict)  # by reason (not sources, bad input)
    failed: int = 0  # read failures (health READ_FAILURE)
    kept: int = 0  # of those, files whose published version stays served
    sections: int = 0
    passages: int = 0
    bytes_read: int = 0  # size of the files split
    disappeared: list[str] = field(default_factory=list)
    published: dict[str, Any] | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)  # (path, why), first 50
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds: list, pipeline, publish
    trace_id: str | None = None  # the job's trace (its ``ingest`` span and every task's)
    # The context graph's extraction run: {"run": id, "files": n, "assertions": n,
    # "changed": n}, or None when the stage was off (docs/graph.md).
    graph: dict[str, int] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)


@dataclass
class GraphOnlyReport:
    """The outcome of a ``--graph-only`` pass (docs/graph.md)."""

    org: str
    collection: str
    run: int
    published: int = 0  # published versions the rule-based extractor had not extracted yet
    files: int = 0  # of those, found under the paths and extracted
    assertions: int = 0  # facts found in them
    changed: list[str] = field(default_factory=list)  # on disk, not the published content
    not_found: list[str] = field(default_factory=list)  # published, not under the paths
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)


def count_row(
    row: dict[str, Any],
    report: IngestReport,
    skipped: Counter[str],
    progress: Progress,
    in_progress: dict[str, int],
) -> None:
    """Tally one row of the pipeline's output into the report and the progress."""
    kind = row["kind"]
    if kind == "graph" and report.graph is not None:
        report.graph["files"] += 1
        report.graph["assertions"] += row["assertions"] or 0
        if row["status"] != "extracted":
            report.graph["changed"] += 1
        return
    if kind == "progress":
        in_progress[row["key"]] = in_progress.get(row["key"], 0) + row["bytes"]
        progress.bytes += row["bytes"]
        return
    if kind != "file":
        return
    status = row["status"]
    progress.files += 1
    progress.bytes += row["bytes"] - in_progress.pop(row["key"], 0)
    org, collection = report.org, report.collection
    metrics.record(metrics.INGEST_FILES, org=org, collection=collection, outcome=status)
    if status == "written":
        metrics.record(metrics.INGEST_BYTES, row["bytes"], org=org, collection=collection)
        metrics.record(metrics.INGEST_PASSAGES, row["passages"], org=org, collection=collection)
        report.read += 1
        report.bytes_read += row["bytes"]
        report.sections += row["sections"]
        report.passages += row["passages"]
        progress.passages += row["passages"]
    elif status == "unchanged":
        report.unchanged += 1
    elif status == "skipped":
        skipped[row["reason"]] += 1
    else:
        report.failed += 1
        reason = row["reason"]
        if row["version"] is not None:
            report.kept += 1
            reason = f"{reason} (published version {row['version']} kept)"
        if len(report.failures) < 50:
            report.failures.append((row["key"], reason))


class ProgressReporter:
    """Progress to stderr: a rich bar on a terminal, a plain line every few seconds otherwise
    (``ray job logs``, CI)."""

    def __init__(self, enabled: bool) -> None:
        self._console = Console(stderr=True)
        self._enabled = enabled
        self._bar: Any = None
        self._task: Any = None
        self._last = 0.0

    def __enter__(self) -> ProgressReporter:
        if self._enabled and self._console.is_terminal:
            self._bar = Bar(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("{task.fields[files]}"),
                TimeRemainingColumn(),
                console=self._console,
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def __call__(self, p: Progress) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task("ingesting", total=p.total_bytes, files="")
            self._bar.update(
                self._task,
                completed=p.bytes,
                description=f"{p.passages} passages",
                files=f"{p.files}/{p.total_files} files",
            )
            return
        now = time.monotonic()
        if now - self._last >= 5 or p.files == p.total_files:
            self._last = now
            self._console.print(
                f"ingest: {p.bytes / 1e6:.1f}/{p.total_bytes / 1e6:.1f} MB, "
                f"{p.files}/{p.total_files} files, {p.passages} passages",
                highlight=False,
            )
