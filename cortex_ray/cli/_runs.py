"""``cortex-ray runs ...`` (show, resume, cancel, list, and what a run did: report, label,
acceptance of shadow runs), ``cortex-ray trace`` and ``cortex-ray diagnose``."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import Principal, RunStatus, TaskRun
from cortex_ray.cli._common import (
    EXIT_ERROR,
    as_operator,
    err,
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
)
from cortex_ray.cli._runview import STATUS_STYLE, drive_live, print_run, run_exit_code, say_busy
from cortex_ray.governance import RunLabel
from cortex_ray.observability import waterfall
from cortex_ray.runtime import Runtime

__all__ = ["diagnose_command", "runs_app", "trace_command"]

runs_app = typer.Typer(help="Inspect autonomous runs.", no_args_is_help=True)


@runs_app.command("show")
def runs_show(
    ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="The run's id.")]
) -> None:
    """Show a run's step log and outcome."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        operator = as_operator(org)
        async with open_runtime(with_models=False) as runtime:
            run = await runtime.get_run(org, key, principal=operator)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
        print_run(run, agent.name)
        return 0

    execute(work())


@runs_app.command("resume")
def runs_resume(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="If another driver holds the run, wait until the run ends (and take it "
            "over if that driver stops).",
        ),
    ] = False,
) -> None:
    """Continue a RUNNING run after its last recorded step (after a crash or Ctrl-C).

    One driver per run: a run another driver holds (the API's executor, another resume)
    is not driven here; the command says who holds it and exits 1 at once, or with --wait
    waits.
    """
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        operator = as_operator(org)
        # The models load only once this command is to drive the run (in ``drive``): a run
        # another driver holds is refused first, without waiting for them.
        async with open_runtime(with_models=False) as runtime, AsyncExitStack() as loaded:
            run = await runtime.get_run(org, key, principal=operator)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
            driver: list[Runtime] = []

            async def drive(current: TaskRun) -> TaskRun:
                if not driver:
                    opened = open_runtime(with_models=True, db=runtime.db)
                    driver.append(await loaded.enter_async_context(opened))
                return await drive_live(driver[0], org, current, agent, resume=True)

            if run.status is RunStatus.RUNNING:
                run = await runtime.resume_or_wait(
                    org, run, principal=operator, wait=wait, on_busy=say_busy, drive=drive
                )
                if run.status is RunStatus.RUNNING:  # left to its driver: refused above
                    return EXIT_ERROR
            else:
                err.print(Text(f"run {run.id} already ended: {run.status.value}"))
        print_run(run, agent.name)
        return run_exit_code(run)

    execute(work())


@runs_app.command("cancel")
def runs_cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded).")] = None,
) -> None:
    """Cancel a RUNNING run (or one awaiting approval): it ends CANCELLED ("cancelled by
    operator"); its driver stops at its next step. A run that already ended is shown as it
    is."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        operator = as_operator(org)
        async with open_runtime(with_models=False) as runtime:
            before = await runtime.run_status(org, key, principal=operator)
            run = await runtime.cancel_run(org, key, principal=operator, reason=reason)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
        if before.ended:
            err.print(Text(f"run {run.id} already ended: {run.status.value}"))
        print_run(run, agent.name)
        return 0

    execute(work())


@runs_app.command("list")
def runs_list(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 50,
) -> None:
    """List recent runs, newest first."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            operator = as_operator(org)
            runs = await runtime.list_runs(org, agent_ref=agent, limit=limit, principal=operator)
            names = {a.id: a.name for a in await runtime.list_agents(org, principal=operator)}
        table = list_table(f"runs in {org}")
        table.add_column("id", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("created", no_wrap=True)
        table.add_column("agent: goal", min_width=16, overflow="fold")
        for run in runs:
            agent_name = names.get(run.agent_id, str(run.agent_id))
            label = f"{agent_name} ({run.name})" if run.name else agent_name
            table.add_row(
                str(run.id),
                Text(run.status.value, style=STATUS_STYLE[run.status]),
                run.created_at.strftime("%m-%d %H:%M"),
                Text(shorten(f"{label}: {run.goal}", 80)),
            )
        out.print(table)
        return 0

    execute(work())


@runs_app.command("report")
def runs_report(
    ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="The run's id.")]
) -> None:
    """What a run did and, dry or shadow, would have done (from its audit rows)."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        async with open_runtime(with_models=False) as runtime:
            report = await runtime.governance.run_report(
                org, key, principal=Principal.operator(org)
            )
        table = list_table(f"run {report.run_id}: {report.run_mode}, {report.status}")
        for column in ("step", "what", "tool", "tier", "arguments"):
            table.add_column(column, overflow="fold")
        for what, calls in (
            ("executed", report.executed),
            ("simulated", report.simulated),
            ("proposed", report.proposed),
            ("refused", report.refused),
            ("failed", report.failed),
        ):
            for c in calls:
                table.add_row(
                    "" if c.step_index is None else str(c.step_index + 1),
                    what,
                    c.tool,
                    c.tier or "",
                    Text(shorten(json.dumps(c.args, ensure_ascii=False), 80)),
                )
        out.print(table)
        if report.label is not None:
            out.print(Text(f"label: {report.label.label.value} by {report.label.labelled_by}"))
        return 0

    execute(work())


@runs_app.command("label")
def runs_label(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The shadow run's id.")],
    label: Annotated[RunLabel, typer.Argument(help="accepted, rejected or mixed.")],
    note: Annotated[str, typer.Option("--note", help="Why.")] = "",
) -> None:
    """Label an ended shadow run's proposals (never executes them)."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        async with open_runtime(with_models=False) as runtime:
            record = await runtime.governance.label_run(
                org, key, label, note=note, principal=Principal.operator(org)
            )
        out.print(Text(f"run {record.run_id}: {record.label.value}"))
        return 0

    execute(work())


@runs_app.command("acceptance")
def runs_acceptance(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent.")] = None,
) -> None:
    """Acceptance of shadow runs per agent: runs, labels, proposals, rate."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            rows = await runtime.governance.shadow_report(
                org, agent_ref=agent, principal=Principal.operator(org)
            )
        table = list_table(f"shadow runs in {org}")
        for column in ("agent", "runs", "labelled", "accepted", "rejected", "mixed", "rate"):
            table.add_column(column)
        for r in rows:
            rate = "" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
            table.add_row(
                r.agent_name,
                *(str(v) for v in (r.runs, r.labelled, r.accepted, r.rejected, r.mixed)),
                rate,
            )
        out.print(table)
        return 0

    execute(work())


def trace_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The spans as JSON.")] = False,
) -> None:
    """Print a run's trace as a waterfall: each span's phase, status, duration and place in
    time, tool spans with their action category and access decision (the spans this
    deployment keeps locally: docs/operations.md, "Traces")."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.run_trace(org, key, principal=as_operator(org))
            where = runtime.tracing.sinks if runtime.tracing is not None else ()
        if as_json:
            out.print_json(found.model_dump_json())
            return 0
        if not found.spans:
            err.print(
                f"no spans are kept here for run {key} (spans kept here: "
                f"{'yes' if 'local' in where else 'no'}; CORTEX_TRACING__LOCAL and "
                "OTEL_EXPORTER_OTLP_ENDPOINT decide where they go)"
            )
            return 1
        out.print(
            f"run {key}: {len(found.spans)} spans in {len(found.trace_ids)} trace(s) "
            f"{', '.join(found.trace_ids)}",
            highlight=False,
        )
        for line in waterfall(found):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        return 0

    execute(work())


def diagnose_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The timeline as JSON.")] = False,
) -> None:
    """Print a run's diagnostic timeline: each attempt, model call (model, schema, time,
    tokens), decision with its candidates and scores, tool call with its input and result
    (scrubbed), retrieval evidence, stall and loop, and how it ended, with what it cost.
    Exit code 3 when the run is stalled now."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(run_id, "run")
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.run_diagnostics(org, key, principal=as_operator(org))
        if as_json:
            out.print_json(found.model_dump_json())
        else:
            for line in found.lines():
                out.print(line, highlight=False, markup=False, soft_wrap=True)
        return 3 if found.stalled else 0

    execute(work())
