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
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from actors import install_ray_metrics
from cortex_ray import InvalidRequestError, stop_on_signals
from cortex_ray.graph import GraphWriter
from cortex_ray.knowledge import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_PASSAGE_BYTES,
    Generation,
    KnowledgeWriter,
    ListedFile,
    list_files,
)
from cortex_ray.observability import Tracing, context_of, outgoing_traceparent, tracer
from jobs._entry import (
    EXIT_INVALID,
    bulk_dsn,
    fail,
    job_default,
    job_options,
    job_settings,
    run_job,
    shown_default,
)
from jobs._graph_only import run_graph_only
from jobs._pipeline import (
    IngestOptions,
    SectionWriter,
    SourceFilesDatasource,
    extract_graph,
    plan_units,
    unit_size,
)
from jobs._reports import GraphOnlyReport, IngestReport, Progress, ProgressReporter, count_row
from jobs._resources import ResourceWatch, fit_tasks

__all__ = ["GraphOnlyReport", "IngestReport", "Progress", "main", "run_graph_only", "run_ingest"]

log = logging.getLogger("cortex_ray.jobs.ingest")


def _configure_ray_data(show_ray_progress: bool, object_store_budget_bytes: int) -> None:
    from ray.data import DataContext, ExecutionResources

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = show_ray_progress
    # Ray Data may keep this much of its output in the object store before it pauses the
    # read tasks (its own budget is a share of the store: gigabytes on a big machine).
    ctx.execution_options.resource_limits = ExecutionResources(
        object_store_memory=object_store_budget_bytes
    )


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
            dsn=bulk_dsn(dsn) if dsn else None,
            generation=generation,
            embed=embed,
            max_passage_bytes=max_passage_bytes,
            max_line_bytes=max_line_bytes,
            traceparent=traceparent,
        )
        _configure_ray_data(show_ray_progress, object_store_budget_bytes)
        # Beside the local stack (which reserves CPUs) the task stages ask only what is
        # free, or they would wait forever for a whole CPU each (jobs._resources).
        fit = fit_tasks(
            _cpus(ray.available_resources()),  # type: ignore[no-untyped-call]
            _cpus(ray.cluster_resources()),  # type: ignore[no-untyped-call]
            stages=2 if graph and dsn else 1,
        )
        if fit.fitted:
            print(f"ingest: the tasks fit beside the cluster's others: {fit.describe()}",
                  file=sys.stderr, flush=True)  # fmt: skip
        if unit_bytes is None:
            cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
            unit_bytes = unit_size(progress.total_bytes, cpus)
        units = plan_units(files, unit_bytes=unit_bytes)
        # One block stream per unit: without the override Ray Data would split each read
        # task's output to reach its default parallelism (pointless for these small rows).
        ds = ray.data.read_datasource(
            SourceFilesDatasource(units, options),
            override_num_blocks=max(len(units), 1),
            num_cpus=fit.num_cpus,
            compute=ray.data.TaskPoolStrategy(size=fit.concurrency),
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
                compute=ray.data.ActorPoolStrategy(size=1),  # (`concurrency` is deprecated)
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
                    "dsn": bulk_dsn(dsn),  # type: ignore[arg-type]
                    "org_id": org,
                    "run_id": run_id,
                    "traceparent": traceparent,
                },
                batch_size=None,
                batch_format="pyarrow",
                num_cpus=fit.num_cpus,
                compute=ray.data.TaskPoolStrategy(size=fit.concurrency),
            )
        skipped: Counter[str] = Counter()
        in_progress: dict[str, int] = {}
        report.phases["list"] = round(time.perf_counter() - started, 3)
        try:
            with ResourceWatch("ingest", fit.num_cpus) as watch:
                for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                    watch.progressed()
                    assert isinstance(batch, pa.Table)
                    for row in batch.to_pylist():
                        count_row(row, report, skipped, progress, in_progress)
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


def _cpus(resources: dict[str, Any]) -> float:
    return float(resources.get("CPU", 0.0))


# command line ----------------------------------------------------------------------------


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
            show_default=shown_default("embed"),
        ),
    ] = None,
    graph: Annotated[
        bool | None,
        typer.Option(
            "--graph/--no-graph",
            help="Extract the context graph's facts from written versions (docs/graph.md).",
            show_default=shown_default("graph"),
        ),
    ] = None,
    max_passage_bytes: Annotated[
        int | None, typer.Option(show_default=shown_default("max_passage_bytes"))
    ] = None,
    max_line_bytes: Annotated[
        int | None, typer.Option(show_default=shown_default("max_line_bytes"))
    ] = None,
    num_cpus: Annotated[
        int | None,
        typer.Option(
            "--num-cpus",
            help="CPUs of a local Ray started here.",
            show_default=shown_default("num_cpus"),
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
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        fail(f"no such file or folder: {', '.join(missing)}", EXIT_INVALID)
    settings = job_settings()
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
        fail(str(exc), EXIT_INVALID)
    if graph_only and dry_run:
        fail("--graph-only writes facts; it does not go with --dry-run", EXIT_INVALID)

    def work(dsn: str | None) -> str:
        if graph_only:
            assert dsn is not None
            return run_graph_only(org, collection, paths, dsn=dsn).to_json()
        with ProgressReporter(progress) as reporter:
            return run_ingest(
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
            ).to_json()

    # The generation in progress stays unpublished when interrupted: the previous one serves.
    run_job(
        work,
        settings=settings,
        database_url=database_url,
        database=not dry_run,
        address=address,
        num_cpus=job.num_cpus,
        interrupted=": nothing was published",
        invalid_exit=EXIT_INVALID,
    )


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
