"""``cortex-ray ingest`` (the streamed ingestion job, run as its own process) and
``cortex-ray sources ...`` (source health: freshness policies and checks)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cortex_ray.cli._common import (
    EXIT_EVAL_FAILED,
    as_operator,
    exec_job,
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
)

__all__ = ["ingest_command", "sources_app"]

sources_app = typer.Typer(
    help="Source health: freshness policies and checks (docs/graph.md).", no_args_is_help=True
)


def ingest_command(
    ctx: typer.Context,
    collection: Annotated[str, typer.Argument(help="The collection to (re)build.")],
    paths: Annotated[list[str], typer.Argument(help="Files or folders to ingest.")],
) -> None:
    """Ingest files and folders into a knowledge collection (the streamed Ray Data job).

    Runs ``python -m jobs.ingest`` here, on a local Ray, with a progress bar; further options
    (--no-embed, --address, --database-url, --num-cpus) are passed on to the job. On a cluster,
    submit the same module with ``ray job submit`` (docs/ingestion.md).
    """
    exec_job(
        ["-m", "jobs.ingest", "--org", org_of(ctx), "--collection", collection, *paths, *ctx.args]
    )


@sources_app.command("freshness")
def sources_freshness(
    ctx: typer.Context,
    collection: Annotated[str, typer.Argument(help="The collection.")],
    every: Annotated[float, typer.Argument(help="Expected update interval, in seconds.")],
    expires_after: Annotated[
        float | None, typer.Option("--expires-after", help="Seconds (default 4 intervals).")
    ] = None,
    path: Annotated[str | None, typer.Option("--path", help="One source's policy.")] = None,
) -> None:
    """Set how often a collection's sources (or one source) should be updated."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            await runtime.set_freshness_policy(
                org, collection, every, expires_after_s=expires_after, path=path,
                principal=as_operator(org),
            )  # fmt: skip
        out.print(Text(f"{collection}{':' + path if path else ''}: expected every {every:g} s"))
        return 0

    execute(work())


@sources_app.command("check")
def sources_check(
    ctx: typer.Context, collection: Annotated[str, typer.Argument(help="The collection.")]
) -> None:
    """Check every source of a collection now and keep the report; exit 4 when a source
    is unhealthy."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            report = await runtime.check_source_health(org, collection, principal=as_operator(org))
        table = list_table(f"health of {collection} ({report.sources} sources)")
        table.add_column("source", overflow="fold")
        table.add_column("finding", no_wrap=True)
        table.add_column("version", no_wrap=True)
        table.add_column("detail", overflow="fold")
        for f in report.findings:
            version = "-" if f.latest_version is None else f"v{f.latest_version}"
            table.add_row(Text(f.path), f.kind, version, Text(f.detail))
        out.print(table)
        unhealthy = [f for f in report.findings if f.kind != "UNKNOWN_FRESHNESS"]
        return EXIT_EVAL_FAILED if unhealthy else 0

    execute(work())
