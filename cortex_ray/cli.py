"""The ``cortex-ray`` command line: agents, autonomous runs and their step logs, API keys,
``eval`` (regression cases from runs, suites, replays), and the commands that run a job as
its own process (``ingest``: ``python -m jobs.ingest``; ``graph extract`` and ``graph
project``: ``python -m jobs.graph_extract`` and ``jobs.graph_project``).

Typer parses the command line and rich draws the spinner, the live step lines and the
tables (see STYLE.md: we do not write CLI parsing or progress bars by hand). Settings come
from the environment (``CORTEX_*``); every command opens the runtime, does one thing and
closes it again, which also stops the embedded PostgreSQL when this process started it.

Exit codes: 0 success; 1 a cortex-ray error (not found, storage, configuration, model);
2 invalid input; 3 a run that ended FAILED; 4 an eval run with a failing case; 5 a run a
person cancelled (CANCELLED); 130
interrupted (SIGINT); 143 stopped (SIGTERM).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shlex
import sys
import warnings
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn
from uuid import UUID

import pydantic
import typer
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.status import Status
from rich.table import Table
from rich.text import Text

from cortex_ray._exceptions import (
    CortexError,
    InvalidRequestError,
    NotFoundError,
)
from cortex_ray._runtime import Runtime
from cortex_ray._shutdown import Interrupted, run_stoppable
from cortex_ray._types import (
    Agent,
    AgentMode,
    DecisionKind,
    Principal,
    PrincipalKind,
    ProposalStatus,
    RunMode,
    RunStatus,
    Step,
    TaskRun,
)
from cortex_ray.evals import Check, EvalMode, EvalRun, EvalSuite
from cortex_ray.graph import Triple
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import HashEmbedder
from cortex_ray.observability import waterfall
from cortex_ray.settings import load_settings

__all__ = ["app", "main"]

DEMO_AGENT = "demo-agent"
DEMO_PERSONA = (
    "You are a concise, careful assistant. Use one tool at a time to make progress, "
    "remember facts worth keeping, and finish with a short answer as soon as the goal is met."
)
DEMO_GOAL = (
    "Find out the current date and time, remember it as a fact, "
    "and finish with a one-sentence answer."
)

EXIT_ERROR = 1
EXIT_INVALID = 2
EXIT_RUN_FAILED = 3
EXIT_EVAL_FAILED = 4
EXIT_RUN_CANCELLED = 5
EXIT_INTERRUPTED = 130

_out = Console(highlight=False)
_err = Console(stderr=True, highlight=False)

app = typer.Typer(
    name="cortex-ray",
    help="A CoALA agent runtime on PostgreSQL/pgvector. Settings come from CORTEX_* "
    "environment variables; global options (--org) go before the command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
agents_app = typer.Typer(help="Create and list agents.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect autonomous runs.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys for the HTTP API (bearer keys).", no_args_is_help=True)
app.add_typer(agents_app, name="agents")
app.add_typer(runs_app, name="runs")
proposals_app = typer.Typer(
    help="Proposed edits of agents' procedural memory (persona, skills): list, approve, reject.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="api-keys")
app.add_typer(proposals_app, name="proposals")
eval_app = typer.Typer(
    help="Evaluation: runs as regression cases, versioned suites, replays, comparisons.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")
graph_app = typer.Typer(
    help="The context graph: search it, add facts, run its extraction and projection jobs "
    "(docs/graph.md).",
    no_args_is_help=True,
)
app.add_typer(graph_app, name="graph")
sources_app = typer.Typer(
    help="Source health: freshness policies and checks (docs/graph.md).", no_args_is_help=True
)
app.add_typer(sources_app, name="sources")


class Mode(StrEnum):
    """The ``--mode`` choices (lower case on the command line)."""

    interactive = "interactive"
    autonomous = "autonomous"


@dataclass(frozen=True)
class _Options:
    org: str


# plumbing --------------------------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    """Print one ``error:`` line to stderr and exit with ``code``."""
    one_line = " ".join(message.split()) or "unknown error"
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code)


def _validation_message(exc: pydantic.ValidationError, prefix: str = "") -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{prefix}{where}: {first['msg']}" if where else f"{prefix}{first['msg']}"


def _execute(work: Coroutine[Any, Any, int]) -> None:
    """Run one command's coroutine; turn cortex-ray errors into one line and an exit code.

    SIGINT and SIGTERM (also SIGINT ignored at start, as in a background job) cancel the
    coroutine, so its runtime closes and the embedded PostgreSQL it started stops; the exit
    code is then 130 or 143. A second signal exits at once."""
    try:
        code = run_stoppable(work)
    except Interrupted as exc:
        typer.echo("interrupted", err=True)
        raise typer.Exit(exc.exit_code) from None
    except InvalidRequestError as exc:
        _fail(str(exc), EXIT_INVALID)
    except CortexError as exc:
        _fail(str(exc), EXIT_ERROR)
    except pydantic.ValidationError as exc:
        # Boundary models (Agent, ...) validate what the user typed, e.g. an empty name.
        _fail(_validation_message(exc, "invalid input: "), EXIT_INVALID)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(code)


@asynccontextmanager
async def _runtime(*, with_models: bool) -> AsyncIterator[Runtime]:
    """An open runtime, always closed again. Without models it loads neither model file,
    which keeps the bookkeeping commands fast."""
    settings = load_settings()
    where = "connecting to PostgreSQL" if settings.storage.database_url else "starting PostgreSQL"
    label = f"{where} and loading models…" if with_models else f"{where}…"
    with _err.status(label):
        if with_models:
            runtime = await Runtime.open(settings)
        else:
            runtime = await Runtime.open(settings, model=None, embedder=HashEmbedder(EMBEDDING_DIM))
    try:
        yield runtime
    except asyncio.CancelledError:
        # Ctrl-C: a model call may still be running in its worker thread, and closing the
        # llama.cpp model under it crashes the process. Close only the database; the model
        # goes with the process once asyncio.run has waited for that thread.
        await runtime.db.close()
        raise
    except BaseException:
        await runtime.close()
        raise
    else:
        await runtime.close()


def _parse_uuid(value: str, what: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise InvalidRequestError(f"not a {what} id: {value!r}") from None


def _configure_output(verbose: bool) -> None:
    """Log through the stderr console (so lines print above the spinner). Unless verbose,
    keep library chatter (weight-loading bars, deprecation notices) off the terminal."""
    handler = RichHandler(console=_err, show_path=False, show_time=verbose)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    if verbose:
        logging.captureWarnings(True)
    else:
        # Read when huggingface_hub is first imported, which happens later (model loading).
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)


# formatting ------------------------------------------------------------------------------


def _shorten(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


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


def _step_line(step: Step, max_steps: int) -> Text:
    tool, category, status, summary, _ = _step_cells(step)
    line = Text.assemble((f"step {step.step_index + 1}/{max_steps} ", "bold"), step.decision.value)
    if step.decision is DecisionKind.ACT:
        line.append(f" {tool} [{category}] → {status}: ")
    else:
        line.append(": ")
    line.append(_shorten(summary, 100), style="dim")
    if step.note:
        line.append(f"  ({_shorten(step.note, 80)})", style="italic")
    return line


def _list_table(title: str) -> Table:
    """A compact table: lists must stay readable in an 80-column terminal."""
    return Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )


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
            Text(_shorten(summary, 80)),
            Text(candidates),
            Text(_shorten(step.note or "", 120)),
        )
    return table


_STATUS_STYLE = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.RUNNING: "yellow",
    RunStatus.AWAITING_APPROVAL: "cyan",
}


def _print_run(run: TaskRun, agent_name: str | None = None) -> None:
    """The step log, then the outcome. Free text is printed as Text (never as markup)."""
    _out.print(_step_table(run))
    fields: list[tuple[str, str | None]] = [
        ("agent", agent_name or str(run.agent_id)),
        ("goal", run.goal),
        ("steps", f"{len(run.steps)} of at most {run.max_steps}"),
        ("result", run.result),
        ("reason", run.reason),
        ("run id", str(run.id)),
    ]
    status = Text.assemble(
        ("status: ", "bold"), (run.status.value, f"bold {_STATUS_STYLE[run.status]}")
    )
    _out.print(status, soft_wrap=True)
    for label, value in fields:
        if value:
            _out.print(Text.assemble((f"{label}: ", "bold"), value), soft_wrap=True)


def _run_exit_code(run: TaskRun) -> int:
    return {
        RunStatus.COMPLETED: 0,
        RunStatus.FAILED: EXIT_RUN_FAILED,
        RunStatus.CANCELLED: EXIT_RUN_CANCELLED,
    }.get(run.status, EXIT_ERROR)


async def _run_live(
    runtime: Runtime,
    org: str,
    agent: Agent,
    goal: str,
    max_steps: int | None,
    name: str,
    run_mode: RunMode = RunMode.EXECUTE,
) -> TaskRun:
    """Run autonomously, printing each step as it lands under a spinner on stderr.

    ``start_run`` then ``resume_run`` is what ``run_autonomous`` does; split, the run id is
    known before the first step, so it can be shown at once and named if interrupted.
    """
    run = await runtime.start_run(
        org,
        agent.id,
        goal,
        max_steps=max_steps,
        name=name,
        principal=_operator(org),
        run_mode=run_mode,
    )
    return await _drive_live(runtime, org, run, agent, resume=False)


async def _drive_live(
    runtime: Runtime, org: str, run: TaskRun, agent: Agent, *, resume: bool
) -> TaskRun:
    """Drive a RUNNING run from its next step, printing each step as it lands. A run this
    command just started is driven directly; resuming another is a use case of its own."""
    first = len(run.steps) + 1
    _err.print(
        Text(f"run {run.id}: {agent.name}, step {first} of at most {run.max_steps}"),
        soft_wrap=True,
    )
    status: Status = _err.status(f"step {first}/{run.max_steps}: deciding…")

    def on_step(step: Step) -> None:
        _err.print(_step_line(step, run.max_steps), soft_wrap=True)
        status.update(f"step {step.step_index + 2}/{run.max_steps}: deciding…")

    try:
        with status:
            if not resume:
                return await runtime.drive_run(org, run.id, on_step=on_step)
            return await runtime.resume_run(org, run.id, on_step=on_step, principal=_operator(org))
    except asyncio.CancelledError:
        _err.print(Text(f"run {run.id} was interrupted and stays RUNNING"), soft_wrap=True)
        raise


async def _resume_or_wait(
    runtime: Runtime, org: str, run: TaskRun, agent: Agent, *, wait: bool
) -> TaskRun:
    """Drive the run here; if another driver holds its lease, say who, and with ``wait``
    wait for the run to end, taking it over whenever its lease is free."""
    operator = _operator(org)
    run = await _drive_live(runtime, org, run, agent, resume=True)
    told = False
    while run.status is RunStatus.RUNNING:
        holder = await runtime.run_lease(org, run.id, principal=operator)
        if not holder.live:  # free again (its driver stopped): ours to drive
            run = await _drive_live(runtime, org, run, agent, resume=True)
            continue
        until = f"{holder.expires_at:%Y-%m-%d %H:%M:%S %Z}" if holder.expires_at else "?"
        if not wait:
            _err.print(
                Text(
                    f"run {run.id} is being driven by {holder.owner} (lease renewed, next "
                    f"expiry {until}); not resumed here. --wait waits for it to end"
                ),
                soft_wrap=True,
            )
            return run
        if not told:
            _err.print(
                Text(f"run {run.id} is being driven by {holder.owner}; waiting for it to end"),
                soft_wrap=True,
            )
            told = True
        await asyncio.sleep(min(1.0, runtime.settings.runs.lease_renew_s))
        if await runtime.run_status(org, run.id, principal=operator) is not RunStatus.RUNNING:
            run = await runtime.get_run(org, run.id, principal=operator)
    return run


# commands --------------------------------------------------------------------------------


@app.callback()
def _global(
    ctx: typer.Context,
    org: Annotated[
        str, typer.Option("--org", envvar="CORTEX_ORG", help="Organisation (tenant) id.")
    ] = "default",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
) -> None:
    """A CoALA agent runtime. Settings come from CORTEX_* environment variables."""
    _configure_output(verbose)
    ctx.obj = _Options(org=org)


def _org(ctx: typer.Context) -> str:
    options: _Options = ctx.find_root().obj
    return options.org


def _operator(org: str) -> Principal:
    """Who the CLI acts as: the person at this machine (an admin of ``org``; audited as
    ``operator``). The core decides and audits every command as that principal."""
    return Principal.operator(org)


@app.command()
def demo(
    ctx: typer.Context,
    goal: Annotated[str, typer.Argument(help="What the demo agent should do.")] = DEMO_GOAL,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Step budget (default from settings).")
    ] = None,
) -> None:
    """Run the demo agent autonomously on the embedded default (PostgreSQL, the packaged chat
    model CORTEX_MODEL_NAME, MiniLM)."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=True) as runtime:
            agent = await _demo_agent(runtime, org)
            run = await _run_live(runtime, org, agent, goal, max_steps, "demo")
            _print_run(run, agent.name)
            return _run_exit_code(run)

    _execute(work())


async def _demo_agent(runtime: Runtime, org: str) -> Agent:
    """The demo agent: reused by name, created on first use."""
    operator = _operator(org)
    try:
        return await runtime.get_agent(org, DEMO_AGENT, principal=operator)
    except NotFoundError:
        pass
    try:
        return await runtime.create_agent(
            org, DEMO_AGENT, persona=DEMO_PERSONA, mode=AgentMode.AUTONOMOUS, principal=operator
        )
    except InvalidRequestError:
        # Another process created it between our read and our write.
        return await runtime.get_agent(org, DEMO_AGENT, principal=operator)


@app.command("run")
def run_command(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="Agent name or id.")],
    goal: Annotated[str, typer.Argument(help="The goal of the run.")],
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Step budget (default from settings).")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="A label for the run.")] = "",
    run_mode: Annotated[
        RunMode,
        typer.Option(
            "--mode", help="execute; dry_run: only READ tools run; shadow: writes are proposals."
        ),
    ] = RunMode.EXECUTE,
) -> None:
    """Run an agent autonomously against GOAL. Exit 0 if COMPLETED, 3 if FAILED, 5 if
    CANCELLED."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=True) as runtime:
            found = await runtime.get_agent(org, agent, principal=_operator(org))
            run = await _run_live(runtime, org, found, goal, max_steps, name, run_mode)
            _print_run(run, found.name)
            return _run_exit_code(run)

    _execute(work())


@agents_app.command("create")
def agents_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A unique name in the organisation.")],
    persona: Annotated[str, typer.Option("--persona", help="Who the agent is.")] = "",
    mode: Annotated[Mode, typer.Option("--mode", case_sensitive=False)] = Mode.interactive,
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", help="A tool it may use (repeat; default: every built-in)."),
    ] = None,
    skill: Annotated[
        list[str] | None, typer.Option("--skill", help="A skill, in words (repeat).")
    ] = None,
    critic: Annotated[
        bool,
        typer.Option("--critic", help="Review each final answer or reply before it is given."),
    ] = False,
) -> None:
    """Create an agent."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            agent = await runtime.create_agent(
                org,
                name,
                persona=persona,
                mode=AgentMode(mode.value.upper()),
                tools=tool or None,
                skills=skill or (),
                critic=critic,
                principal=_operator(org),
            )
        _out.print(Text(f"created agent {agent.name} ({agent.id})"), soft_wrap=True)
        _out.print(
            Text(f"mode: {agent.mode.value}; tools: {', '.join(agent.tools)}"), soft_wrap=True
        )
        return 0

    _execute(work())


@agents_app.command("list")
def agents_list(ctx: typer.Context) -> None:
    """List the organisation's agents."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            agents = await runtime.list_agents(org, principal=_operator(org))
        table = _list_table(f"agents in {org}")
        table.add_column("name", min_width=10, overflow="fold")
        table.add_column("id", no_wrap=True)
        table.add_column("mode", no_wrap=True)
        table.add_column("tools, skills", min_width=16, overflow="fold")
        for agent in agents:
            table.add_row(
                Text(agent.name),
                str(agent.id),
                agent.mode.value.lower(),
                Text(", ".join((*agent.tools, *(f"“{_shorten(s, 40)}”" for s in agent.skills)))),
            )
        _out.print(table)
        return 0

    _execute(work())


@app.command("ingest", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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
    _exec_job(
        ["-m", "jobs.ingest", "--org", _org(ctx), "--collection", collection, *paths, *ctx.args]
    )


def _exec_job(args: list[str]) -> NoReturn:
    """Become ``python ARGS`` (``-m jobs.<job> ...``).

    The jobs live in the Ray layer (jobs/), which the core never imports: a job runs as its
    own process, exactly as ``ray job submit`` would run it, and its exit code is the
    command's."""
    if importlib.util.find_spec("jobs") is None:
        _fail(
            f"the job {args[1]} is not installed: run from a cortex-ray checkout or "
            "pip install 'cortex-ray[ray]'",
            EXIT_ERROR,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *args])


def _job_flags(given: dict[str, Any]) -> list[str]:
    """The flags of a job's command line, from a command's parameters (same names, kebab
    case): those not given (``None``, ``False``) are left to the job's defaults."""
    flags: list[str] = []
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            for item in value:
                flags += [flag, str(item)]
        else:
            flags += [flag, str(value)]
    return flags


def _run_job(module: str, flags: list[str], print_command: bool) -> NoReturn:
    """Run the job ``python -m MODULE FLAGS``, or with ``print_command`` print that command
    line (for ``ray job submit --working-dir . -- ...``) and exit."""
    if print_command:
        typer.echo(shlex.join(["python", "-m", module, *flags]))
        raise typer.Exit(0)
    _exec_job(["-m", module, *flags])


_PRINT_COMMAND = typer.Option(
    "--print-command",
    help="Print the job's command line (to submit with ray job submit) instead of running it.",
)


@runs_app.command("show")
def runs_show(
    ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="The run's id.")]
) -> None:
    """Show a run's step log and outcome."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        operator = _operator(org)
        async with _runtime(with_models=False) as runtime:
            run = await runtime.get_run(org, key, principal=operator)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
        _print_run(run, agent.name)
        return 0

    _execute(work())


@app.command("trace")
def trace_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The spans as JSON.")] = False,
) -> None:
    """Print a run's trace as a waterfall: each span's phase, status, duration and place in
    time, tool spans with their action category and access decision (the spans this
    deployment keeps locally: docs/operations.md, "Traces")."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        async with _runtime(with_models=False) as runtime:
            found = await runtime.run_trace(org, key, principal=_operator(org))
            where = runtime.tracing.sinks if runtime.tracing is not None else ()
        if as_json:
            _out.print_json(found.model_dump_json())
            return 0
        if not found.spans:
            _err.print(
                f"no spans are kept here for run {key} (spans kept here: "
                f"{'yes' if 'local' in where else 'no'}; CORTEX_TRACING__LOCAL and "
                "OTEL_EXPORTER_OTLP_ENDPOINT decide where they go)"
            )
            return 1
        _out.print(
            f"run {key}: {len(found.spans)} spans in {len(found.trace_ids)} trace(s) "
            f"{', '.join(found.trace_ids)}",
            highlight=False,
        )
        for line in waterfall(found):
            _out.print(line, highlight=False, markup=False, soft_wrap=True)
        return 0

    _execute(work())


@app.command("diagnose")
def diagnose_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The timeline as JSON.")] = False,
) -> None:
    """Print a run's diagnostic timeline: each attempt, model call (model, schema, time,
    tokens), decision with its candidates and scores, tool call with its input and result
    (scrubbed), retrieval evidence, stall and loop, and how it ended, with what it cost.
    Exit code 3 when the run is stalled now."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        async with _runtime(with_models=False) as runtime:
            found = await runtime.run_diagnostics(org, key, principal=_operator(org))
        if as_json:
            _out.print_json(found.model_dump_json())
        else:
            for line in found.lines():
                _out.print(line, highlight=False, markup=False, soft_wrap=True)
        return 3 if found.stalled else 0

    _execute(work())


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
    is not driven here; the command says who holds it and exits 1, or with --wait waits.
    """
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        operator = _operator(org)
        async with _runtime(with_models=True) as runtime:
            run = await runtime.get_run(org, key, principal=operator)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
            if run.status is RunStatus.RUNNING:
                run = await _resume_or_wait(runtime, org, run, agent, wait=wait)
            else:
                _err.print(Text(f"run {run.id} already ended: {run.status.value}"))
        _print_run(run, agent.name)
        return _run_exit_code(run)

    _execute(work())


@runs_app.command("cancel")
def runs_cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded).")] = None,
) -> None:
    """Cancel a RUNNING run (or one awaiting approval): it ends CANCELLED ("cancelled by
    operator"); its driver stops at its next step. A run that already ended is shown as it
    is."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        operator = _operator(org)
        async with _runtime(with_models=False) as runtime:
            before = await runtime.run_status(org, key, principal=operator)
            run = await runtime.cancel_run(org, key, principal=operator, reason=reason)
            agent = await runtime.get_agent(org, run.agent_id, principal=operator)
        if before.ended:
            _err.print(Text(f"run {run.id} already ended: {run.status.value}"))
        _print_run(run, agent.name)
        return 0

    _execute(work())


@runs_app.command("list")
def runs_list(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 50,
) -> None:
    """List recent runs, newest first."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            operator = _operator(org)
            runs = await runtime.list_runs(org, agent_ref=agent, limit=limit, principal=operator)
            names = {a.id: a.name for a in await runtime.list_agents(org, principal=operator)}
        table = _list_table(f"runs in {org}")
        table.add_column("id", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("created", no_wrap=True)
        table.add_column("agent: goal", min_width=16, overflow="fold")
        for run in runs:
            agent_name = names.get(run.agent_id, str(run.agent_id))
            label = f"{agent_name} ({run.name})" if run.name else agent_name
            table.add_row(
                str(run.id),
                Text(run.status.value, style=_STATUS_STYLE[run.status]),
                run.created_at.strftime("%m-%d %H:%M"),
                Text(_shorten(f"{label}: {run.goal}", 80)),
            )
        _out.print(table)
        return 0

    _execute(work())


class KeyKind(StrEnum):
    """The ``--kind`` choices of a key's principal."""

    user = "user"
    service = "service"


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    principal: Annotated[str, typer.Argument(help="The principal id the key acts as.")],
    name: Annotated[str, typer.Option("--name", help="A label for the key.")] = "",
    admin: Annotated[
        bool | None,
        typer.Option("--admin/--no-admin", help="May create and change agents."),
    ] = None,
    grant: Annotated[
        list[str] | None,
        typer.Option("--grant", help="A tool the principal may use ('*' for all; repeat)."),
    ] = None,
    kind: Annotated[KeyKind, typer.Option("--kind", case_sensitive=False)] = KeyKind.user,
) -> None:
    """Create a bearer key for PRINCIPAL in --org; it is shown once (only its hash is kept).

    A new principal gets what the options say (no --grant: no tools, fail closed); for an
    existing one, --admin/--no-admin and --grant replace its settings."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            created = await runtime.create_api_key(
                org,
                principal,
                name=name,
                admin=admin,
                grant=grant,
                kind=PrincipalKind(kind.value.upper()),
                principal=_operator(org),
            )
        key, key_id, wanted = created.key, created.key_id, created.principal
        _out.print(Text(f"key id: {key_id}"), soft_wrap=True)
        role = " (admin)" if wanted.is_admin else ""
        _out.print(Text(f"principal: {principal} in {org}{role}"), soft_wrap=True)
        tools = ", ".join(sorted(wanted.grant.tools)) if wanted.grant else ""
        _out.print(Text(f"grant: {tools or 'none (no tool calls; add --grant)'}"), soft_wrap=True)
        _out.print(Text(f"API key (shown once): {key}"), soft_wrap=True)
        for warning in created.warnings:
            _err.print(Text(f"warning: {warning}"), soft_wrap=True)
        return 0

    _execute(work())


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="The key's id.")]
) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    org = _org(ctx)

    async def work() -> int:
        parsed = _parse_uuid(key_id, "key")
        async with _runtime(with_models=False) as runtime:
            revoked = await runtime.revoke_api_key(org, parsed, principal=_operator(org))
        when = revoked.revoked_at.isoformat(timespec="seconds")
        done = "revoked key" if revoked.revoked_now else "key already revoked:"
        _out.print(Text(f"{done} {parsed} (revoked at {when})"), soft_wrap=True)
        return 0

    _execute(work())


@proposals_app.command("list")
def proposals_list(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="Agent name or id.")],
    pending: Annotated[bool, typer.Option("--pending", help="Only undecided ones.")] = False,
) -> None:
    """List an agent's proposed procedural edits, oldest first."""
    org = _org(ctx)

    async def work() -> int:
        status = ProposalStatus.PENDING if pending else None
        async with _runtime(with_models=False) as runtime:
            _, proposals = await runtime.list_proposals(
                org, agent, status=status, principal=_operator(org)
            )
        table = _list_table(f"proposals for {agent} in {org}")
        table.add_column("id", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("change", min_width=16, overflow="fold")
        for p in proposals:
            value = p.value if isinstance(p.value, str) else "; ".join(p.value)
            table.add_row(str(p.id), p.status.value, Text(_shorten(f"{p.field}: {value}", 80)))
        _out.print(table)
        return 0

    _execute(work())


def _decide(ctx: typer.Context, proposal_id: str, approve: bool) -> None:
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(proposal_id, "proposal")
        async with _runtime(with_models=False) as runtime:
            decided = await runtime.decide_proposal(
                org, key, approve=approve, principal=_operator(org)
            )
        _out.print(Text(f"proposal {decided.id}: {decided.status.value}"), soft_wrap=True)
        return 0

    _execute(work())


@proposals_app.command("approve")
def proposals_approve(
    ctx: typer.Context, proposal_id: Annotated[str, typer.Argument(help="The proposal's id.")]
) -> None:
    """Approve a proposed edit: the agent's persona or skills change, recorded as memory."""
    _decide(ctx, proposal_id, True)


@proposals_app.command("reject")
def proposals_reject(
    ctx: typer.Context, proposal_id: Annotated[str, typer.Argument(help="The proposal's id.")]
) -> None:
    """Reject a proposed edit: nothing changes."""
    _decide(ctx, proposal_id, False)


# eval: regression cases from runs, suites, replays -----------------------------------------


def _read_suite_file(path: Path) -> EvalSuite:
    """A suite from a JSON file; a bad file names itself, and the line or the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    try:
        return EvalSuite.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise InvalidRequestError(_validation_message(exc, f"{path}: ")) from None


def _checks_from(values: list[str]) -> list[Check] | None:
    if not values:
        return None
    adapter: pydantic.TypeAdapter[Check] = pydantic.TypeAdapter(Check)
    checks = []
    for i, value in enumerate(values, 1):
        try:
            checks.append(adapter.validate_json(value))
        except pydantic.ValidationError as exc:
            raise InvalidRequestError(_validation_message(exc, f"--check {i}: ")) from None
    return checks


def _print_eval_run(ran: EvalRun) -> None:
    table = _list_table(
        f"eval run {ran.id}: {ran.suite} v{ran.suite_version}, {ran.mode.value}"
        + (f", {ran.model}" if ran.model else "")
        + "".join(f", {k}={v}" for k, v in ran.overrides.items())
    )
    table.add_column("case", overflow="fold")
    table.add_column("result", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("tools", justify="right", no_wrap=True)
    table.add_column("why", min_width=20, overflow="fold")
    for r in ran.results:
        failed = [v for v in r.verdicts if v.passed is False]
        skipped = [v for v in r.verdicts if v.passed is None]
        why = "; ".join(f"{v.kind}: {v.detail}" for v in failed) or r.error or ""
        if not why and skipped:
            why = "; ".join(f"{v.kind}: {v.detail}" for v in skipped)
        m = r.outcome.metrics
        table.add_row(
            Text(r.case),
            Text("pass" if r.passed else "FAIL", style="green" if r.passed else "red"),
            str(m.steps),
            f"{m.tool_correctness:.2f}",
            Text(_shorten(why, 240)),
        )
    _out.print(table)
    t = ran.metrics
    _out.print(
        Text(
            f"passed {ran.passed}/{ran.total} ({t.success_rate:.0%}); tool correctness "
            f"{t.tool_correctness:.2f}; mean steps {t.mean_steps:g}; model calls "
            f"{t.model_calls}; tokens {t.prompt_tokens}+{t.completion_tokens}; decide "
            f"p50 {t.decide_ms_p50:g} ms, p95 {t.decide_ms_p95:g} ms; diverged {t.diverged}; "
            f"prompts changed {t.prompt_changes}"
        )
    )
    _out.print(Text(f"eval run id: {ran.id}"))


@eval_app.command("add")
def eval_add(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="An ended run's id.")],
    suite: Annotated[str, typer.Option("--suite", help="The suite to add the case to.")],
    name: Annotated[
        str | None, typer.Option("--name", help="The case's name (default: run-<id>).")
    ] = None,
    check: Annotated[
        list[str] | None,
        typer.Option(
            "--check",
            help='A check as JSON, e.g. \'{"kind": "result_contains", "values": ["Paris"]}\' '
            "(repeat; default: the run's status and every decision as recorded).",
        ),
    ] = None,
) -> None:
    """Turn a run into a regression case: the suite's next version holds it."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(run_id, "run")
        checks = _checks_from(check or [])
        operator = _operator(org)
        async with _runtime(with_models=False) as runtime:
            case = await runtime.eval_case_from_run(
                org, key, name=name, checks=checks, principal=operator
            )
            saved = await runtime.add_eval_case(org, suite, case, principal=operator)
        _out.print(
            Text(
                f"case {case.name} ({len(case.cassette.steps)} steps, {len(case.checks)} "
                f"checks) → suite {saved.name} version {saved.version}, {len(saved.cases)} cases"
            )
        )
        return 0

    _execute(work())


@eval_app.command("import")
def eval_import(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A suite as JSON (what `eval export` writes).")],
) -> None:
    """Save a suite file as the suite's next version (the same cases: the same version)."""
    org = _org(ctx)

    async def work() -> int:
        suite = _read_suite_file(path)
        async with _runtime(with_models=False) as runtime:
            saved = await runtime.save_eval_suite(org, suite, principal=_operator(org))
        _out.print(Text(f"suite {saved.name} version {saved.version}, {len(saved.cases)} cases"))
        return 0

    _execute(work())


@eval_app.command("export")
def eval_export(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The suite's name.")],
    version: Annotated[int | None, typer.Option("--version", help="Default: latest.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: stdout).")
    ] = None,
) -> None:
    """Write a suite version as JSON (to keep it in a repository, or import it elsewhere)."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            suite = await runtime.get_eval_suite(
                org, name, version=version, principal=_operator(org)
            )
        body = suite.model_dump(mode="json", include={"name", "description", "cases"})
        text = json.dumps(body, indent=1, ensure_ascii=False) + "\n"
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text, encoding="utf-8")
            _err.print(Text(f"wrote {output}: {suite.name} version {suite.version}"))
        return 0

    _execute(work())


class EvalModeChoice(StrEnum):
    replay = "replay"
    live = "live"


@eval_app.command("run")
def eval_run(
    ctx: typer.Context,
    suite: Annotated[
        str, typer.Argument(help="A saved suite's name, or a suite file (.json) to import first.")
    ],
    version: Annotated[int | None, typer.Option("--version", help="Default: latest.")] = None,
    mode: Annotated[
        EvalModeChoice,
        typer.Option(
            "--mode",
            help="replay: the recorded model outputs answer (no model, deterministic); "
            "live: the configured model answers, the recorded results answer the tools.",
        ),
    ] = EvalModeChoice.replay,
    judge: Annotated[
        bool, typer.Option("--judge", help="Ask the configured model the model-scored checks.")
    ] = False,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE: replay with this DECIDE setting changed (candidates, evaluation, "
            "structured_retries, show_action_space, progress_earlier_chars); each case "
            "otherwise uses the settings it was recorded with. Repeatable.",
        ),
    ] = None,
) -> None:
    """Run a suite: each case replayed and checked; results stored. Exit 4 if a case fails."""
    org = _org(ctx)
    overrides: dict[str, Any] = {}
    for item in sets or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            _fail(f"--set {item!r}: expected KEY=VALUE", EXIT_INVALID)
        overrides[key.strip()] = value.strip()

    as_file = Path(suite)
    from_file = suite.endswith(".json") or as_file.is_file()

    async def work() -> int:
        loaded = _read_suite_file(as_file) if from_file else None
        operator = _operator(org)
        live = EvalMode(mode.value) is EvalMode.LIVE
        async with _runtime(with_models=live or judge) as runtime:
            name, which = suite, version
            if loaded is not None:
                saved = await runtime.save_eval_suite(org, loaded, principal=operator)
                name, which = saved.name, saved.version
            with _err.status(f"running {name}…"):
                ran = await runtime.run_eval_suite(
                    org, name, version=which, mode=EvalMode(mode.value), judge=judge,
                    overrides=overrides or None, principal=operator,
                )  # fmt: skip
        _print_eval_run(ran)
        return 0 if ran.passed == ran.total else EXIT_EVAL_FAILED

    _execute(work())


@eval_app.command("show")
def eval_show(
    ctx: typer.Context, eval_run_id: Annotated[str, typer.Argument(help="The eval run's id.")]
) -> None:
    """Show a stored eval run, case by case."""
    org = _org(ctx)

    async def work() -> int:
        key = _parse_uuid(eval_run_id, "eval run")
        async with _runtime(with_models=False) as runtime:
            ran = await runtime.get_eval_run(org, key, principal=_operator(org))
        _print_eval_run(ran)
        return 0

    _execute(work())


@eval_app.command("list")
def eval_list(
    ctx: typer.Context,
    suite: Annotated[str | None, typer.Option("--suite", help="Only this suite's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 50,
) -> None:
    """List the suites (latest versions) and recent eval runs."""
    org = _org(ctx)

    async def work() -> int:
        operator = _operator(org)
        async with _runtime(with_models=False) as runtime:
            suites = await runtime.list_eval_suites(org, principal=operator)
            runs = await runtime.list_eval_runs(org, suite=suite, limit=limit, principal=operator)
        table = _list_table(f"eval suites in {org}")
        for column in ("suite", "version", "cases", "saved"):
            table.add_column(column, no_wrap=True)
        for s in suites:
            table.add_row(
                s.name, str(s.version), str(s.cases), s.created_at.strftime("%m-%d %H:%M")
            )
        _out.print(table)
        runs_table = _list_table("eval runs")
        for column in ("id", "suite", "mode", "passed", "started"):
            runs_table.add_column(column, no_wrap=True)
        for r in runs:
            runs_table.add_row(
                str(r.id),
                f"{r.suite} v{r.suite_version}",
                r.mode.value + (f" ({r.model})" if r.model else ""),
                f"{r.passed}/{r.total}",
                r.started_at.strftime("%m-%d %H:%M"),
            )
        _out.print(runs_table)
        return 0

    _execute(work())


@eval_app.command("compare")
def eval_compare(
    ctx: typer.Context,
    run_a: Annotated[str, typer.Argument(help="The earlier eval run's id (the baseline).")],
    run_b: Annotated[str, typer.Argument(help="The later eval run's id.")],
) -> None:
    """Compare two eval runs case by case: fixed, broken, changed; metric deltas (b − a)."""
    org = _org(ctx)

    async def work() -> int:
        a, b = _parse_uuid(run_a, "eval run"), _parse_uuid(run_b, "eval run")
        async with _runtime(with_models=False) as runtime:
            cmp = await runtime.compare_eval_runs(org, a, b, principal=_operator(org))
        _out.print(
            Text(
                f"a: {cmp.a.suite} v{cmp.a.suite_version} {cmp.a.mode.value} "
                f"{cmp.a.passed}/{cmp.a.total}   b: {cmp.b.suite} v{cmp.b.suite_version} "
                f"{cmp.b.mode.value} {cmp.b.passed}/{cmp.b.total}"
            )
        )
        _out.print(Text(f"fixed: {', '.join(cmp.fixed) or '-'}"))
        _out.print(Text(f"broken: {', '.join(cmp.broken) or '-'}"))
        table = _list_table("changed cases (a → b)")
        for column in ("case", "passed", "steps", "tools", "diverged at"):
            table.add_column(column, no_wrap=True)
        for c in cmp.changed:
            table.add_row(
                Text(str(c["case"])),
                " → ".join("pass" if p else "FAIL" for p in c["passed"]),
                " → ".join(str(x) for x in c["steps"]),
                " → ".join(f"{x:.2f}" for x in c["tool_correctness"]),
                " → ".join("-" if d is None else f"step {d + 1}" for d in c["divergence"]),
            )
        _out.print(table)
        deltas = ", ".join(f"{k} {v:+g}" for k, v in cmp.deltas.items())
        _out.print(Text(f"b − a: {deltas}"))
        if cmp.only_a or cmp.only_b:
            only_a, only_b = ", ".join(cmp.only_a) or "-", ", ".join(cmp.only_b) or "-"
            _out.print(Text(f"only in a: {only_a}; only in b: {only_b}"))
        return 0

    _execute(work())


deploy_app = typer.Typer(
    help="Plan a deployment on a GPU cluster (docs/deployment.md).", no_args_is_help=True
)
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("plan")
def deploy_plan(
    manifest: Annotated[
        Path,
        typer.Argument(help="A KubeRay RayService manifest, or a cluster launcher file."),
    ],
    serve_config: Annotated[
        Path | None,
        typer.Option(
            "--serve-config",
            help="The Serve config file (default: the RayService's serveConfigV2).",
        ),
    ] = None,
) -> None:
    """The GPUs the Serve config needs (the LLM's tensor x pipeline parallel x replicas, the
    GPU embedder and reranker, plus the upgrade's surge) against the GPU worker groups; exits
    1 when they do not fit."""
    from cortex_ray.deploy import load_plan

    try:
        plan = load_plan(manifest, serve_config)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        _fail(f"{manifest}: {exc}", EXIT_INVALID)
    table = _list_table("GPU deployments (at max replicas)")
    for column in ("app", "deployment", "GPUs/replica", "max replicas", "GPUs"):
        table.add_column(column, no_wrap=True)
    for d in plan.deployments:
        table.add_row(
            d.app, d.deployment, f"{d.gpus_per_replica:g}", str(d.max_replicas), f"{d.gpus:g}"
        )
    _out.print(table)
    groups = ", ".join(f"{g.name} {g.gpus_per_node} x {g.max_nodes}" for g in plan.groups)
    surge = (
        f"{plan.upgrade}, maxSurgePercent {plan.max_surge_percent}"
        if plan.upgrade == "NewClusterWithIncrementalUpgrade"
        else ("None: in place" if plan.upgrade == "None" else plan.upgrade)
    )
    _out.print(Text(f"LLM: {plan.llm_gpus:g} GPUs; all deployments: {plan.steady_gpus}"))
    _out.print(Text(f"upgrade surge ({surge}): {plan.surge_gpus}; peak: {plan.peak_gpus}"))
    _out.print(Text(f"GPU worker groups: {groups or 'none'} = {plan.capacity_gpus} GPUs"))
    if not plan.fits:
        _fail("the plan does not fit: " + "; ".join(plan.problems), EXIT_ERROR)
    _out.print(Text("fits"))


# context graph and source health ----------------------------------------------------------


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
    org = _org(ctx)

    async def work() -> int:
        valid, known = _time_option(valid_at, "--valid-at"), _time_option(known_at, "--known-at")
        async with _runtime(with_models=False) as runtime:
            result = await runtime.search_graph(
                org, terms=terms, depth=depth, max_facts=max_facts, valid_at=valid,
                known_at=known, principal=_operator(org),
            )  # fmt: skip
        if as_json:
            _out.print_json(result.model_dump_json())
            return 0
        table = _list_table(f"facts about {', '.join(terms)} in {org}")
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
        _out.print(table)
        if not result.facts:
            _err.print("no facts (no entity by that name, or none you may read)")
        return 0

    _execute(work())


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
    org = _org(ctx)

    async def work() -> int:
        s_type, s_name = _typed_name(subject, "subject")
        o_type, o_name = _typed_name(obj, "object")
        triple = Triple(
            subject_type=s_type, subject=s_name, predicate=predicate, object_type=o_type,
            object=o_name, functional=functional, confidence=confidence,
            valid_from=_time_option(valid_from, "--valid-from"),
        )  # fmt: skip
        async with _runtime(with_models=False) as runtime:
            report = await runtime.submit_triples(org, [triple], principal=_operator(org))
        _out.print(
            Text(
                f"run {report.run_id}: {report.assertions} new fact(s), "
                f"{report.entities} new entities, {report.closed} closed"
            )
        )
        return 0

    _execute(work())


@graph_app.command("extract")
def graph_extract(
    ctx: typer.Context,
    collection: Annotated[
        str | None, typer.Option("--collection", help="Only this collection's versions.")
    ] = None,
    source: Annotated[
        list[str] | None, typer.Option("--source", help="Only this source id (repeatable).")
    ] = None,
    since_version: Annotated[
        int | None, typer.Option("--since-version", min=1, help="Only versions numbered ≥ N.")
    ] = None,
    model_version: Annotated[
        str | None,
        typer.Option("--model-version", help="The model's name recorded on its facts."),
    ] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="Passages a model call.")] = None,
    actors: Annotated[int | None, typer.Option("--actors", help="Model actors.")] = None,
    in_flight: Annotated[
        int | None, typer.Option("--in-flight", help="Calls each actor keeps going.")
    ] = None,
    num_gpus: Annotated[
        float | None, typer.Option("--num-gpus", help="GPUs per actor (model_backend=local).")
    ] = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray address.")] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="PostgreSQL DSN.")
    ] = None,
    print_command: Annotated[bool, _PRINT_COMMAND] = False,
) -> None:
    """Extract entities and relationships from a collection's published passages with the
    chat model (optional: nothing else runs it).

    Runs ``python -m jobs.graph_extract`` (a Ray job) here; unset options take the
    CORTEX_INGEST__GRAPH_MODEL_* settings. Prints the job's JSON report (docs/graph.md).
    """
    if not collection and not source:
        _fail("give --collection or --source (what to extract)", EXIT_INVALID)
    for value in source or ():
        try:
            UUID(value)
        except ValueError:
            _fail(f"--source: not a source id: {value!r}", EXIT_INVALID)
    flags = _job_flags(
        {
            "org": _org(ctx), "collection": collection, "source": source,
            "since_version": since_version, "model_version": model_version, "batch": batch,
            "actors": actors, "in_flight": in_flight, "num_gpus": num_gpus,
            "address": address, "database_url": database_url,
        }
    )  # fmt: skip
    _run_job("jobs.graph_extract", flags, print_command)


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
    print_command: Annotated[bool, _PRINT_COMMAND] = False,
) -> None:
    """Project the context graph's outbox into Neo4j (every organisation's), once or
    ``--follow``; ``--rebuild`` projects everything again.

    Runs ``python -m jobs.graph_project`` here; prints a JSON report per pass
    (docs/graph.md).
    """
    if wipe and not rebuild:
        _fail("--wipe only goes with --rebuild", EXIT_INVALID)
    flags = _job_flags(
        {
            "uri": uri, "user": user, "password": password, "database": database,
            "database_url": database_url, "batch": batch, "target": target,
            "rebuild": rebuild, "wipe": wipe, "follow": follow,
        }
    )  # fmt: skip
    _run_job("jobs.graph_project", flags, print_command)


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
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            await runtime.set_freshness_policy(
                org, collection, every, expires_after_s=expires_after, path=path,
                principal=_operator(org),
            )  # fmt: skip
        _out.print(Text(f"{collection}{':' + path if path else ''}: expected every {every:g} s"))
        return 0

    _execute(work())


@sources_app.command("check")
def sources_check(
    ctx: typer.Context, collection: Annotated[str, typer.Argument(help="The collection.")]
) -> None:
    """Check every source of a collection now and keep the report; exit 4 when a source
    is unhealthy."""
    org = _org(ctx)

    async def work() -> int:
        async with _runtime(with_models=False) as runtime:
            report = await runtime.check_source_health(org, collection, principal=_operator(org))
        table = _list_table(f"health of {collection} ({report.sources} sources)")
        table.add_column("source", overflow="fold")
        table.add_column("finding", no_wrap=True)
        table.add_column("version", no_wrap=True)
        table.add_column("detail", overflow="fold")
        for f in report.findings:
            version = "-" if f.latest_version is None else f"v{f.latest_version}"
            table.add_row(Text(f.path), f.kind, version, Text(f.detail))
        _out.print(table)
        unhealthy = [f for f in report.findings if f.kind != "UNKNOWN_FRESHNESS"]
        return EXIT_EVAL_FAILED if unhealthy else 0

    _execute(work())


def main() -> None:
    """The ``cortex-ray`` console script."""
    app()


# Commands kept in their own modules (issue 18: connectors, grants, the audit log).
from cortex_ray._cli_governance import (  # noqa: E402
    approvals_app,
    connectors_app,
    grants_app,
    runs_acceptance,
    runs_label,
    runs_report,
    schedules_app,
    secrets_app,
)
from cortex_ray._cli_governance import audit as _audit_command  # noqa: E402
from cortex_ray._cli_workflows import workflow_app  # noqa: E402

app.add_typer(connectors_app, name="connectors")
app.add_typer(grants_app, name="grants")
app.add_typer(approvals_app, name="approvals")
app.add_typer(secrets_app, name="secrets")
app.add_typer(schedules_app, name="schedules")
app.add_typer(workflow_app, name="workflow")
app.command("audit")(_audit_command)
runs_app.command("report")(runs_report)
runs_app.command("label")(runs_label)
runs_app.command("acceptance")(runs_acceptance)

if __name__ == "__main__":
    main()
