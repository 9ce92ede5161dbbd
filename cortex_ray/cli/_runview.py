"""How a run looks on the terminal: its step log, its outcome and exit code, and a run
driven here with each step printed as it lands (used by ``run``, ``demo``, ``runs`` and
``workflow run``)."""

from __future__ import annotations

import asyncio

import typer
from rich import box
from rich.status import Status
from rich.table import Table
from rich.text import Text

from cortex_ray._types import Agent, DecisionKind, RunStatus, Step, TaskRun
from cortex_ray.cli._common import (
    EXIT_ERROR,
    EXIT_RUN_CANCELLED,
    EXIT_RUN_FAILED,
    as_operator,
    err,
    out,
    shorten,
)
from cortex_ray.runtime import Runtime
from cortex_ray.storage import LeaseHolder

__all__ = ["STATUS_STYLE", "drive_live", "print_run", "run_exit_code", "say_busy", "step_line"]


def _candidates_text(step: Step) -> str:
    parts = []
    for c in step.candidates:
        label = c.tool if c.kind == "tool" else "finish"
        score = "invalid" if not c.valid else ("–" if c.score is None else f"{c.score:g}")
        mark = "*" if c.index == step.selected else ""
        again = f"↻{c.repeats}" if c.repeats else ""
        parts.append(f"{mark}{label}{again}={score}")
    return ", ".join(parts) or "—"


def _step_cells(step: Step) -> tuple[str, str, str, str, str]:
    """(tool, category, status, observation or message, candidates) for one step."""
    if step.decision is DecisionKind.ACT and step.action is not None:
        obs = step.observation
        category = (step.action_type or step.action.action_type).value
        return (
            step.action.tool,
            category,
            obs.status.value if obs else "—",
            obs.summary if obs else "",
            _candidates_text(step),
        )
    return ("—", "—", "—", step.message or "", _candidates_text(step))


def step_line(step: Step, max_steps: int) -> Text:
    tool, category, status, summary, _ = _step_cells(step)
    line = Text.assemble((f"step {step.step_index + 1}/{max_steps} ", "bold"), step.decision.value)
    if step.decision is DecisionKind.ACT:
        line.append(f" {tool} [{category}] → {status}: ")
    else:
        line.append(": ")
    line.append(shorten(summary, 100), style="dim")
    if step.note:
        line.append(f"  ({shorten(step.note, 80)})", style="italic")
    return line


def _step_table(run: TaskRun) -> Table:
    table = Table(
        title=f"steps of run {run.id}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption="candidates: tool=score, * marks the selected one, ↻N repeats step N; "
        "note: why the planner chose it",
        caption_justify="left",
    )
    table.add_column("#", justify="right", no_wrap=True)
    for column in ("decision", "tool", "category", "status"):
        table.add_column(column, no_wrap=True)
    table.add_column("observation", ratio=3, overflow="fold")
    table.add_column("candidates", ratio=2, overflow="fold")
    table.add_column("note", ratio=2, overflow="fold")
    for step in run.steps:
        tool, category, status, summary, candidates = _step_cells(step)
        table.add_row(
            str(step.step_index + 1),
            step.decision.value,
            tool,
            category,
            status,
            Text(shorten(summary, 80)),
            Text(candidates),
            Text(shorten(step.note or "", 120)),
        )
    return table


STATUS_STYLE = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.RUNNING: "yellow",
    RunStatus.AWAITING_APPROVAL: "cyan",
}


def print_run(run: TaskRun, agent_name: str | None = None) -> None:
    """The step log, then the outcome. Free text is printed as Text (never as markup)."""
    out.print(_step_table(run))
    fields: list[tuple[str, str | None]] = [
        ("agent", agent_name or str(run.agent_id)),
        ("goal", run.goal),
        ("steps", f"{len(run.steps)} of at most {run.max_steps}"),
        ("result", run.result),
        ("reason", run.reason),
        ("run id", str(run.id)),
    ]
    status = Text.assemble(
        ("status: ", "bold"), (run.status.value, f"bold {STATUS_STYLE[run.status]}")
    )
    out.print(status, soft_wrap=True)
    for label, value in fields:
        if value:
            out.print(Text.assemble((f"{label}: ", "bold"), value), soft_wrap=True)


def run_exit_code(run: TaskRun) -> int:
    return {
        RunStatus.COMPLETED: 0,
        RunStatus.FAILED: EXIT_RUN_FAILED,
        RunStatus.CANCELLED: EXIT_RUN_CANCELLED,
    }.get(run.status, EXIT_ERROR)


async def drive_live(
    runtime: Runtime, org: str, run: TaskRun, agent: Agent, *, resume: bool
) -> TaskRun:
    """Drive a RUNNING run from its next step, printing each step as it lands. A run this
    command just started is driven directly; resuming another is a use case of its own."""
    first = len(run.steps) + 1
    err.print(
        Text(f"run {run.id}: {agent.name}, step {first} of at most {run.max_steps}"),
        soft_wrap=True,
    )
    status: Status = err.status(f"step {first}/{run.max_steps}: deciding…")

    def on_step(step: Step) -> None:
        err.print(step_line(step, run.max_steps), soft_wrap=True)
        status.update(f"step {step.step_index + 2}/{run.max_steps}: deciding…")

    try:
        with status:
            if not resume:
                return await runtime.drive_run(org, run.id, on_step=on_step)
            return await runtime.resume_run(
                org, run.id, on_step=on_step, principal=as_operator(org)
            )
    except asyncio.CancelledError:
        err.print(Text(f"run {run.id} was interrupted and stays RUNNING"), soft_wrap=True)
        raise


def say_busy(run: TaskRun, holder: LeaseHolder, waiting: bool) -> None:
    """Another driver holds ``run``: say who, and whether this command waits for it."""
    until = f"{holder.expires_at:%Y-%m-%d %H:%M:%S %Z}" if holder.expires_at else "?"
    if not waiting:  # the refusal: the command's one error line (its steps: runs show)
        typer.echo(
            f"error: run {run.id} is being driven by {holder.owner} (lease renewed, next "
            f"expiry {until}); not resumed here. --wait waits for it to end; "
            f"cortex-ray --org {run.org_id} runs show {run.id} shows its steps",
            err=True,
        )
        return
    err.print(
        Text(f"run {run.id} is being driven by {holder.owner}; waiting for it to end"),
        soft_wrap=True,
    )
