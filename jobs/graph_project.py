"""The context graph's projection job: ``python -m jobs.graph_project``.

Drains the outbox into the Bolt server ``CORTEX_GRAPH__URI`` names (Neo4j 5, or ArcadeDB
with its Bolt plugin) with the official driver (``cortex_ray.graph.Projector``), once or,
with ``--follow``, every ``CORTEX_GRAPH__POLL_S`` until stopped; ``--rebuild`` projects
everything again from PostgreSQL (``--wipe`` first deletes what was projected). Submit it
like the other jobs (``ray job submit --working-dir . -- python -m jobs.graph_project``);
it needs no Ray itself. One projector per target at a time: a second one exits 1.

Prints one JSON report per pass on stdout. Exit codes: 0 done, 1 a configuration, storage
or Bolt error, 2 invalid arguments.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from typing import Annotated

import typer

from cortex_ray import CortexError, Interrupted, load_settings, stop_on_signals
from cortex_ray.graph import Projector, open_driver
from cortex_ray.storage import migrate
from jobs.ingest import _resolve_dsn

__all__ = ["main"]


def main(
    uri: Annotated[str | None, typer.Option(help="Bolt URI (default CORTEX_GRAPH__URI).")] = None,
    user: Annotated[str | None, typer.Option(help="Default CORTEX_GRAPH__USER.")] = None,
    password: Annotated[str | None, typer.Option(help="Default CORTEX_GRAPH__PASSWORD.")] = None,
    database: Annotated[str | None, typer.Option(help="Default CORTEX_GRAPH__DATABASE.")] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="PostgreSQL DSN (default CORTEX_DATABASE_URL, else the embedded server).",
        ),
    ] = None,
    batch: Annotated[int | None, typer.Option(min=1, max=50_000)] = None,
    target: Annotated[str, typer.Option(help="The watermark's name.")] = "neo4j",
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Project everything again.")] = False,
    wipe: Annotated[
        bool, typer.Option("--wipe", help="With --rebuild: delete the projection first.")
    ] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Keep draining until stopped.")] = False,
) -> None:
    """Project the context graph's outbox into Neo4j."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if wipe and not rebuild:
        typer.echo("error: --wipe only goes with --rebuild", err=True)
        raise typer.Exit(2)
    try:
        settings = load_settings()
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    options = settings.graph
    uri = uri or options.uri
    if not uri:
        typer.echo("error: no Bolt server: give --uri or set CORTEX_GRAPH__URI", err=True)
        raise typer.Exit(2)
    embedded = None
    try:
        dsn, embedded = _resolve_dsn(database_url, settings)
        migrate(dsn)
        driver = open_driver(uri, user or options.user, password or options.password or "")
        try:
            with Projector(
                dsn,
                driver,
                database=database or options.database,
                target=target,
                batch=batch or options.batch,
            ) as projector:
                if rebuild:
                    _print(asdict(projector.rebuild(wipe=wipe)) | {"pass": "rebuild"})
                while True:
                    _print(asdict(projector.drain()) | {"pass": "drain"})
                    if not follow:
                        break
                    time.sleep(options.poll_s)
        finally:
            driver.close()
    except CortexError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except Interrupted as exc:
        typer.echo(f"interrupted by {exc}: the watermark stands at the last batch", err=True)
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:  # the driver's errors: unreachable server, bad credentials
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        if embedded is not None:
            embedded.stop()


def _print(report: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
