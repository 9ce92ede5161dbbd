"""``cortex-ray api-keys ...``: bearer keys for the HTTP API."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import PrincipalKind
from cortex_ray.cli._common import as_operator, err, execute, open_runtime, org_of, out, parse_uuid

__all__ = ["keys_app"]

keys_app = typer.Typer(help="API keys for the HTTP API (bearer keys).", no_args_is_help=True)


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
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            created = await runtime.create_api_key(
                org,
                principal,
                name=name,
                admin=admin,
                grant=grant,
                kind=PrincipalKind(kind.value.upper()),
                principal=as_operator(org),
            )
        key, key_id, wanted = created.key, created.key_id, created.principal
        out.print(Text(f"key id: {key_id}"), soft_wrap=True)
        role = " (admin)" if wanted.is_admin else ""
        out.print(Text(f"principal: {principal} in {org}{role}"), soft_wrap=True)
        tools = ", ".join(sorted(wanted.grant.tools)) if wanted.grant else ""
        out.print(Text(f"grant: {tools or 'none (no tool calls; add --grant)'}"), soft_wrap=True)
        out.print(Text(f"API key (shown once): {key}"), soft_wrap=True)
        for warning in created.warnings:
            err.print(Text(f"warning: {warning}"), soft_wrap=True)
        return 0

    execute(work())


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="The key's id.")]
) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    org = org_of(ctx)

    async def work() -> int:
        parsed = parse_uuid(key_id, "key")
        async with open_runtime(with_models=False) as runtime:
            revoked = await runtime.revoke_api_key(org, parsed, principal=as_operator(org))
        when = revoked.revoked_at.isoformat(timespec="seconds")
        done = "revoked key" if revoked.revoked_now else "key already revoked:"
        out.print(Text(f"{done} {parsed} (revoked at {when})"), soft_wrap=True)
        return 0

    execute(work())
