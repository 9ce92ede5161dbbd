"""``cortex-ray workflow ...``: workflow definitions, immutable versions, runs and their
ledgers. Each command parses, calls ``Runtime.workflows`` as the operator, renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import Principal, RunMode
from cortex_ray.cli._common import (
    err,
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
)
from cortex_ray.cli._runview import drive_live, print_run, run_exit_code
from cortex_ray.governance import WorkflowVersionSpec

__all__ = ["workflow_app"]


workflow_app = typer.Typer(
    help="Workflows: definitions, immutable versions, runs and their ledgers.",
    no_args_is_help=True,
)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{what} is not JSON: {exc.msg} at column {exc.colno}") from None


def _spec(source: str) -> WorkflowVersionSpec:
    """A version's spec from a JSON file (``@path``) or inline JSON."""
    if source.startswith("@"):
        try:
            source = Path(source[1:]).read_text()
        except OSError as exc:
            raise InvalidRequestError(f"cannot read {source[1:]}: {exc.strerror}") from None
    data = _json(source, "the version")
    if not isinstance(data, dict):
        raise InvalidRequestError("the version must be a JSON object")
    try:
        return WorkflowVersionSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequestError(f"the version: {where}: {first['msg']}") from None


@workflow_app.command("create")
def workflow_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Unique in the organisation.")],
    description: Annotated[str, typer.Option("--description", help="What it is for.")] = "",
) -> None:
    """Define a workflow (then publish a version of it)."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            made = await runtime.workflows.create(
                org, name, description=description, principal=Principal.operator(org)
            )
        out.print(Text(f"workflow {made.name} ({made.id}) defined in {org}"))
        return 0

    execute(work())


@workflow_app.command("publish")
def workflow_publish(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workflow.")],
    version_spec: Annotated[
        str,
        typer.Argument(
            metavar="SPEC",
            help="The version as JSON, or @file.json: instructions, input_schema, tools, "
            "connectors, required_evidence, risk, approval_tools, approval_tiers, default_mode.",
        ),
    ],
    version: Annotated[
        int | None, typer.Option("--version", help="Exactly this version (idempotent).")
    ] = None,
) -> None:
    """Publish a new, immutable version."""
    org = org_of(ctx)

    async def work() -> int:
        spec = _spec(version_spec)
        async with open_runtime(with_models=False) as runtime:
            made, fresh = await runtime.workflows.publish(
                org, name, spec, version=version, principal=Principal.operator(org)
            )
        what = "published" if fresh else "already published with this spec"
        out.print(Text(f"workflow {made.label} {what} ({made.id})"))
        return 0

    execute(work())


@workflow_app.command("list")
def workflow_list(ctx: typer.Context) -> None:
    """The organisation's workflows and their latest versions."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.workflows.list_workflows(org, principal=Principal.operator(org))
        table = list_table(f"workflows in {org}")
        for column in ("name", "latest", "description"):
            table.add_column(column, overflow="fold")
        for w in found:
            latest = "" if w.latest_version is None else f"v{w.latest_version}"
            table.add_row(w.name, latest, Text(w.description))
        out.print(table)
        return 0

    execute(work())


@workflow_app.command("show")
def workflow_show(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The workflow.")]
) -> None:
    """A workflow's versions: allow-list, gates, evidence, risk, default mode."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            found, versions = await runtime.workflows.get(
                org, name, principal=Principal.operator(org)
            )
        table = list_table(f"workflow {found.name}")
        for column in ("version", "mode", "risk", "allows", "approval", "evidence"):
            table.add_column(column, overflow="fold")
        for v in versions:
            allows = ", ".join([*v.tools, *(f"{c}.*" for c in v.connectors)])
            gates = ", ".join([*v.approval_tools, *(t.value for t in v.approval_tiers)])
            ev = v.required_evidence
            evidence = f">={ev.min_sources} sources" + (
                f"; {', '.join(ev.sources)}" if ev.sources else ""
            )
            table.add_row(
                str(v.version), v.default_mode.value, v.risk.value, allows, gates, evidence
            )
        out.print(table)
        return 0

    execute(work())


@workflow_app.command("run")
def workflow_run(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workflow.")],
    agent: Annotated[str, typer.Argument(help="The AUTONOMOUS agent that runs it.")],
    inputs: Annotated[str, typer.Option("--inputs", help="The inputs, a JSON object.")] = "{}",
    version: Annotated[int | None, typer.Option("--version", help="Default: latest.")] = None,
    run_mode: Annotated[
        RunMode | None, typer.Option("--mode", help="Default: the version's (only safer).")
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps")] = None,
) -> None:
    """Run a workflow here. Exit 0 if COMPLETED, 3 if FAILED."""
    org = org_of(ctx)

    async def work() -> int:
        data = _json(inputs, "--inputs")
        async with open_runtime(with_models=True) as runtime:
            run = await runtime.workflows.start_run(
                org, name, agent, data, version=version, run_mode=run_mode,
                max_steps=max_steps, principal=Principal.operator(org),
            )  # fmt: skip
            found = await runtime.get_agent(org, run.agent_id, principal=Principal.operator(org))
            run = await drive_live(runtime, org, run, found, resume=False)
            print_run(run, found.name)
            return run_exit_code(run)

    execute(work())


@workflow_app.command("ledger")
def workflow_ledger(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="The page as JSON, with its payloads.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="Events in this page, at most.")
    ] = 200,
    after: Annotated[
        str | None,
        typer.Option("--after", help="The page after this cursor (the previous page's next)."),
    ] = None,
) -> None:
    """A run's ledger: one timeline of proposals, gate decisions, approvals, evidence, a
    page of events at a time (--limit; then --after the cursor printed at the end)."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        async with open_runtime(with_models=False) as runtime:
            ledger = await runtime.workflows.ledger(
                org,
                key,
                payloads=as_json,
                limit=limit,
                after=after,
                principal=Principal.operator(org),
            )
        if as_json:
            typer.echo(ledger.model_dump_json(indent=2))
            return 0
        which = "no workflow" if ledger.workflow is None else f"{ledger.workflow} v{ledger.version}"
        title = f"run {ledger.run_id}: {which}, {ledger.run_mode.value}, {ledger.status}"
        table = list_table(title)
        for column in ("#", "step", "event", "tool", "outcome", "detail"):
            table.add_column(column, overflow="fold")
        for e in ledger.events:
            detail = e.summary
            if e.kind == "call" and e.data.get("source_ids"):
                detail = f"sources {', '.join(e.data['source_ids'])} {detail}".strip()
            if e.payloads:
                detail = f"{detail} [payload {', '.join(p[:12] for p in e.payloads)}]".strip()
            table.add_row(
                str(e.seq),
                "" if e.step_index is None else str(e.step_index + 1),
                e.kind,
                e.tool or "",
                e.outcome or "",
                Text(shorten(detail, 100)),
            )
        out.print(table)
        if ledger.next_after is not None:
            err.print(Text(f"more events: --after {ledger.next_after}"), soft_wrap=True)
        return 0

    execute(work())


@workflow_app.command("acceptance")
def workflow_acceptance(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option("--workflow", help="Only this workflow.")] = None,
) -> None:
    """Acceptance of shadow runs per workflow version: runs, labels, proposals, rate."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            rows = await runtime.workflows.acceptance(
                org, name=name, principal=Principal.operator(org)
            )
        table = list_table(f"shadow runs per workflow in {org}")
        for column in ("workflow", "version", "runs", "labelled", "accepted", "proposals", "rate"):
            table.add_column(column)
        for r in rows:
            rate = "" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
            table.add_row(
                r.workflow,
                f"v{r.version}",
                *(str(v) for v in (r.runs, r.labelled, r.accepted, r.proposals)),
                rate,
            )
        out.print(table)
        return 0

    execute(work())
