"""``cortex-ray connectors|grants|audit``: the governance use cases from the command line
(issue 18). Each command parses, calls ``Runtime.governance`` as the operator, renders."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.text import Text

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import CapabilityTier, Principal, RunMode
from cortex_ray.governance import ApprovalPolicy, ApprovalStatus, GrantRequest, RunLabel

__all__ = [
    "approvals_app",
    "audit",
    "connectors_app",
    "grants_app",
    "runs_acceptance",
    "runs_label",
    "runs_report",
    "schedules_app",
    "secrets_app",
]


def _cli() -> Any:
    """``cortex_ray.cli``, imported when a command runs: it registers these commands at its
    end, so importing it here at load time would be circular (also under ``python -m``)."""
    from cortex_ray import cli

    return cli


connectors_app = typer.Typer(
    help="Connectors: install them in the organisation, check their health.",
    no_args_is_help=True,
)
grants_app = typer.Typer(
    help="Connector grants: who may call which connector tools.", no_args_is_help=True
)


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{what} is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object")
    return value


@connectors_app.command("list")
def connectors_list(ctx: typer.Context) -> None:
    """Every registered connector, its tools, and whether it is installed here."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            views = await runtime.governance.list_connectors(org, principal=Principal.operator(org))
        table = _cli()._list_table(f"connectors in {org}")
        for column in ("name", "installed", "health", "tools"):
            table.add_column(column, overflow="fold")
        for v in views:
            state = "no" if v.instance is None else ("yes" if v.instance.enabled else "disabled")
            health = "" if v.instance is None else v.instance.health
            table.add_row(v.connector.name, state, Text(health), ", ".join(v.tools))
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


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
    org = _cli()._org(ctx)

    async def work() -> int:
        settings = _json_object(config, "--config")
        async with _cli()._runtime(with_models=False) as runtime:
            instance = await runtime.governance.install_connector(
                org, name, config=settings, enabled=not disable, principal=Principal.operator(org)
            )
        state = "enabled" if instance.enabled else "disabled"
        _cli()._out.print(Text(f"connector {instance.connector} installed in {org}, {state}"))
        return 0

    _cli()._execute(work())


@connectors_app.command("check")
def connectors_check(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The connector's name.")]
) -> None:
    """Run the connector's health probe and record the answer."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            instance = await runtime.governance.check_connector(
                org, name, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"connector {instance.connector}: {instance.health}"))
        return 0 if instance.health in ("ok", "unknown") else 1

    _cli()._execute(work())


@grants_app.command("list")
def grants_list(
    ctx: typer.Context,
    principal_id: Annotated[
        str | None, typer.Option("--principal", help="Only this principal's grants.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Revoked grants too.")] = False,
) -> None:
    """The organisation's connector grants, oldest first."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            grants = await runtime.governance.list_grants(
                org,
                principal_id=principal_id,
                include_revoked=all_,
                principal=Principal.operator(org),
            )
        table = _cli()._list_table(f"connector grants in {org}")
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
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


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
    org = _cli()._org(ctx)

    async def work() -> int:
        constraints = {}
        for item in constraint or []:
            arg, sep, schema = item.partition("=")
            if not sep or not arg:
                raise InvalidRequestError(f"--constraint needs ARG=JSON, not {item!r}")
            constraints[arg] = _json_object(schema, f"--constraint {arg}")
        request = GrantRequest(
            principal_id=principal_id,
            connector=connector,
            tools=tuple(tool or ()),
            max_tier=tier,
            constraints=constraints,
            approval=approval,
            expires_at=expires,
        )
        async with _cli()._runtime(with_models=False) as runtime:
            grant = await runtime.governance.create_grant(
                org, request, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"grant {grant.id}: {grant.principal_id} → {grant.connector}"))
        return 0

    _cli()._execute(work())


@grants_app.command("revoke")
def grants_revoke(
    ctx: typer.Context, grant_id: Annotated[str, typer.Argument(help="The grant's id.")]
) -> None:
    """Revoke a grant: it allows nothing from now on (its row stays)."""
    org = _cli()._org(ctx)

    async def work() -> int:
        key = _cli()._parse_uuid(grant_id, "grant")
        async with _cli()._runtime(with_models=False) as runtime:
            grant = await runtime.governance.revoke_grant(
                org, key, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"grant {grant.id} revoked"))
        return 0

    _cli()._execute(work())


def audit(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's rows.")] = None,
    gate_only: Annotated[
        bool, typer.Option("--gate-only", help="Tool calls only, no use-case rows.")
    ] = False,
) -> None:
    """The organisation's audit log, oldest first: each decision, tier and result hash."""
    org = _cli()._org(ctx)

    async def work() -> int:
        run_id = None if run is None else _cli()._parse_uuid(run, "run")
        async with _cli()._runtime(with_models=False) as runtime:
            rows = await runtime.governance.audit(
                org, run_id=run_id, gate_only=gate_only, principal=Principal.operator(org)
            )
        table = _cli()._list_table(f"audit log of {org}")
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
                Text(_cli()._shorten(r["reason"] or "", 80)),
            )
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


def runs_report(
    ctx: typer.Context, run_id: Annotated[str, typer.Argument(help="The run's id.")]
) -> None:
    """What a run did and, dry or shadow, would have done (from its audit rows)."""
    org = _cli()._org(ctx)

    async def work() -> int:
        key = _cli()._parse_uuid(run_id, "run")
        async with _cli()._runtime(with_models=False) as runtime:
            report = await runtime.governance.run_report(
                org, key, principal=Principal.operator(org)
            )
        table = _cli()._list_table(f"run {report.run_id}: {report.run_mode}, {report.status}")
        for column in ("step", "what", "tool", "tier", "arguments"):
            table.add_column(column, overflow="fold")
        for what, calls in (
            ("executed", report.executed),
            ("simulated", report.simulated),
            ("proposed", report.proposed),
            ("refused", report.refused),
            ("failed", report.failed),
        ):
            for c in calls:
                table.add_row(
                    "" if c.step_index is None else str(c.step_index + 1),
                    what,
                    c.tool,
                    c.tier or "",
                    Text(_cli()._shorten(json.dumps(c.args, ensure_ascii=False), 80)),
                )
        _cli()._out.print(table)
        if report.label is not None:
            _cli()._out.print(
                Text(f"label: {report.label.label.value} by {report.label.labelled_by}")
            )
        return 0

    _cli()._execute(work())


def runs_label(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The shadow run's id.")],
    label: Annotated[RunLabel, typer.Argument(help="accepted, rejected or mixed.")],
    note: Annotated[str, typer.Option("--note", help="Why.")] = "",
) -> None:
    """Label an ended shadow run's proposals (never executes them)."""
    org = _cli()._org(ctx)

    async def work() -> int:
        key = _cli()._parse_uuid(run_id, "run")
        async with _cli()._runtime(with_models=False) as runtime:
            record = await runtime.governance.label_run(
                org, key, label, note=note, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"run {record.run_id}: {record.label.value}"))
        return 0

    _cli()._execute(work())


def runs_acceptance(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent.")] = None,
) -> None:
    """Acceptance of shadow runs per agent: runs, labels, proposals, rate."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            rows = await runtime.governance.shadow_report(
                org, agent_ref=agent, principal=Principal.operator(org)
            )
        table = _cli()._list_table(f"shadow runs in {org}")
        for column in ("agent", "runs", "labelled", "accepted", "rejected", "mixed", "rate"):
            table.add_column(column)
        for r in rows:
            rate = "" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
            table.add_row(
                r.agent_name,
                *(str(v) for v in (r.runs, r.labelled, r.accepted, r.rejected, r.mixed)),
                rate,
            )
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


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
    org = _cli()._org(ctx)

    async def work() -> int:
        run_id = None if run is None else _cli()._parse_uuid(run, "run")
        async with _cli()._runtime(with_models=False) as runtime:
            found = await runtime.governance.list_approvals(
                org,
                status=ApprovalStatus.PENDING if pending else None,
                run_id=run_id,
                principal=Principal.operator(org),
            )
        table = _cli()._list_table(f"approval requests in {org}")
        for column in ("id", "status", "run / turn", "step / round", "call", "expires"):
            table.add_column(column, overflow="fold")
        for a in found:
            call = f"{a.tool}({json.dumps(a.args, ensure_ascii=False)}) [{a.tier}]"
            table.add_row(
                str(a.id),
                a.status.value,
                str(a.run_id) if a.run_id is not None else f"turn {a.turn_id}",
                str(a.step_index + 1),
                Text(_cli()._shorten(call, 80)),
                a.expires_at.isoformat(timespec="seconds"),
            )
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


def _decide_approval(ctx: typer.Context, approval_id: str, approve: bool, note: str) -> None:
    org = _cli()._org(ctx)

    async def work() -> int:
        key = _cli()._parse_uuid(approval_id, "request")
        async with _cli()._runtime(with_models=False) as runtime:
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
        _cli()._out.print(Text(said), soft_wrap=True)
        return 0

    _cli()._execute(work())


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


secrets_app = typer.Typer(
    help="The organisation's secrets (connector credentials), sealed at rest.",
    no_args_is_help=True,
)


@secrets_app.command("list")
def secrets_list(ctx: typer.Context) -> None:
    """Names of the organisation's secrets (never their values)."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            found = await runtime.governance.list_secrets(org, principal=Principal.operator(org))
        table = _cli()._list_table(f"secrets of {org}")
        for column in ("name", "connector", "set by", "updated"):
            table.add_column(column, overflow="fold")
        for i in found:
            table.add_row(
                i.name, i.connector or "", i.created_by, i.updated_at.isoformat(timespec="seconds")
            )
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


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
    org = _cli()._org(ctx)
    if sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\n")

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            info = await runtime.governance.put_secret(
                org, name, value, connector=connector, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"secret {info.name} set in {org}"))
        return 0

    _cli()._execute(work())


@secrets_app.command("delete")
def secrets_delete(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The secret's name.")]
) -> None:
    """Delete a secret."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            await runtime.governance.delete_secret(org, name, principal=Principal.operator(org))
        _cli()._out.print(Text(f"secret {name} deleted from {org}"))
        return 0

    _cli()._execute(work())


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Re-seal every organisation's secrets under the current key (CORTEX_SECRET_KEY or its
    file), opening them with the older keys in CORTEX_SECRET_PREVIOUS_KEYS; run it after
    changing the key, then drop the older keys."""

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            done = await runtime.governance.rotate_secret_key()
        _cli()._out.print(
            Text(f"secrets re-sealed under the current key: {done.resealed}; already: "
                 f"{done.current}; opened by no key: {len(done.unreadable)}")
        )  # fmt: skip
        for org_id, name in done.unreadable:
            _cli()._out.print(Text(f"  not opened by any key: {name} in {org_id}"))
        return 1 if done.unreadable else 0

    _cli()._execute(work())


schedules_app = typer.Typer(
    help="Recurring and one-off autonomous tasks: list, create, suspend, resume, cancel.",
    no_args_is_help=True,
)


@schedules_app.command("list")
def schedules_list(ctx: typer.Context) -> None:
    """The organisation's schedules."""
    org = _cli()._org(ctx)

    async def work() -> int:
        async with _cli()._runtime(with_models=False) as runtime:
            found = await runtime.governance.list_schedules(org, principal=Principal.operator(org))
        table = _cli()._list_table(f"schedules of {org}")
        for column in ("id", "status", "when", "next", "fired", "goal", "last error"):
            table.add_column(column, overflow="fold")
        for s in found:
            when = (s.cron and f"{s.cron} ({s.timezone})") or (
                f"every {s.interval_s}s" if s.interval_s else "once"
            )
            nxt = s.next_run_at.isoformat(timespec="seconds") if s.next_run_at else ""
            what = s.goal
            if s.workflow is not None:
                pinned = "latest" if s.workflow_version is None else f"v{s.workflow_version}"
                what = f"workflow {s.workflow} ({pinned}) {json.dumps(s.inputs or {})}"
            table.add_row(
                str(s.id),
                s.status,
                when,
                nxt,
                str(s.fired),
                Text(_cli()._shorten(what, 60)),
                Text(_cli()._shorten(s.last_error or "", 80)),
            )
        _cli()._out.print(table)
        return 0

    _cli()._execute(work())


@schedules_app.command("create")
def schedules_create(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="An AUTONOMOUS agent's name or id.")],
    goal: Annotated[
        str | None, typer.Argument(help="The goal of each run (none with --workflow).")
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option("--workflow", help="Each run is a run of this workflow (instead of GOAL)."),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="The workflow's pinned version.")
    ] = None,
    inputs: Annotated[
        str | None, typer.Option("--inputs", help="The workflow's inputs, a JSON object.")
    ] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="e.g. '0 9 * * 1-5'.")] = None,
    every: Annotated[int | None, typer.Option("--every", help="Interval in seconds.")] = None,
    at: Annotated[
        datetime | None, typer.Option("--at", help="A one-off's time, or an interval's start.")
    ] = None,
    tz: Annotated[str, typer.Option("--tz", help="The cron's time zone.")] = "UTC",
    max_steps: Annotated[int, typer.Option("--max-steps", help="Each run's budget.")] = 8,
    max_seconds: Annotated[
        int, typer.Option("--max-seconds", help="Each run's wall-time cap (0: none).")
    ] = 3600,
    run_mode: Annotated[
        RunMode | None,
        typer.Option(
            "--mode", help="execute|dry_run|shadow (default: execute, or the workflow's default)"
        ),
    ] = None,
) -> None:
    """Schedule an agent's GOAL, or a --workflow's runs with its --inputs (checked now and
    at every firing): --cron, --every, or --at alone for a one-off."""
    org = _cli()._org(ctx)

    async def work() -> int:
        if (workflow is None) == (goal is None):
            raise InvalidRequestError("give a GOAL or --workflow, one of the two")
        if workflow is None and (version is not None or inputs is not None):
            raise InvalidRequestError("--version and --inputs go with --workflow")
        given = None if inputs is None else _json_object(inputs, "--inputs")
        async with _cli()._runtime(with_models=False) as runtime:
            made = await runtime.governance.create_schedule(
                org,
                agent,
                goal or "",
                workflow=workflow,
                workflow_version=version,
                inputs=given if workflow is None else (given or {}),
                cron=cron,
                interval_s=every,
                run_at=at,
                timezone=tz,
                max_steps=max_steps,
                max_seconds=max_seconds or None,
                run_mode=run_mode,
                max_steps_limit=runtime.settings.decide.max_steps_limit,
                principal=Principal.operator(org),
            )
        nxt = made.next_run_at.isoformat(timespec="seconds") if made.next_run_at else "-"
        _cli()._out.print(Text(f"schedule {made.id}: next run {nxt}"))
        return 0

    _cli()._execute(work())


def _change_schedule(ctx: typer.Context, schedule_id: str, action: str) -> None:
    org = _cli()._org(ctx)

    async def work() -> int:
        key = _cli()._parse_uuid(schedule_id, "schedule")
        async with _cli()._runtime(with_models=False) as runtime:
            changed = await runtime.governance.change_schedule(
                org, key, action, principal=Principal.operator(org)
            )
        _cli()._out.print(Text(f"schedule {changed.id}: {changed.status}"))
        return 0

    _cli()._execute(work())


@schedules_app.command("suspend")
def schedules_suspend(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Stop firing until resumed."""
    _change_schedule(ctx, schedule_id, "suspend")


@schedules_app.command("resume")
def schedules_resume(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Fire again (what was missed coalesces into one run)."""
    _change_schedule(ctx, schedule_id, "resume")


@schedules_app.command("cancel")
def schedules_cancel(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument()]) -> None:
    """Stop for good."""
    _change_schedule(ctx, schedule_id, "cancel")
