"""``cortex-ray connectors ...`` and ``cortex-ray grants ...``: install connectors, check
their health, and grant principals calls of their tools. Each command parses, calls
``Runtime.governance`` as the operator, renders."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import CapabilityTier, Principal
from cortex_ray.cli._common import (
    execute,
    json_object,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
)
from cortex_ray.governance import ApprovalPolicy, GrantRequest

__all__ = ["connectors_app", "grants_app"]


connectors_app = typer.Typer(
    help="Connectors: install them in the organisation, check their health.",
    no_args_is_help=True,
)


grants_app = typer.Typer(
    help="Connector grants: who may call which connector tools.", no_args_is_help=True
)


@connectors_app.command("list")
def connectors_list(ctx: typer.Context) -> None:
    """Every registered connector, its tools, and whether it is installed here."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            views = await runtime.governance.list_connectors(org, principal=Principal.operator(org))
        table = list_table(f"connectors in {org}")
        for column in ("name", "installed", "health", "tools"):
            table.add_column(column, overflow="fold")
        for v in views:
            state = "no" if v.instance is None else ("yes" if v.instance.enabled else "disabled")
            health = "" if v.instance is None else v.instance.health
            table.add_row(v.connector.name, state, Text(health), ", ".join(v.tools))
        out.print(table)
        return 0

    execute(work())


@connectors_app.command("install")
def connectors_install(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The connector's name.")],
    config: Annotated[
        str, typer.Option("--config", help="Non-secret settings, a JSON object.")
    ] = "{}",
    disable: Annotated[bool, typer.Option("--disable", help="Installed but disabled.")] = False,
) -> None:
    """Install a connector here (or change its configuration, enable or disable it)."""
    org = org_of(ctx)

    async def work() -> int:
        settings = json_object(config, "--config")
        async with open_runtime(with_models=False) as runtime:
            instance = await runtime.governance.install_connector(
                org, name, config=settings, enabled=not disable, principal=Principal.operator(org)
            )
        state = "enabled" if instance.enabled else "disabled"
        out.print(Text(f"connector {instance.connector} installed in {org}, {state}"))
        return 0

    execute(work())


@connectors_app.command("check")
def connectors_check(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The connector's name.")]
) -> None:
    """Run the connector's health probe and record the answer."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            instance = await runtime.governance.check_connector(
                org, name, principal=Principal.operator(org)
            )
        out.print(Text(f"connector {instance.connector}: {instance.health}"))
        return 0 if instance.health in ("ok", "unknown") else 1

    execute(work())


@grants_app.command("list")
def grants_list(
    ctx: typer.Context,
    principal_id: Annotated[
        str | None, typer.Option("--principal", help="Only this principal's grants.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Revoked grants too.")] = False,
) -> None:
    """The organisation's connector grants, oldest first."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            grants = await runtime.governance.list_grants(
                org,
                principal_id=principal_id,
                include_revoked=all_,
                principal=Principal.operator(org),
            )
        table = list_table(f"connector grants in {org}")
        for column in ("id", "principal", "connector", "tools", "tier", "approval", "until"):
            table.add_column(column, overflow="fold")
        for g in grants:
            until = (
                "revoked" if g.revoked_at else (g.expires_at.isoformat() if g.expires_at else "")
            )
            table.add_row(
                str(g.id),
                g.principal_id,
                g.connector,
                ", ".join(g.tools) or "all",
                g.max_tier.value,
                g.approval.value,
                until,
            )
        out.print(table)
        return 0

    execute(work())


@grants_app.command("create")
def grants_create(
    ctx: typer.Context,
    principal_id: Annotated[
        str, typer.Argument(help="A user's or agent's principal id (agent:<uuid>), or '*'.")
    ],
    connector: Annotated[str, typer.Argument(help="The connector.")],
    tool: Annotated[
        list[str] | None, typer.Option("--tool", help="A tool it covers (repeat; none: all).")
    ] = None,
    tier: Annotated[
        CapabilityTier, typer.Option("--tier", help="The highest tier it allows.")
    ] = CapabilityTier.READ,
    constraint: Annotated[
        list[str] | None,
        typer.Option("--constraint", help='ARG=JSON-SCHEMA, e.g. region={"enum":["eu"]}.'),
    ] = None,
    approval: Annotated[
        ApprovalPolicy, typer.Option("--approval", help="When a call needs approval.")
    ] = ApprovalPolicy.NEVER,
    expires: Annotated[
        datetime | None,
        typer.Option("--expires", help="ISO time with zone after which it allows nothing."),
    ] = None,
) -> None:
    """Grant a principal calls of a connector's tools."""
    org = org_of(ctx)

    async def work() -> int:
        constraints = {}
        for item in constraint or []:
            arg, sep, schema = item.partition("=")
            if not sep or not arg:
                raise InvalidRequestError(f"--constraint needs ARG=JSON, not {item!r}")
            constraints[arg] = json_object(schema, f"--constraint {arg}")
        request = GrantRequest(
            principal_id=principal_id,
            connector=connector,
            tools=tuple(tool or ()),
            max_tier=tier,
            constraints=constraints,
            approval=approval,
            expires_at=expires,
        )
        async with open_runtime(with_models=False) as runtime:
            grant = await runtime.governance.create_grant(
                org, request, principal=Principal.operator(org)
            )
        out.print(Text(f"grant {grant.id}: {grant.principal_id} → {grant.connector}"))
        return 0

    execute(work())


@grants_app.command("revoke")
def grants_revoke(
    ctx: typer.Context, grant_id: Annotated[str, typer.Argument(help="The grant's id.")]
) -> None:
    """Revoke a grant: it allows nothing from now on (its row stays)."""
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(grant_id, "grant")
        async with open_runtime(with_models=False) as runtime:
            grant = await runtime.governance.revoke_grant(
                org, key, principal=Principal.operator(org)
            )
        out.print(Text(f"grant {grant.id} revoked"))
        return 0

    execute(work())
