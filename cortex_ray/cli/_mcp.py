"""``cortex-ray connectors mcp ...``: register MCP servers as connectors, list them and their
pinned tools, refresh (list and pin), approve a changed definition, override a tool's tier,
remove. Each command parses, calls ``Runtime.connectors`` as the local operator (the only
caller that may register a stdio server), renders."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import CapabilityTier, Principal
from cortex_ray.cli._common import execute, list_table, open_runtime, org_of, out
from cortex_ray.mcp import McpServerConfig, McpTransport, mcp_tool_name

__all__ = ["mcp_app"]

mcp_app = typer.Typer(
    help="MCP servers as connectors: register, pin their tools, approve changes.",
    no_args_is_help=True,
)


def _pairs(items: list[str] | None, option: str) -> dict[str, str]:
    found = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise InvalidRequestError(f"{option} needs NAME=SECRET, not {item!r}")
        found[key] = value
    return found


@mcp_app.command("add")
def mcp_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The connector's name (an identifier).")],
    url: Annotated[str | None, typer.Option("--url", help="Streamable HTTP endpoint.")] = None,
    command: Annotated[
        str | None, typer.Option("--command", help="stdio: the program to start.")
    ] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", help="stdio: an argument.")] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", help="HEADER=SECRET-NAME (repeat).")
    ] = None,
    bearer_secret: Annotated[
        str | None, typer.Option("--bearer-secret", help="The secret holding a bearer token.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="stdio: VAR=SECRET-NAME (repeat).")
    ] = None,
    per_principal: Annotated[
        bool, typer.Option("--per-principal", help="Each caller's own credentials.")
    ] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Call bound, s.")] = None,
    no_refresh: Annotated[
        bool, typer.Option("--no-refresh", help="Do not list and pin its tools now.")
    ] = False,
) -> None:
    """Register an MCP server (HTTP with --url, or stdio with --command) and pin its tools."""
    org = org_of(ctx)

    async def work() -> int:
        if (url is None) == (command is None):
            raise InvalidRequestError("give either --url (HTTP) or --command (stdio)")
        config = McpServerConfig(
            transport=McpTransport.HTTP if url is not None else McpTransport.STDIO,
            url=url,
            command=command,
            args=list(arg or []),
            headers=_pairs(header, "--header"),
            bearer_secret=bearer_secret,
            env=_pairs(env, "--env"),
            per_principal=per_principal,
            timeout_s=timeout,
        )
        async with open_runtime(with_models=False) as runtime:
            view = await runtime.connectors.register_mcp(
                org,
                name,
                config,
                refresh=not no_refresh,
                local_operator=True,
                principal=Principal.operator(org),
            )
        pinned = len(view.pins)
        out.print(Text(f"MCP server {name} registered in {org}: {pinned} tools pinned"))
        out.print(Text(f"health: {view.health}"))
        return 0 if view.health in ("ok", "unknown") else 1

    execute(work())


@mcp_app.command("list")
def mcp_list(ctx: typer.Context) -> None:
    """The organisation's MCP servers."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            views = await runtime.connectors.list_mcp(org, principal=Principal.operator(org))
        table = list_table(f"MCP servers in {org}")
        for column in ("name", "transport", "where", "health", "tools", "pending"):
            table.add_column(column, overflow="fold")
        for v in views:
            config = v.registration.config
            where = config.get("url") or config.get("command") or ""
            pending = sum(1 for p in v.pins if p.status.value == "pending")
            approved = sum(1 for p in v.pins if p.status.value == "approved")
            table.add_row(
                v.registration.name,
                str(config.get("transport")),
                Text(str(where)),
                Text(v.health),
                str(approved),
                str(pending),
            )
        out.print(table)
        return 0

    execute(work())


@mcp_app.command("tools")
def mcp_tools_cmd(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The server's name.")]
) -> None:
    """A server's pinned tool definitions: status, digest, tier override."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            view = await runtime.connectors.get_mcp(org, name, principal=Principal.operator(org))
        table = list_table(f"tools of MCP server {name}")
        for column in ("tool", "name", "status", "digest", "tier"):
            table.add_column(column, overflow="fold")
        overrides = view.registration.tier_overrides
        for p in view.pins:
            tier = overrides.get(p.tool)
            table.add_row(
                Text(p.tool),
                mcp_tool_name(name, p.tool),
                p.status.value,
                p.digest[:16],
                "" if tier is None else tier.value,
            )
        out.print(table)
        return 0

    execute(work())


@mcp_app.command("refresh")
def mcp_refresh(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The server's name.")]
) -> None:
    """List the server's tools and pin them: changed or new ones wait for approval."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            changes = await runtime.connectors.refresh_mcp(
                org, name, principal=Principal.operator(org)
            )
        if not changes:
            out.print(Text(f"MCP server {name}: no change"))
        for c in changes:
            out.print(Text(f"{c.tool}: {c.change} ({c.status.value}, {c.digest[:16]})"))
        return 0

    execute(work())


@mcp_app.command("approve")
def mcp_approve(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The server's name.")],
    tool: Annotated[str, typer.Argument(help="The server's name of the tool.")],
    digest: Annotated[
        str | None, typer.Option("--digest", help="The pending digest you reviewed.")
    ] = None,
) -> None:
    """Approve a pending tool definition, so its tool is offered again."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            pin = await runtime.connectors.approve_mcp_tool(
                org, name, tool, digest=digest, principal=Principal.operator(org)
            )
        out.print(Text(f"{pin.tool} of {name}: approved ({pin.digest[:16]})"))
        return 0

    execute(work())


@mcp_app.command("tier")
def mcp_tier(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The server's name.")],
    tool: Annotated[str, typer.Argument(help="The server's name of the tool.")],
    tier: Annotated[str, typer.Argument(help="read, write, admin, or default (the annotations').")],
) -> None:
    """Override the tier of one of the server's tools."""
    org = org_of(ctx)

    async def work() -> int:
        if tier != "default" and tier not in {t.value for t in CapabilityTier}:
            raise InvalidRequestError(f"tier is read, write, admin or default, not {tier!r}")
        chosen = None if tier == "default" else CapabilityTier(tier)
        async with open_runtime(with_models=False) as runtime:
            await runtime.connectors.set_mcp_tier(
                org, name, tool, chosen, principal=Principal.operator(org)
            )
        out.print(Text(f"{tool} of {name}: tier {tier}"))
        return 0

    execute(work())


@mcp_app.command("remove")
def mcp_remove(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The server's name.")]
) -> None:
    """Remove the server: its tools go at once, its grants are revoked."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            await runtime.connectors.remove_mcp(org, name, principal=Principal.operator(org))
        out.print(Text(f"MCP server {name} removed from {org}"))
        return 0

    execute(work())
