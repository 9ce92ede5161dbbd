"""``cortex-ray demo`` and ``cortex-ray run``: run an agent autonomously here, each step
printed as it lands."""

from __future__ import annotations

from typing import Annotated

import typer

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Agent, AgentMode, RunMode, TaskRun
from cortex_ray.cli._common import as_operator, execute, open_runtime, org_of
from cortex_ray.cli._runview import drive_live, print_run, run_exit_code
from cortex_ray.runtime import Runtime

__all__ = ["demo", "run_command"]

DEMO_AGENT = "demo-agent"
DEMO_PERSONA = (
    "You are a concise, careful assistant. Use one tool at a time to make progress, "
    "remember facts worth keeping, and finish with a short answer as soon as the goal is met."
)
DEMO_GOAL = (
    "Find out the current date and time, remember it as a fact, "
    "and finish with a one-sentence answer."
)


def demo(
    ctx: typer.Context,
    goal: Annotated[str, typer.Argument(help="What the demo agent should do.")] = DEMO_GOAL,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Step budget (default from settings).")
    ] = None,
) -> None:
    """Run the demo agent autonomously on the embedded default (PostgreSQL, the packaged chat
    model CORTEX_MODEL_NAME, MiniLM)."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=True) as runtime:
            agent = await _demo_agent(runtime, org)
            run = await _run_live(runtime, org, agent, goal, max_steps, "demo")
            print_run(run, agent.name)
            return run_exit_code(run)

    execute(work())


async def _demo_agent(runtime: Runtime, org: str) -> Agent:
    """The demo agent: reused by name, created on first use."""
    operator = as_operator(org)
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
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=True) as runtime:
            found = await runtime.get_agent(org, agent, principal=as_operator(org))
            run = await _run_live(runtime, org, found, goal, max_steps, name, run_mode)
            print_run(run, found.name)
            return run_exit_code(run)

    execute(work())


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
        principal=as_operator(org),
        run_mode=run_mode,
    )
    return await drive_live(runtime, org, run, agent, resume=False)
