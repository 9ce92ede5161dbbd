"""``cortex-ray secrets ...``: the organisation's secrets (connector credentials), sealed at
rest; values are read from standard input, never from the command line."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import Principal
from cortex_ray.cli._common import execute, list_table, open_runtime, org_of, out

__all__ = ["secrets_app"]


secrets_app = typer.Typer(
    help="The organisation's secrets (connector credentials), sealed at rest.",
    no_args_is_help=True,
)


@secrets_app.command("list")
def secrets_list(ctx: typer.Context) -> None:
    """Names of the organisation's secrets (never their values)."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.governance.list_secrets(org, principal=Principal.operator(org))
        table = list_table(f"secrets of {org}")
        for column in ("name", "connector", "set by", "updated"):
            table.add_column(column, overflow="fold")
        for i in found:
            table.add_row(
                i.name, i.connector or "", i.created_by, i.updated_at.isoformat(timespec="seconds")
            )
        out.print(table)
        return 0

    execute(work())


@secrets_app.command("set")
def secrets_set(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The secret's name.")],
    connector: Annotated[
        str | None, typer.Option("--connector", help="Only this connector's tools read it.")
    ] = None,
) -> None:
    """Set a secret; the value is read from standard input (typed unseen on a terminal),
    never from the command line, where other users of the machine could read it."""
    org = org_of(ctx)
    if sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\n")

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            info = await runtime.governance.put_secret(
                org, name, value, connector=connector, principal=Principal.operator(org)
            )
        out.print(Text(f"secret {info.name} set in {org}"))
        return 0

    execute(work())


@secrets_app.command("delete")
def secrets_delete(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The secret's name.")]
) -> None:
    """Delete a secret."""
    org = org_of(ctx)

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            await runtime.governance.delete_secret(org, name, principal=Principal.operator(org))
        out.print(Text(f"secret {name} deleted from {org}"))
        return 0

    execute(work())


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Re-seal every organisation's secrets under the current key (CORTEX_SECRET_KEY or its
    file), opening them with the older keys in CORTEX_SECRET_PREVIOUS_KEYS; run it after
    changing the key, then drop the older keys."""

    async def work() -> int:
        async with open_runtime(with_models=False) as runtime:
            done = await runtime.governance.rotate_secret_key()
        out.print(
            Text(f"secrets re-sealed under the current key: {done.resealed}; already: "
                 f"{done.current}; opened by no key: {len(done.unreadable)}")
        )  # fmt: skip
        for org_id, name in done.unreadable:
            out.print(Text(f"  not opened by any key: {name} in {org_id}"))
        return 1 if done.unreadable else 0

    execute(work())
