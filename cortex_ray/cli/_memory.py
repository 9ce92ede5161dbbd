"""``cortex-ray proposals ...``: proposed edits of an agent's procedural memory."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import ProposalStatus
from cortex_ray.cli._common import (
    as_operator,
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
)

__all__ = ["proposals_app"]

proposals_app = typer.Typer(
    help="Proposed edits of agents' procedural memory (persona, skills): list, approve, reject.",
    no_args_is_help=True,
)


@proposals_app.command("list")
def proposals_list(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="Agent name or id.")],
    pending: Annotated[bool, typer.Option("--pending", help="Only undecided ones.")] = False,
) -> None:
    """List an agent's proposed procedural edits, oldest first."""
    org = org_of(ctx)

    async def work() -> int:
        status = ProposalStatus.PENDING if pending else None
        async with open_runtime(with_models=False) as runtime:
            _, proposals = await runtime.list_proposals(
                org, agent, status=status, principal=as_operator(org)
            )
        table = list_table(f"proposals for {agent} in {org}")
        table.add_column("id", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("change", min_width=16, overflow="fold")
        for p in proposals:
            value = p.value if isinstance(p.value, str) else "; ".join(p.value)
            table.add_row(str(p.id), p.status.value, Text(shorten(f"{p.field}: {value}", 80)))
        out.print(table)
        return 0

    execute(work())


def _decide(ctx: typer.Context, proposal_id: str, approve: bool) -> None:
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(proposal_id, "proposal")
        async with open_runtime(with_models=False) as runtime:
            decided = await runtime.decide_proposal(
                org, key, approve=approve, principal=as_operator(org)
            )
        out.print(Text(f"proposal {decided.id}: {decided.status.value}"), soft_wrap=True)
        return 0

    execute(work())


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
