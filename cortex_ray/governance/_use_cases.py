"""The governance use cases (connectors, grants, the audit log), reached as
``Runtime.governance``: each takes the calling principal, is decided by
``AccessControlService.authorize`` and audited through the runtime, like every use case."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from cortex_ray._exceptions import ConflictError, InvalidRequestError, NotFoundError
from cortex_ray._types import AgentMode, Principal, RunMode, utcnow
from cortex_ray.access import UseCase
from cortex_ray.governance._patterns import InputLimits
from cortex_ray.governance._policy import ConnectorPolicy, check_constraints
from cortex_ray.governance._schedules import (
    DEFAULT_MAX_SECONDS,
    Schedule,
    ScheduleStatus,
    ScheduleStore,
    validate_schedule,
    workflow_run_of,
)
from cortex_ray.governance._secrets import Rotation, SecretInfo, SecretStore
from cortex_ray.governance._store import GovernanceStore
from cortex_ray.governance._types import (
    Approval,
    ApprovalStatus,
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    GrantRequest,
    ReportedCall,
    RunLabel,
    RunLabelRecord,
    RunReport,
    ShadowAcceptance,
)
from cortex_ray.governance._workflows import WorkflowStore
from cortex_ray.observability import scrub
from cortex_ray.storage import Store

__all__ = ["ConnectorView", "Governance"]

HEALTH_TIMEOUT_S = 10.0


class _Authorize(Protocol):
    def __call__(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        *,
        args: Any = None,
        owner_id: str | None = None,
        approvers: tuple[str, ...] = (),
    ) -> Awaitable[Principal]: ...


class _Audited(Protocol):
    def __call__(
        self, caller: Principal, use_case: UseCase, org_id: str, *, args: Any = None
    ) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class ConnectorView:
    """A registered connector, its tools here, and its instance in the organisation (if
    installed)."""

    connector: Connector
    tools: tuple[str, ...]
    instance: ConnectorInstance | None


class Governance:
    """Connectors, grants and the audit log, as use cases (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        governance: GovernanceStore,
        policy: ConnectorPolicy,
        tools_of: Callable[[str], Sequence[str]],
        authorize: _Authorize,
        audited: _Audited,
        excludes_requester: bool = False,
        secrets: SecretStore | None = None,
        input_limits: InputLimits | None = None,
    ) -> None:
        self.excludes_requester = excludes_requester
        self.secrets = secrets
        self.input_limits = input_limits or InputLimits()
        self.schedules = ScheduleStore(store.db, self.input_limits)
        self.schedules_changed = asyncio.Event()
        """Set when a schedule is made or resumed here: wakes this process's scheduler."""
        self.store = store
        self.gov = governance
        self.policy = policy
        self._tools_of = tools_of
        self._authorize = authorize
        self._audited = audited

    def _definition(self, name: str) -> Connector:
        connector = self.policy.connectors.get(name)
        if connector is None:
            raise NotFoundError(f"no connector {name!r} is registered")
        return connector

    async def list_connectors(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[ConnectorView]:
        """Every registered connector with its tools and this organisation's instance."""
        await self._authorize(principal, UseCase.CONNECTORS_LIST, org_id)
        installed = {i.connector: i for i in await self.gov.instances(org_id)}
        return [
            ConnectorView(c, tuple(self._tools_of(name)), installed.get(name))
            for name, c in sorted(self.policy.connectors.items())
        ]

    async def install_connector(
        self,
        org_id: str,
        name: str,
        *,
        config: dict[str, Any] | None = None,
        enabled: bool = True,
        principal: Principal | None = None,
    ) -> ConnectorInstance:
        """Install (or reconfigure, enable, disable) a connector in the organisation.

        Raises:
            NotFoundError: No connector of that name is registered.
            InvalidRequestError: The configuration holds what looks like a credential
                (credentials belong in the secret store), or ``redact_fields`` is not a
                list of names.
        """
        args = {"connector": name, "enabled": enabled}
        caller = await self._authorize(principal, UseCase.CONNECTORS_INSTALL, org_id, args=args)
        self._definition(name)
        config = dict(config or {})
        if scrub(config) != config:
            raise InvalidRequestError(
                "the configuration holds a credential: keep secrets out of connector config"
            )
        fields = config.get("redact_fields", [])
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise InvalidRequestError("redact_fields must be a list of field names")
        await self.store.ensure_org(org_id)
        instance = await self.gov.put_instance(
            ConnectorInstance(org_id=org_id, connector=name, config=config, enabled=enabled)
        )
        self.policy.invalidate(org_id)
        await self._audited(caller, UseCase.CONNECTORS_INSTALL, org_id, args=args)
        return instance

    async def check_connector(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> ConnectorInstance:
        """Run the connector's health probe on this organisation's instance and record the
        answer (``ok``, or why not; ``unknown`` without a probe)."""
        args = {"connector": name}
        caller = await self._authorize(principal, UseCase.CONNECTORS_CHECK, org_id, args=args)
        definition = self._definition(name)
        instance = await self.gov.instance(org_id, name)
        if definition.health is None:
            health = "unknown"
        else:
            try:
                async with asyncio.timeout(HEALTH_TIMEOUT_S):
                    problem = await definition.health(instance.config)
                health = "ok" if problem is None else f"failing: {problem}"
            except TimeoutError:
                health = f"failing: no answer in {HEALTH_TIMEOUT_S:g}s"
            except Exception as exc:  # a probe's failure is the health it reports
                health = f"failing: {type(exc).__name__}: {exc}"
        checked = await self.gov.set_health(org_id, name, scrub(health))
        await self._audited(caller, UseCase.CONNECTORS_CHECK, org_id, args=args)
        return checked

    async def create_grant(
        self, org_id: str, request: GrantRequest, *, principal: Principal | None = None
    ) -> ConnectorGrant:
        """Grant a principal (or ``*``) calls of a connector's tools.

        Raises:
            NotFoundError: The connector is not registered or not installed here.
            InvalidRequestError: A named tool is not the connector's, a constraint is
                outside the supported subset, or the expiry has passed.
        """
        args = request.model_dump(mode="json")
        caller = await self._authorize(principal, UseCase.GRANTS_CREATE, org_id, args=args)
        self._definition(request.connector)
        mine = set(self._tools_of(request.connector))
        strangers = sorted(set(request.tools) - mine)
        if strangers:
            raise InvalidRequestError(
                f"not tools of connector {request.connector!r}: {', '.join(strangers)}"
            )
        check_constraints(request.constraints, self.input_limits.max_pattern_chars)
        if request.expires_at is not None:
            if request.expires_at.tzinfo is None:
                raise InvalidRequestError("expires_at needs a time zone")
            if request.expires_at <= utcnow():
                raise InvalidRequestError("expires_at is in the past")
        grant = await self.gov.create_grant(
            ConnectorGrant(org_id=org_id, created_by=caller.id, **request.model_dump())
        )
        self.policy.invalidate(org_id)
        await self._audited(caller, UseCase.GRANTS_CREATE, org_id, args=args)
        return grant

    async def list_grants(
        self,
        org_id: str,
        *,
        principal_id: str | None = None,
        include_revoked: bool = False,
        principal: Principal | None = None,
    ) -> list[ConnectorGrant]:
        await self._authorize(principal, UseCase.GRANTS_LIST, org_id)
        return await self.gov.grants(
            org_id, principal_id=principal_id, include_revoked=include_revoked
        )

    async def revoke_grant(
        self, org_id: str, grant_id: UUID, *, principal: Principal | None = None
    ) -> ConnectorGrant:
        """Revoke a grant (at once: the gate reads grants on every call). Revoking a revoked
        grant keeps its first revocation time."""
        args = {"grant": str(grant_id)}
        caller = await self._authorize(principal, UseCase.GRANTS_REVOKE, org_id, args=args)
        revoked = await self.gov.revoke_grant(org_id, grant_id)
        self.policy.invalidate(org_id)
        await self._audited(caller, UseCase.GRANTS_REVOKE, org_id, args=args)
        return revoked

    async def audit(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        gate_only: bool = False,
        principal: Principal | None = None,
    ) -> list[dict[str, Any]]:
        """The organisation's audit rows, oldest first (see ``Store.audit_rows``)."""
        await self._authorize(principal, UseCase.AUDIT_READ, org_id)
        return await self.store.audit_rows(org_id, run_id=run_id, gate_only=gate_only)

    # run modes ----------------------------------------------------------------------------

    async def run_report(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunReport:
        """What a run did and, dry or shadow, would have done (from its audit rows)."""
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id)
        lists: dict[str, list[ReportedCall]] = {
            "executed": [],
            "simulated": [],
            "proposed": [],
            "refused": [],
            "failed": [],
        }
        where = {
            "allowed": "executed",
            "simulated": "simulated",
            "proposed": "proposed",
            "denied": "refused",
            "refused": "refused",
            "approval_required": "refused",
        }
        for row in await self.store.audit_rows(org_id, run_id=run_id, gate_only=True):
            decision = row["decision"] or ("allowed" if row["status"] == "OK" else "error")
            lists[where.get(decision, "failed")].append(
                ReportedCall(
                    step_index=row["step_index"],
                    tool=row["tool"],
                    tier=row["tier"],
                    decision=decision,
                    args=row["args"] or {},
                    reason=row["reason"],
                )
            )
        return RunReport(
            run_id=run.id,
            run_mode=run.run_mode.value,
            status=run.status.value,
            label=await self.gov.label(org_id, run_id),
            **{k: tuple(v) for k, v in lists.items()},
        )

    async def label_run(
        self,
        org_id: str,
        run_id: UUID,
        label: RunLabel,
        *,
        note: str = "",
        principal: Principal | None = None,
    ) -> RunLabelRecord:
        """A person labels an ended shadow run: its proposals accepted, rejected or mixed.
        Labelling never executes a proposal.

        Raises:
            NotFoundError: No such run here.
            InvalidRequestError: Not a shadow run, or the note is over 2,000 characters.
            ConflictError: The run has not ended.
        """
        args = {"run": str(run_id), "label": label.value}
        caller = await self._authorize(principal, UseCase.TASKS_LABEL, org_id, args=args)
        if len(note) > 2000:
            raise InvalidRequestError("a label's note is at most 2000 characters")
        run = await self.store.get_run(org_id, run_id)
        if run.run_mode is not RunMode.SHADOW:
            raise InvalidRequestError(f"run {run_id} is a {run.run_mode.value} run, not shadow")
        if not run.status.ended:
            raise ConflictError(f"run {run_id} has not ended ({run.status.value})")
        record = await self.gov.put_label(org_id, run_id, label, note, caller.id)
        await self._audited(caller, UseCase.TASKS_LABEL, org_id, args=args)
        return record

    async def shadow_report(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        principal: Principal | None = None,
    ) -> list[ShadowAcceptance]:
        """Acceptance of shadow runs per agent (``agent_ref``: one agent)."""
        await self._authorize(principal, UseCase.TASKS_LIST, org_id)
        agent_id = None
        if agent_ref is not None:
            agent_id = (await self.store.get_agent(org_id, agent_ref)).id
        return await self.gov.shadow_acceptance(org_id, agent_id)

    # approvals ------------------------------------------------------------------------------

    async def list_approvals(
        self,
        org_id: str,
        *,
        status: ApprovalStatus | None = None,
        run_id: UUID | None = None,
        principal: Principal | None = None,
    ) -> list[Approval]:
        """The organisation's approval requests, oldest first."""
        await self._authorize(principal, UseCase.APPROVALS_LIST, org_id)
        return await self.gov.approvals(org_id, status=status, run_id=run_id)

    async def get_approval(
        self, org_id: str, approval_id: UUID, *, principal: Principal | None = None
    ) -> Approval:
        await self._authorize(principal, UseCase.APPROVALS_LIST, org_id)
        return await self.gov.approval(org_id, approval_id)

    async def decide_approval(
        self,
        org_id: str,
        approval_id: UUID,
        *,
        approve: bool,
        note: str = "",
        principal: Principal | None = None,
    ) -> Approval:
        """An admin person (one of its approvers, when it names any; not the run's requester
        with ``approval_excludes_requester``) approves or rejects a pending request; its run
        goes back to RUNNING, for an executor to continue (``Executor.start_run``). The
        agent never decides: agents are not persons.

        Raises:
            NotFoundError: No such request here.
            InvalidRequestError: The note is over 2,000 characters.
            ConflictError: Already decided, or expired (which counts as a rejection).
        """
        if len(note) > 2000:
            raise InvalidRequestError("a decision's note is at most 2000 characters")
        args = {"approval": str(approval_id), "approve": approve}
        caller = principal or Principal.operator(org_id)
        if caller.org_id == org_id:
            # Only a member learns whether the request exists (and who may decide it).
            pending = await self.gov.approval(org_id, approval_id)
            requester = None
            if self.excludes_requester:
                # A turn's request: the person in the conversation; a run's: who started it.
                requester = pending.requested_by
                if pending.run_id is not None:
                    requester = (await self.store.get_run(org_id, pending.run_id)).requested_by
            approvers = pending.approvers
        else:
            requester, approvers = None, ()
        caller = await self._authorize(
            principal,
            UseCase.APPROVALS_DECIDE,
            org_id,
            args=args,
            owner_id=requester,
            approvers=approvers,
        )
        if pending.status is ApprovalStatus.PENDING and pending.expires_at <= utcnow():
            await self.gov.decide(org_id, approval_id, ApprovalStatus.EXPIRED, None)
            raise ConflictError(f"approval {approval_id} expired (counts as a rejection)")
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
        decided = await self.gov.decide(org_id, approval_id, status, caller.id, note)
        if decided is None:
            now = await self.gov.approval(org_id, approval_id)
            raise ConflictError(f"approval {approval_id} is already {now.status.value}")
        await self._audited(caller, UseCase.APPROVALS_DECIDE, org_id, args=args)
        return decided

    async def expire_approvals(self) -> list[Approval]:
        """Expire every pending request whose time is up (the supervisor's sweep): each
        counts as a rejection, its run back to RUNNING for the executor."""
        return await self.gov.expire_due()

    # secrets ------------------------------------------------------------------------------

    def _secret_store(self) -> SecretStore:
        if self.secrets is None:
            raise InvalidRequestError("this runtime has no secret store")
        return self.secrets

    async def list_secrets(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[SecretInfo]:
        """The organisation's secrets: names, connectors and who set them; never values."""
        await self._authorize(principal, UseCase.SECRETS_LIST, org_id)
        return await self._secret_store().list(org_id)

    async def put_secret(
        self,
        org_id: str,
        name: str,
        value: str,
        *,
        connector: str | None = None,
        principal: Principal | None = None,
    ) -> SecretInfo:
        """Set (or replace) a secret, sealed at rest; ``connector``: only that connector's
        tools may read it. The audit row names it, never its value.

        Raises:
            InvalidRequestError: A bad name, an empty or too long value.
            NotFoundError: ``connector`` is not registered.
        """
        args = {"name": name, "connector": connector}
        caller = await self._authorize(principal, UseCase.SECRETS_PUT, org_id, args=args)
        if connector is not None:
            self._definition(connector)
        await self.store.ensure_org(org_id)
        info = await self._secret_store().put(
            org_id, name, value, connector=connector, by=caller.id
        )
        await self._audited(caller, UseCase.SECRETS_PUT, org_id, args=args)
        return info

    async def delete_secret(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> None:
        args = {"name": name}
        caller = await self._authorize(principal, UseCase.SECRETS_DELETE, org_id, args=args)
        await self._secret_store().delete(org_id, name)
        await self._audited(caller, UseCase.SECRETS_DELETE, org_id, args=args)

    async def rotate_secret_key(self) -> Rotation:
        """Re-seal every organisation's secrets under the current key (``secret_key``) that
        only an older one (``secret_previous_keys``) opens. An installation's operation, not
        an organisation's: whoever runs it holds the database and the keys (``cortex-ray
        secrets rotate``), like the supervisor's sweeps; no principal, no audit row."""
        return await self._secret_store().rotate()

    # schedules ----------------------------------------------------------------------------

    async def create_schedule(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str = "",
        *,
        cron: str | None = None,
        interval_s: int | None = None,
        run_at: Any = None,
        timezone: str = "UTC",
        max_steps: int = 8,
        max_seconds: int | None = DEFAULT_MAX_SECONDS,
        run_mode: RunMode | None = None,
        name: str = "",
        workflow: str | None = None,
        workflow_version: int | None = None,
        inputs: dict[str, Any] | None = None,
        max_steps_limit: int = 64,
        principal: Principal | None = None,
    ) -> Schedule:
        """A recurring (``cron`` in ``timezone``, or every ``interval_s`` from ``run_at`` or
        now) or one-off (``run_at``) autonomous task of an AUTONOMOUS agent; each run capped
        at ``max_steps`` and ``max_seconds`` of wall time from when it fires (``None``: no
        time cap). Its runs pursue ``goal`` in ``run_mode`` (default execute), or, with
        ``workflow``, are runs of that workflow's version (``workflow_version``, or the
        latest when each fires) with ``inputs``, in ``run_mode`` or the version's default:
        the inputs and the mode are checked now against the version they would run, and
        again at every firing.

        Raises:
            NotFoundError: No such agent here; no such workflow or version.
            InvalidRequestError: See ``validate_schedule``; a step budget out of range; an
                agent that is not AUTONOMOUS; inputs the version's schema refuses, or a mode
                less safe than its default.
        """
        args: dict[str, Any] = {"agent": str(agent_ref), "cron": cron, "interval_s": interval_s}
        if workflow is not None:
            args["workflow"] = workflow
            args["version"] = workflow_version
        caller = await self._authorize(principal, UseCase.SCHEDULES_CREATE, org_id, args=args)
        agent = await self.store.get_agent(org_id, agent_ref)
        if agent.mode is not AgentMode.AUTONOMOUS:
            raise InvalidRequestError(f"agent {agent.name!r} is not AUTONOMOUS")
        if not 1 <= max_steps <= max_steps_limit:
            raise InvalidRequestError(f"max_steps must be between 1 and {max_steps_limit}")
        if workflow is None and run_mode is None:
            run_mode = RunMode.EXECUTE
        if workflow is None and inputs is not None:
            raise InvalidRequestError("inputs go with a workflow")
        schedule = validate_schedule(
            Schedule(
                org_id=org_id,
                agent_id=agent.id,
                name=name,
                workflow=workflow,
                workflow_version=workflow_version,
                inputs=None if workflow is None else dict(inputs or {}),
                goal=goal.strip(),
                cron=cron,
                interval_s=interval_s,
                timezone=timezone,
                next_run_at=run_at,
                max_steps=max_steps,
                max_seconds=max_seconds,
                run_mode=run_mode,
                created_by=caller.id,
            ),
            utcnow(),
        )
        if workflow is not None:
            # The checks every firing makes again, now: a schedule that could not start a
            # run is refused when it is made, not found out at its first due time.
            version = await WorkflowStore(self.store.db).version(org_id, workflow, workflow_version)
            workflow_run_of(schedule, version, self.input_limits)
        await self.schedules.create(schedule)
        self.schedules_changed.set()
        await self._audited(caller, UseCase.SCHEDULES_CREATE, org_id, args=args)
        return schedule

    async def list_schedules(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[Schedule]:
        await self._authorize(principal, UseCase.SCHEDULES_LIST, org_id)
        return await self.schedules.in_org(org_id)

    async def change_schedule(
        self,
        org_id: str,
        schedule_id: UUID,
        action: str,
        *,
        principal: Principal | None = None,
    ) -> Schedule:
        """``suspend`` (no firing until resumed), ``resume`` (an ACTIVE schedule again; what
        it missed while suspended coalesces into one run) or ``cancel`` (for good).

        Raises:
            NotFoundError: No such schedule here.
            InvalidRequestError: An unknown action.
            ConflictError: Cancelled or done already, or resuming one that is not suspended.
        """
        if action not in ("suspend", "resume", "cancel"):
            raise InvalidRequestError("action is suspend, resume or cancel")
        args = {"schedule": str(schedule_id), "action": action}
        caller = principal or Principal.operator(org_id)
        found = await self.schedules.get(org_id, schedule_id) if caller.org_id == org_id else None
        if found is None and caller.org_id == org_id:
            raise NotFoundError(f"no schedule {schedule_id} in this organisation")
        caller = await self._authorize(
            principal,
            UseCase.SCHEDULES_CHANGE,
            org_id,
            args=args,
            owner_id=None if found is None else found.created_by,
        )
        if found is None:
            raise NotFoundError(f"no schedule {schedule_id} in this organisation")
        if found.status in (ScheduleStatus.CANCELLED, ScheduleStatus.DONE):
            raise ConflictError(f"schedule {schedule_id} is {found.status}")
        if action == "resume" and found.status != ScheduleStatus.SUSPENDED:
            raise ConflictError(f"schedule {schedule_id} is {found.status}, not SUSPENDED")
        status = {
            "suspend": ScheduleStatus.SUSPENDED,
            "resume": ScheduleStatus.ACTIVE,
            "cancel": ScheduleStatus.CANCELLED,
        }[action]
        changed = await self.schedules.set_status(org_id, schedule_id, status)
        assert changed is not None
        if status == ScheduleStatus.ACTIVE:
            self.schedules_changed.set()
        await self._audited(caller, UseCase.SCHEDULES_CHANGE, org_id, args=args)
        return changed

    async def next_schedule_at(self) -> datetime | None:
        """When the earliest active schedule is due (the scheduler's sleep)."""
        return await self.schedules.next_due_at()

    async def fire_due_schedules(self, now: Any = None) -> list[tuple[str, UUID]]:
        """Fire every due schedule once (the scheduler's sweep, in every organisation): the
        (organisation, run id) of each run made here, for the executor to drive."""
        now = now or utcnow()
        made: list[tuple[str, UUID]] = []
        while True:
            batch, taken = await self.schedules.fire_due(now)
            made.extend(batch)
            if not taken:
                return made
