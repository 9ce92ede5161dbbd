"""``cortex-ray schedules ...``: recurring and one-off autonomous tasks (an agent's goal, or
a workflow's runs)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import Principal, RunMode
from cortex_ray.cli._common import (
    execute,
    json_object,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
)

__all__ = ["schedules_app"]


schedules_app = typer.Typer(
    help="Recurring and one-off autonomous tasks: list, create, suspend, resume, cancel.",
    no_args_is_help=True,
)


@schedules_app.command("list")
def schedules_list(ctx: typer.Context) -> None:
    """The organisation's schedules."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.governance.list_schedules(org, principal=Principal.operator(org))
        table = list_table(f"schedules of {org}")
        for column in ("id", "status", "when", "next", "fired", "goal", "last error"):
            table.add_column(column, overflow="fold")
        for s in found:
            when = (s.cron and f"{s.cron} ({s.timezone})") or (
                f"every {s.interval_s}s" if s.interval_s else "once"
            )
            nxt = s.next_run_at.isoformat(timespec="seconds") if s.next_run_at else ""
            what = s.goal
            if s.workflow is not None:
                pinned = "latest" if s.workflow_version is None else f"v{s.workflow_version}"
                what = f"workflow {s.workflow} ({pinned}) {json.dumps(s.inputs or {})}"
            table.add_row(
                str(s.id),
                s.status,
                when,
                nxt,
                str(s.fired),
                Text(shorten(what, 60)),
                Text(shorten(s.last_error or "", 80)),
            )
        out.print(table)
        return 0

    execute(work())


@schedules_app.command("create")
def schedules_create(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="An AUTONOMOUS agent's name or id.")],
    goal: Annotated[
        str | None, typer.Argument(help="The goal of each run (none with --workflow).")
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option("--workflow", help="Each run is a run of this workflow (instead of GOAL)."),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="The workflow's pinned version.")
    ] = None,
    inputs: Annotated[
        str | None, typer.Option("--inputs", help="The workflow's inputs, a JSON object.")
    ] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="e.g. '0 9 * * 1-5'.")] = None,
    every: Annotated[int | None, typer.Option("--every", help="Interval in seconds.")] = None,
    at: Annotated[
        datetime | None, typer.Option("--at", help="A one-off's time, or an interval's start.")
    ] = None,
    tz: Annotated[str, typer.Option("--tz", help="The cron's time zone.")] = "UTC",
    max_steps: Annotated[int, typer.Option("--max-steps", help="Each run's budget.")] = 8,
    max_seconds: Annotated[
        int, typer.Option("--max-seconds", help="Each run's wall-time cap (0: none).")
    ] = 3600,
    run_mode: Annotated[
        RunMode | None,
        typer.Option(
            "--mode", help="execute|dry_run|shadow (default: execute, or the workflow's default)"
        ),
    ] = None,
) -> None:
    """Schedule an agent's GOAL, or a --workflow's runs with its --inputs (checked now and
    at every firing): --cron, --every, or --at alone for a one-off."""
    org = org_of(ctx)

    async def work() -> int:
        if (workflow is None) == (goal is None):
            raise InvalidRequestError("give a GOAL or --workflow, one of the two")
        if workflow is None and (version is not None or inputs is not None):
            raise InvalidRequestError("--version and --inputs go with --workflow")
        given = None if inputs is None else json_object(inputs, "--inputs")
        async with open_runtime(with_models=False) as runtime:
            made = await runtime.governance.create_schedule(
                org,
                agent,
                goal or "",
                workflow=workflow,
                workflow_version=version,
                inputs=given if workflow is None else (given or {}),
                cron=cron,
                interval_s=every,
                run_at=at,
                timezone=tz,
                max_steps=max_steps,
                max_seconds=max_seconds or None,
                run_mode=run_mode,
                max_steps_limit=runtime.settings.decide.max_steps_limit,
                principal=Principal.operator(org),
            )
        nxt = made.next_run_at.isoformat(timespec="seconds") if made.next_run_at else "-"
        out.print(Text(f"schedule {made.id}: next run {nxt}"))
        return 0

    execute(work())


def _change_schedule(ctx: typer.Context, schedule_id: str, action: str) -> None:
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(schedule_id, "schedule")
        async with open_runtime(with_models=False) as runtime:
            changed = await runtime.governance.change_schedule(
                org, key, action, principal=Principal.operator(org)
            )
        out.print(Text(f"schedule {changed.id}: {changed.status}"))
        return 0

    execute(work())


@schedules_app.command("suspend")
def schedules_suspend(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Stop firing until resumed."""
    _change_schedule(ctx, schedule_id, "suspend")


@schedules_app.command("resume")
def schedules_resume(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Fire again (what was missed coalesces into one run)."""
    _change_schedule(ctx, schedule_id, "resume")


@schedules_app.command("cancel")
def schedules_cancel(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Stop for good."""
    _change_schedule(ctx, schedule_id, "cancel")
