"""``cortex-ray approvals ...`` (the approval requests of paused runs and turns) and
``cortex-ray audit`` (the organisation's audit log)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from cortex_ray._types import Principal
from cortex_ray.cli._common import (
    execute,
    list_table,
    open_runtime,
    org_of,
    out,
    parse_uuid,
    shorten,
)
from cortex_ray.governance import ApprovalStatus

__all__ = ["approvals_app", "audit"]


approvals_app = typer.Typer(
    help="Approval requests of paused runs: list, show, approve, reject.", no_args_is_help=True
)


@approvals_app.command("list")
def approvals_list(
    ctx: typer.Context,
    pending: Annotated[bool, typer.Option("--pending", help="Only those waiting.")] = False,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's.")] = None,
) -> None:
    """The organisation's approval requests, oldest first."""
    org = org_of(ctx)

    async def work() -> int:
        run_id = None if run is None else parse_uuid(run, "run")
        async with open_runtime(with_models=False) as runtime:
            found = await runtime.governance.list_approvals(
                org,
                status=ApprovalStatus.PENDING if pending else None,
                run_id=run_id,
                principal=Principal.operator(org),
            )
        table = list_table(f"approval requests in {org}")
        for column in ("id", "status", "run / turn", "step / round", "call", "expires"):
            table.add_column(column, overflow="fold")
        for a in found:
            call = f"{a.tool}({json.dumps(a.args, ensure_ascii=False)}) [{a.tier}]"
            table.add_row(
                str(a.id),
                a.status.value,
                str(a.run_id) if a.run_id is not None else f"turn {a.turn_id}",
                str(a.step_index + 1),
                Text(shorten(call, 80)),
                a.expires_at.isoformat(timespec="seconds"),
            )
        out.print(table)
        return 0

    execute(work())


def _decide_approval(ctx: typer.Context, approval_id: str, approve: bool, note: str) -> None:
    org = org_of(ctx)

    async def work() -> int:
        key = parse_uuid(approval_id, "request")
        async with open_runtime(with_models=False) as runtime:
            decided = await runtime.governance.decide_approval(
                org, key, approve=approve, note=note, principal=Principal.operator(org)
            )
        if decided.run_id is None:
            said = (
                f"approval {decided.id}: {decided.status.value}; the turn {decided.turn_id} "
                "waiting for it continues"
            )
        else:
            said = (
                f"approval {decided.id}: {decided.status.value}; run {decided.run_id} is "
                "RUNNING again (the API's supervisor continues it; here: "
                f"cortex-ray runs resume {decided.run_id})"
            )
        out.print(Text(said), soft_wrap=True)
        return 0

    execute(work())


@approvals_app.command("approve")
def approvals_approve(
    ctx: typer.Context,
    approval_id: Annotated[str, typer.Argument(help="The request's id.")],
    note: Annotated[str, typer.Option("--note", help="Why.")] = "",
) -> None:
    """Approve: the run carries out that call (its policy checked again), not deciding anew."""
    _decide_approval(ctx, approval_id, True, note)


@approvals_app.command("reject")
def approvals_reject(
    ctx: typer.Context,
    approval_id: Annotated[str, typer.Argument(help="The request's id.")],
    note: Annotated[str, typer.Option("--note", help="Why (the agent reads it).")] = "",
) -> None:
    """Reject: the agent observes the rejection and decides its next step."""
    _decide_approval(ctx, approval_id, False, note)


def audit(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's rows.")] = None,
    gate_only: Annotated[
        bool, typer.Option("--gate-only", help="Tool calls only, no use-case rows.")
    ] = False,
) -> None:
    """The organisation's audit log, oldest first: each decision, tier and result hash."""
    org = org_of(ctx)

    async def work() -> int:
        run_id = None if run is None else parse_uuid(run, "run")
        async with open_runtime(with_models=False) as runtime:
            rows = await runtime.governance.audit(
                org, run_id=run_id, gate_only=gate_only, principal=Principal.operator(org)
            )
        table = list_table(f"audit log of {org}")
        for column in ("at", "principal", "tool", "tier", "decision", "result", "reason"):
            table.add_column(column, overflow="fold")
        for r in rows:
            table.add_row(
                r["at"].isoformat(timespec="seconds"),
                r["principal_id"],
                r["tool"],
                r["tier"] or "",
                r["decision"] or r["status"],
                (r["result_sha256"] or "")[:12],
                Text(shorten(r["reason"] or "", 80)),
            )
        out.print(table)
        return 0

    execute(work())
