"""Streamed ingestion job: ``python -m jobs.ingest --org ORG --collection NAME PATH...``.

Submit it to a cluster with ``ray job submit --working-dir . -- python -m jobs.ingest ...``
(see docs/ingestion.md), or run it on one machine (it starts a local Ray when no cluster is
reachable; ``cortex-ray ingest`` does exactly that). It lists the files under each PATH,
opens a BUILDING generation of the collection, runs the Ray Data pipeline of
``jobs._pipeline`` (check → register → split → write, sections embedded eagerly), records
sources that disappeared, publishes the generation atomically and collects garbage. If the
run fails before publishing, the previous publication keeps serving.

The report (counts: files read, skipped by reason, unchanged, sections, passages, bytes) is
printed as one JSON object on stdout; progress goes to stderr (a progress bar on a terminal,
a line every few seconds otherwise, e.g. in ``ray job logs``). Exit codes: 0 published,
1 a configuration or storage error, 2 invalid arguments.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import ValidationError

from actors import install_ray_metrics
from cortex_ray import (
    CortexError,
    IngestJobOptions,
    Interrupted,
    InvalidRequestError,
    Settings,
    load_settings,
    stop_on_signals,
)
from cortex_ray.graph import DETERMINISTIC, EXTRACTOR_VERSION, GraphWriter
from cortex_ray.knowledge import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_PASSAGE_BYTES,
    Generation,
    KnowledgeWriter,
    ListedFile,
    list_files,
)
from cortex_ray.observability import (
    Tracing,
    context_of,
    metrics,
    outgoing_traceparent,
    tracer,
)
from cortex_ray.storage import EmbeddedPostgres, migrate
from jobs._pipeline import (
    ROW_SCHEMA,
    IngestOptions,
    SectionWriter,
    SourceFilesDatasource,
    extract_graph,
    plan_units,
    unit_size,
)
from jobs._ray import join_or_start_ray

__all__ = ["GraphOnlyReport", "IngestReport", "Progress", "main", "run_graph_only", "run_ingest"]

log = logging.getLogger("cortex_ray.jobs.ingest")


def job_default(name: str) -> Any:
    """The default of a job option: the setting ``CORTEX_INGEST__<NAME>``'s own default
    (``Settings.ingest``), so that the flags, ``run_ingest`` and the settings agree."""
    return IngestJobOptions.model_fields[name].default


def job_options(
    settings: Settings, flag_names: Mapping[str, str] | None = None, **flags: Any
) -> IngestJobOptions:
    """``settings.ingest`` with the flags that were given (not ``None``) put over it,
    validated by the same model (so a flag obeys the setting's limits). ``flag_names`` names
    the flag of a setting whose flag is not its name in kebab case.

    Raises:
        InvalidRequestError: A flag is out of range; the message names it.
    """
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        return IngestJobOptions.model_validate({**settings.ingest.model_dump(), **given})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0])
        flag = (flag_names or {}).get(field) or "--" + field.replace("_", "-")
        raise InvalidRequestError(f"invalid option {flag}: {first['msg']}") from None


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


def _configure_ray_data(show_ray_progress: bool, object_store_budget_bytes: int) -> None:
    from ray.data import DataContext, ExecutionResources

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = show_ray_progress
    # Ray Data may keep this much of its output in the object store before it pauses the
    # read tasks (its own budget is a share of the store: gigabytes on a big machine).
    ctx.execution_options.resource_limits = ExecutionResources(
        object_store_memory=object_store_budget_bytes
    )


def _bulk_dsn(dsn: str) -> str:
    """The read tasks' DSN: their commits do not wait for the WAL flush.

    Safe for this protocol: nothing is served until ``publish``, which commits synchronously
    from the driver's own connection; its flush makes every earlier commit durable too (the
    WAL is sequential), and a crash before it leaves an unpublished generation that a rerun
    redoes. Without it each file's four small transactions each wait for an fsync.
    """
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c synchronous_commit=off".strip()
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def run_ingest(
    org: str,
    collection: str,
    paths: Sequence[Path],
    *,
    dsn: str | None,
    embed: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    max_passage_bytes: int = DEFAULT_MAX_PASSAGE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    unit_bytes: int | None = None,
    show_ray_progress: bool = False,
    object_store_budget_bytes: int = job_default("object_store_budget_bytes"),
    graph: bool = job_default("graph"),
) -> IngestReport:
    """Ingest ``paths`` into ``org``/``collection`` on the Ray that is initialised (or a
    local one); publishes a new generation and returns the report.

    ``dsn=None`` is a dry run: files are checked and split, nothing is written (no database).
    The defaults are those of ``Settings.ingest`` (the command line passes its values).

    The job is one trace: an ``ingest {collection}`` span (under ``TRACEPARENT`` from the
    environment, if set: a CI pipeline's or a scheduler's), with a span per read task and
    per section batch beneath it (``jobs._spans``); its id is the report's ``trace_id``.
    Spans go where the settings send them (``OTEL_EXPORTER_OTLP_*``, else the local span
    store of this database), or nowhere when tracing is off.
    """
    opened = None if tracer.recording or not dsn else Tracing.for_process(dsn)
    try:
        with tracer.start_as_current_span(
            f"ingest {collection}",
            attributes={"cortex.org_id": org, "cortex.collection": collection},
            context=context_of(os.environ.get("TRACEPARENT")),
        ) as span:
            report = _ingest(
                org,
                collection,
                paths,
                dsn=dsn,
                embed=embed,
                on_progress=on_progress,
                max_passage_bytes=max_passage_bytes,
                max_line_bytes=max_line_bytes,
                unit_bytes=unit_bytes,
                show_ray_progress=show_ray_progress,
                object_store_budget_bytes=object_store_budget_bytes,
                traceparent=outgoing_traceparent(),
                graph=graph,
            )
            if span.get_span_context().is_valid:
                report.trace_id = format(span.get_span_context().trace_id, "032x")
                span.set_attribute("cortex.generation", report.generation)
                span.set_attribute("cortex.files", report.files)
                span.set_attribute("cortex.passages", report.passages)
                span.set_attribute("cortex.failed", report.failed)
            return report
    finally:
        if opened is not None:
            opened.close()  # flushes the job's spans


def _ingest(
    org: str,
    collection: str,
    paths: Sequence[Path],
    *,
    dsn: str | None,
    embed: bool,
    on_progress: Callable[[Progress], None] | None,
    max_passage_bytes: int,
    max_line_bytes: int,
    unit_bytes: int | None,
    show_ray_progress: bool,
    object_store_budget_bytes: int,
    traceparent: str | None,
    graph: bool = False,
) -> IngestReport:
    import ray

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise InvalidRequestError(f"no such file or folder: {', '.join(missing)}")
    if not ray.is_initialized():
        ray.init()
    install_ray_metrics()  # the driver counts files, bytes and passages as they are done
    started = time.perf_counter()
    files: list[ListedFile] = list(list_files(paths))
    progress = Progress(total_files=len(files), total_bytes=sum(f.size for f in files))
    writer = KnowledgeWriter(dsn) if dsn else None
    with writer or contextlib.nullcontext():
        generation = (
            writer.begin_generation(org, collection)
            if writer
            else Generation(org_id=org, collection=collection, id=0)
        )
        report = IngestReport(org, collection, generation.id, files=len(files))
        report.bytes = progress.total_bytes
        options = IngestOptions(
            dsn=_bulk_dsn(dsn) if dsn else None,
            generation=generation,
            embed=embed,
            max_passage_bytes=max_passage_bytes,
            max_line_bytes=max_line_bytes,
            traceparent=traceparent,
        )
        _configure_ray_data(show_ray_progress, object_store_budget_bytes)
        if unit_bytes is None:
            cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
            unit_bytes = unit_size(progress.total_bytes, cpus)
        units = plan_units(files, unit_bytes=unit_bytes)
        # One block stream per unit: without the override Ray Data would split each read
        # task's output to reach its default parallelism (pointless for these small rows).
        ds = ray.data.read_datasource(
            SourceFilesDatasource(units, options), override_num_blocks=max(len(units), 1)
        )
        if embed and dsn:
            ds = ds.map_batches(
                SectionWriter,
                fn_constructor_kwargs={
                    "dsn": dsn,
                    "generation": generation,
                    "traceparent": traceparent,
                },
                batch_size=None,
                batch_format="pyarrow",
                concurrency=1,
                # It mostly waits for blocks; reserving a CPU would starve the read tasks on
                # a one-CPU cluster.
                num_cpus=0,
            )
        graph_writer = GraphWriter(dsn) if graph and dsn else None
        if graph_writer is not None:
            # The context graph's extraction run; the stage follows the file rows of written
            # versions (docs/graph.md).
            run_id = graph_writer.begin_run(org, collection=collection, generation=generation.id)
            report.graph = {"run": run_id, "files": 0, "assertions": 0, "changed": 0}
            ds = ds.map_batches(
                extract_graph,
                fn_kwargs={
                    "dsn": _bulk_dsn(dsn),  # type: ignore[arg-type]
                    "org_id": org,
                    "run_id": run_id,
                    "traceparent": traceparent,
                },
                batch_size=None,
                batch_format="pyarrow",
            )
        skipped: Counter[str] = Counter()
        in_progress: dict[str, int] = {}
        report.phases["list"] = round(time.perf_counter() - started, 3)
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                assert isinstance(batch, pa.Table)
                for row in batch.to_pylist():
                    _count(row, report, skipped, progress, in_progress)
                if on_progress is not None:
                    on_progress(progress)
        except BaseException as exc:
            if graph_writer is not None and report.graph is not None:
                graph_writer.finish_run(org, report.graph["run"], failed=repr(exc)[:500])
                graph_writer.close()
            raise
        if graph_writer is not None and report.graph is not None:
            graph_writer.finish_run(org, report.graph["run"])
            graph_writer.close()
        report.skipped = dict(sorted(skipped.items()))
        report.phases["pipeline"] = round(time.perf_counter() - started, 3) - report.phases["list"]
        if writer is not None:
            report.disappeared = writer.mark_disappeared(generation, [f.key for f in files])
            report.published = writer.publish(generation).model_dump()
            writer.collect_garbage(org, collection)
    report.seconds = round(time.perf_counter() - started, 3)
    report.phases["publish"] = round(
        report.seconds - report.phases["list"] - report.phases["pipeline"], 3
    )
    return report


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
                    fn_kwargs={"dsn": _bulk_dsn(dsn), "org_id": org, "run_id": run},
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


def _count(
    row: dict[str, Any],
    report: IngestReport,
    skipped: Counter[str],
    progress: Progress,
    in_progress: dict[str, int],
) -> None:
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


# command line ----------------------------------------------------------------------------


def _shown_default(name: str) -> str:
    """What ``--help`` shows as a flag's default: the setting it comes from."""
    variable = f"CORTEX_INGEST__{name.upper()}"
    default = job_default(name)
    return f"{variable}, else {default}" if default is not None else f"{variable}, else unset"


def _resolve_dsn(
    database_url: str | None, settings: Settings
) -> tuple[str, EmbeddedPostgres | None]:
    """The DSN to use, and the embedded server this process started (to stop at the end)."""
    url = database_url or settings.storage.database_url
    if url:
        return url, None
    embedded = EmbeddedPostgres(settings.storage.data_dir / "pg")
    return embedded.dsn, embedded


class _Reporter:
    """Progress to stderr: a rich bar on a terminal, a plain line every few seconds otherwise
    (``ray job logs``, CI)."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console

        self._console = Console(stderr=True)
        self._enabled = enabled
        self._bar: Any = None
        self._task: Any = None
        self._last = 0.0

    def __enter__(self) -> _Reporter:
        if self._enabled and self._console.is_terminal:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            from rich.progress import Progress as Bar

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


def main(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to ingest.")],
    org: Annotated[str, typer.Option("--org", help="The organisation.")],
    collection: Annotated[str, typer.Option("--collection", help="The collection's name.")],
    address: Annotated[
        str | None,
        typer.Option("--address", help="Ray address (default: the job's cluster, or a local Ray)."),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="PostgreSQL DSN (default CORTEX_DATABASE_URL, else the embedded server).",
        ),
    ] = None,
    # Unset flags take Settings.ingest (CORTEX_INGEST__<NAME>, else its default).
    embed: Annotated[
        bool | None,
        typer.Option(
            "--embed/--no-embed",
            help="Embed section summaries (MiniLM).",
            show_default=_shown_default("embed"),
        ),
    ] = None,
    graph: Annotated[
        bool | None,
        typer.Option(
            "--graph/--no-graph",
            help="Extract the context graph's facts from written versions (docs/graph.md).",
            show_default=_shown_default("graph"),
        ),
    ] = None,
    max_passage_bytes: Annotated[
        int | None, typer.Option(show_default=_shown_default("max_passage_bytes"))
    ] = None,
    max_line_bytes: Annotated[
        int | None, typer.Option(show_default=_shown_default("max_line_bytes"))
    ] = None,
    num_cpus: Annotated[
        int | None,
        typer.Option(
            "--num-cpus",
            help="CPUs of a local Ray started here.",
            show_default=_shown_default("num_cpus"),
        ),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and split only: no database, no writes.")
    ] = False,
    graph_only: Annotated[
        bool,
        typer.Option(
            "--graph-only",
            help="Only extract the graph's facts from the published versions not extracted yet "
            "(their files under PATHS); nothing is ingested.",
        ),
    ] = False,
) -> None:
    """Ingest PATHS into a collection: stream, split, write, publish."""
    import ray

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        typer.echo(f"error: no such file or folder: {', '.join(missing)}", err=True)
        raise typer.Exit(2)
    try:
        settings = load_settings()
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        job = job_options(
            settings,
            embed=embed,
            graph=graph,
            max_passage_bytes=max_passage_bytes,
            max_line_bytes=max_line_bytes,
            num_cpus=num_cpus,
        )
    except InvalidRequestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if graph_only and dry_run:
        typer.echo("error: --graph-only writes facts; it does not go with --dry-run", err=True)
        raise typer.Exit(2)
    try:
        dsn, embedded = (None, None) if dry_run else _resolve_dsn(database_url, settings)
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    started_ray = False
    try:
        if dsn:
            migrate(dsn)
        started_ray = join_or_start_ray(address, settings.storage.data_dir, num_cpus=job.num_cpus)
        if graph_only:
            assert dsn is not None
            report: IngestReport | GraphOnlyReport = run_graph_only(org, collection, paths, dsn=dsn)
        else:
            with _Reporter(progress) as reporter:
                report = run_ingest(
                    org,
                    collection,
                    paths,
                    dsn=dsn,
                    embed=job.embed,
                    on_progress=reporter,
                    max_passage_bytes=job.max_passage_bytes,
                    max_line_bytes=job.max_line_bytes,
                    object_store_budget_bytes=job.object_store_budget_bytes,
                    graph=job.graph,
                )
    except InvalidRequestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except Interrupted as exc:
        # The generation in progress stays unpublished: the previous one keeps serving.
        typer.echo(f"interrupted by {exc}: nothing was published", err=True)
        raise typer.Exit(exc.exit_code) from None
    finally:
        if started_ray:
            ray.shutdown()
        if embedded is not None:
            embedded.stop()
    sys.stdout.write(report.to_json() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
