"""``cortex-ray graph ...``: search the context graph, add a fact, and run its extraction
and projection jobs (each as its own process, docs/graph.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.cli._common import (
    EXIT_INVALID,
    PRINT_COMMAND,
    as_operator,
    err,
    execute,
    fail,
    job_flags,
    list_table,
    open_runtime,
    org_of,
    out,
    run_job,
)
from cortex_ray.graph import (
    EXTRACT_JOB,
    ExtractActors,
    ExtractAddress,
    ExtractBatch,
    ExtractCollection,
    ExtractDatabaseUrl,
    ExtractInFlight,
    ExtractModelVersion,
    ExtractNumGpus,
    ExtractRequest,
    ExtractSinceVersion,
    ExtractSources,
    Triple,
)

__all__ = ["graph_app"]

graph_app = typer.Typer(
    help="The context graph: search it, add facts, run its extraction and projection jobs "
    "(docs/graph.md).",
    no_args_is_help=True,
)


def _typed_name(value: str, what: str) -> tuple[str, str]:
    """``TYPE:NAME`` (``service:billing-api``) → ``(type, name)``."""
    kind, sep, name = value.partition(":")
    if not sep or not kind or not name.strip():
        raise InvalidRequestError(f"{what}: expected TYPE:NAME, e.g. service:billing-api")
    return kind, name


def _time_option(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequestError(f"{flag}: not an ISO 8601 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@graph_app.command("search")
def graph_search(
    ctx: typer.Context,
    terms: Annotated[list[str], typer.Argument(help="Names or aliases to start from.")],
    depth: Annotated[int, typer.Option(help="Hops (1-4).")] = 1,
    max_facts: Annotated[int, typer.Option("--max-facts", help="Facts in all (1-500).")] = 50,
    valid_at: Annotated[str | None, typer.Option("--valid-at", help="ISO time (valid).")] = None,
    known_at: Annotated[str | None, typer.Option("--known-at", help="ISO time (record).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Facts about the entities TERMS name and their neighbours, each cited."""
    org = org_of(ctx)

    async def work() -> int:
        valid, known = _time_option(valid_at, "--valid-at"), _time_option(known_at, "--known-at")
        async with open_runtime(with_models=False) as runtime:
            result = await runtime.search_graph(
                org, terms=terms, depth=depth, max_facts=max_facts, valid_at=valid,
                known_at=known, principal=as_operator(org),
            )  # fmt: skip
        if as_json:
            out.print_json(result.model_dump_json())
            return 0
        table = list_table(f"facts about {', '.join(terms)} in {org}")
        table.add_column("fact", min_width=30, overflow="fold")
        table.add_column("citation", overflow="fold")
        table.add_column("valid", no_wrap=True)
        for f in result.facts:
            fact = (
                f"{f.subject.type}:{f.subject.name} {f.predicate} {f.object.type}:{f.object.name}"
            )
            until = f" → {f.valid_to:%Y-%m-%d}" if f.valid_to else ""
            warn = f" ⚠ {f.warning}" if f.warning else ""
            table.add_row(Text(fact), Text(f.citation + warn), f"{f.valid_from:%Y-%m-%d}{until}")
        out.print(table)
        if not result.facts:
            err.print("no facts (no entity by that name, or none you may read)")
        return 0

    execute(work())


@graph_app.command("add")
def graph_add(
    ctx: typer.Context,
    subject: Annotated[str, typer.Argument(help="TYPE:NAME, e.g. service:billing-api")],
    predicate: Annotated[str, typer.Argument(help="e.g. owned_by")],
    obj: Annotated[str, typer.Argument(metavar="OBJECT", help="TYPE:NAME, e.g. team:payments")],
    functional: Annotated[
        bool, typer.Option("--functional", help="One object per subject at a time.")
    ] = False,
    confidence: Annotated[float, typer.Option(help="0 to 1.")] = 1.0,
    valid_from: Annotated[str | None, typer.Option("--valid-from", help="ISO time.")] = None,
) -> None:
    """Record one fact of your own (cited as submitted by the operator)."""
    org = org_of(ctx)

    async def work() -> int:
        s_type, s_name = _typed_name(subject, "subject")
        o_type, o_name = _typed_name(obj, "object")
        triple = Triple(
            subject_type=s_type, subject=s_name, predicate=predicate, object_type=o_type,
            object=o_name, functional=functional, confidence=confidence,
            valid_from=_time_option(valid_from, "--valid-from"),
        )  # fmt: skip
        async with open_runtime(with_models=False) as runtime:
            report = await runtime.submit_triples(org, [triple], principal=as_operator(org))
        out.print(
            Text(
                f"run {report.run_id}: {report.assertions} new fact(s), "
                f"{report.entities} new entities, {report.closed} closed"
            )
        )
        return 0

    execute(work())


@graph_app.command("extract")
def graph_extract(
    ctx: typer.Context,
    collection: ExtractCollection = None,
    source: ExtractSources = None,
    since_version: ExtractSinceVersion = None,
    model_version: ExtractModelVersion = None,
    batch: ExtractBatch = None,
    actors: ExtractActors = None,
    in_flight: ExtractInFlight = None,
    num_gpus: ExtractNumGpus = None,
    address: ExtractAddress = None,
    database_url: ExtractDatabaseUrl = None,
    print_command: Annotated[bool, PRINT_COMMAND] = False,
) -> None:
    """Extract entities and relationships from a collection's published passages with the
    chat model (optional: nothing else runs it).

    Runs ``python -m jobs.graph_extract`` (a Ray job) here; unset options take the
    CORTEX_INGEST__GRAPH_MODEL_* settings. Prints the job's JSON report (docs/graph.md).
    """
    request = ExtractRequest(
        org=org_of(ctx), collection=collection, source=tuple(source or ()),
        since_version=since_version, model_version=model_version, batch=batch, actors=actors,
        in_flight=in_flight, num_gpus=num_gpus, address=address, database_url=database_url,
    )  # fmt: skip
    try:
        request.source_ids()
    except InvalidRequestError as exc:
        fail(str(exc), EXIT_INVALID)
    run_job(EXTRACT_JOB, request.flags(), print_command)


@graph_app.command("project")
def graph_project(
    uri: Annotated[
        str | None, typer.Option("--uri", help="Bolt URI (default CORTEX_GRAPH__URI).")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", help="Default CORTEX_GRAPH__USER.")] = None,
    password: Annotated[
        str | None, typer.Option("--password", help="Default CORTEX_GRAPH__PASSWORD.")
    ] = None,
    database: Annotated[
        str | None, typer.Option("--database", help="Default CORTEX_GRAPH__DATABASE.")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="PostgreSQL DSN.")
    ] = None,
    batch: Annotated[int | None, typer.Option("--batch", min=1, max=50_000)] = None,
    target: Annotated[str | None, typer.Option("--target", help="The watermark's name.")] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Project everything again.")] = False,
    wipe: Annotated[
        bool, typer.Option("--wipe", help="With --rebuild: delete the projection first.")
    ] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Keep draining until stopped.")] = False,
    print_command: Annotated[bool, PRINT_COMMAND] = False,
) -> None:
    """Project the context graph's outbox into Neo4j (every organisation's), once or
    ``--follow``; ``--rebuild`` projects everything again.

    Runs ``python -m jobs.graph_project`` here; prints a JSON report per pass
    (docs/graph.md).
    """
    if wipe and not rebuild:
        fail("--wipe only goes with --rebuild", EXIT_INVALID)
    flags = job_flags(
        {
            "uri": uri, "user": user, "password": password, "database": database,
            "database_url": database_url, "batch": batch, "target": target,
            "rebuild": rebuild, "wipe": wipe, "follow": follow,
        }
    )  # fmt: skip
    run_job("jobs.graph_project", flags, print_command)
