"""``cortex-ray agents ...``: create and list agents."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import AgentMode
from cortex_ray.cli._common import (
    as_operator,
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
    shorten,
)

__all__ = ["agents_app"]

agents_app = typer.Typer(help="Create and list agents.", no_args_is_help=True)


class Mode(StrEnum):
    """The ``--mode`` choices (lower case on the command line)."""

    interactive = "interactive"
    autonomous = "autonomous"


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
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            agent = await runtime.create_agent(
                org,
                name,
                persona=persona,
                mode=AgentMode(mode.value.upper()),
                tools=tool or None,
                skills=skill or (),
                critic=critic,
                principal=as_operator(org),
            )
        out.print(Text(f"created agent {agent.name} ({agent.id})"), soft_wrap=True)
        out.print(
            Text(f"mode: {agent.mode.value}; tools: {', '.join(agent.tools)}"), soft_wrap=True
        )
        return 0

    execute(work())


@agents_app.command("list")
def agents_list(ctx: typer.Context) -> None:
    """List the organisation's agents."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            agents = await runtime.list_agents(org, principal=as_operator(org))
        table = list_table(f"agents in {org}")
        table.add_column("name", min_width=10, overflow="fold")
        table.add_column("id", no_wrap=True)
        table.add_column("mode", no_wrap=True)
        table.add_column("tools, skills", min_width=16, overflow="fold")
        for agent in agents:
            table.add_row(
                Text(agent.name),
                str(agent.id),
                agent.mode.value.lower(),
                Text(", ".join((*agent.tools, *(f"“{shorten(s, 40)}”" for s in agent.skills)))),
            )
        out.print(table)
        return 0

    execute(work())
