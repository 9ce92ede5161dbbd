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
import sys
import time
from dataclasses import asdict
from typing import Annotated

import typer

from cortex_ray import stop_on_signals
from cortex_ray.graph import Projector, open_driver
from jobs._entry import EXIT_INVALID, fail, job_settings, run_job

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
    if wipe and not rebuild:
        fail("--wipe only goes with --rebuild", EXIT_INVALID)
    settings = job_settings()
    options = settings.graph
    bolt = uri or options.uri
    if not bolt:
        fail("no Bolt server: give --uri or set CORTEX_GRAPH__URI", EXIT_INVALID)

    def work(dsn: str | None) -> None:
        assert dsn is not None
        driver = open_driver(bolt, user or options.user, password or options.password or "")
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

    # Needs no Ray; the driver's own errors (unreachable server, bad credentials) exit 1.
    run_job(
        work,
        settings=settings,
        database_url=database_url,
        on_ray=False,
        interrupted=": the watermark stands at the last batch",
        foreign_errors=True,
    )


def _print(report: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    with stop_on_signals():  # SIGINT and SIGTERM unwind to main's clean-up
        typer.run(main)
