"""The workflow use cases (``Runtime.workflows``) and a run's ledger.

The ledger is a view over the record, not a second copy: the run row (version, principal,
mode, inputs), its steps (what DECIDE proposed), the gate's audit rows (what was executed,
simulated, proposed or refused, with the evidence each result cited), its approval requests
and label, read together as one ordered timeline. Large arguments and results are payloads
stored once by hash (``payloads``); events reference them, and ``payloads=True`` returns
each referenced payload once beside the events."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal, RunMode, TaskRun
from cortex_ray.access import UseCase
from cortex_ray.governance._patterns import InputLimits
from cortex_ray.governance._store import GovernanceStore
from cortex_ray.governance._types import RunLabelRecord
from cortex_ray.governance._workflows import (
    NAME_PATTERN,
    EvidenceCheck,
    Workflow,
    WorkflowAcceptance,
    WorkflowStore,
    WorkflowVersion,
    WorkflowVersionSpec,
    check_input_schema,
    check_inputs,
    evidence_of,
    run_mode_for,
)
from cortex_ray.storage import Store

__all__ = ["LedgerEvent", "RunLedger", "Workflows"]

_SHA = re.compile(r"^[0-9a-f]{64}$")
_Key = tuple[int, int, int, int]
"""An event's place in a ledger's logical order (see ``_timeline``)."""
_CURSOR = re.compile(r"^\d{1,9}\.\d{1,9}\.\d{1,9}\.\d{1,19}$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LedgerEvent(_Model):
    """One event of a run's timeline.

    ``kind``: ``started``; per step ``decided`` (the action DECIDE proposed), ``call`` (what
    the gate did with it: ``outcome`` allowed, simulated, proposed, denied, refused,
    approval_required, rejected, error, ...), ``approval_requested``, ``approval_decided``;
    ``request`` (a use case on the run: resume, cancel); ``finished``; ``evidence`` (the
    required evidence checked); ``labelled``. ``payloads``: the sha256 of the stored
    payloads the event references."""

    seq: int
    kind: str
    at: datetime | None = None
    step_index: int | None = None
    tool: str | None = None
    outcome: str | None = None
    summary: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    payloads: tuple[str, ...] = ()


class RunLedger(_Model):
    """A run's ledger: what it followed and who started it how, and its timeline."""

    run_id: UUID
    agent_id: UUID
    workflow: str | None
    workflow_id: UUID | None
    version: int | None
    workflow_version_id: UUID | None
    risk: str | None
    requested_by: str | None
    caller_id: str | None
    run_mode: RunMode
    status: str
    reason: str | None
    inputs: dict[str, Any] | None
    evidence: EvidenceCheck | None
    label: RunLabelRecord | None
    events: tuple[LedgerEvent, ...]
    payloads: dict[str, Any] = Field(default_factory=dict)
    """Each payload the events reference once (sha256 → value), when asked for."""
    next_after: str | None = None
    """The cursor of the next page of events (``after``); ``None``: this page is the last."""


class _Authorize(Protocol):
    def __call__(
        self, principal: Principal | None, use_case: UseCase, org_id: str, *, args: Any = None
    ) -> Awaitable[Principal]: ...


class _Audited(Protocol):
    def __call__(
        self, caller: Principal, use_case: UseCase, org_id: str, *, args: Any = None
    ) -> Awaitable[None]: ...


class _Start(Protocol):
    def __call__(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        max_steps: int | None,
        name: str,
        caller_id: str | None,
        contact_context: dict[str, Any] | None,
        principal: Principal | None,
        run_mode: RunMode = RunMode.EXECUTE,
        *,
        workflow: WorkflowVersion | None = None,
        inputs: dict[str, Any] | None = None,
    ) -> Awaitable[TaskRun]: ...


class Workflows:
    """Workflow definitions, versions, runs and ledgers, as use cases (see the module
    docstring); each decided by ``AccessControlService.authorize`` and audited."""

    def __init__(
        self,
        *,
        store: Store,
        governance: GovernanceStore,
        tool_connector: Callable[[str], tuple[bool, str | None]],
        connectors: Callable[[], Iterable[str]],
        authorize: _Authorize,
        audited: _Audited,
        start: _Start,
        input_limits: InputLimits | None = None,
    ) -> None:
        self.input_limits = input_limits or InputLimits()
        self.store = store
        self.gov = governance
        self.workflows = WorkflowStore(store.db)
        self._tool_connector = tool_connector
        self._connectors = connectors
        self._authorize = authorize
        self._audited = audited
        self._start = start

    async def create(
        self, org_id: str, name: str, *, description: str = "", principal: Principal | None = None
    ) -> Workflow:
        """Define a workflow (no version yet: publish one).

        Raises:
            InvalidRequestError: A bad name or a description over 2,000 characters.
            ConflictError: The name is taken here.
        """
        args = {"workflow": name}
        caller = await self._authorize(principal, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        if not re.match(NAME_PATTERN, name):
            raise InvalidRequestError(
                "a workflow's name is 1-100 lowercase letters, digits, '_', '.', '-', "
                "starting with a letter or digit"
            )
        if len(description) > 2000 or "\x00" in description:
            raise InvalidRequestError("a description is at most 2000 characters, without NUL")
        await self.store.ensure_org(org_id)
        made = await self.workflows.create(
            Workflow(org_id=org_id, name=name, description=description, created_by=caller.id)
        )
        await self._audited(caller, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        return made

    async def list_workflows(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[Workflow]:
        await self._authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
        return await self.workflows.in_org(org_id)

    async def get(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> tuple[Workflow, list[WorkflowVersion]]:
        """A workflow and its versions, oldest first."""
        await self._authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
        workflow = await self.workflows.get(org_id, name)
        return workflow, await self.workflows.versions(org_id, workflow.id)

    async def version(
        self,
        org_id: str,
        name: str,
        version: int | None = None,
        *,
        principal: Principal | None = None,
    ) -> WorkflowVersion:
        """One version (the latest without ``version``)."""
        await self._authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
        return await self.workflows.version(org_id, name, version)

    def _check_spec(self, spec: WorkflowVersionSpec) -> None:
        check_input_schema(spec.input_schema, self.input_limits)
        unknown = [t for t in spec.tools if not self._tool_connector(t)[0]]
        if unknown:
            raise InvalidRequestError(f"tools: unknown tools: {', '.join(sorted(unknown))}")
        registered = set(self._connectors())
        strangers = sorted(set(spec.connectors) - registered)
        if strangers:
            raise InvalidRequestError(
                f"connectors: no connector registered as {', '.join(strangers)}"
            )
        ungated = [
            t
            for t in spec.approval_tools
            if t not in spec.tools and self._tool_connector(t)[1] not in spec.connectors
        ]
        if ungated:
            raise InvalidRequestError(
                "approval_tools: not allowed by this version, so never called: "
                + ", ".join(sorted(ungated))
            )
        if any(not s.strip() or "\x00" in s for s in spec.required_evidence.sources):
            raise InvalidRequestError("required_evidence.sources: empty source id")

    async def publish(
        self,
        org_id: str,
        name: str,
        spec: WorkflowVersionSpec,
        *,
        version: int | None = None,
        principal: Principal | None = None,
    ) -> tuple[WorkflowVersion, bool]:
        """Publish a new, immutable version (the next one; or exactly ``version``, which,
        published already with the same spec, is returned unchanged). Returns it and
        whether it was made now.

        Raises:
            NotFoundError: No such workflow here.
            InvalidRequestError: The input schema is not a JSON schema of an object; an
                unknown tool or connector; an approval gate on a tool the version does not
                allow; ``version`` is not the next one.
            ConflictError: ``version`` is published with another spec: versions are
                immutable.
        """
        args = {"workflow": name, "version": version}
        caller = await self._authorize(principal, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        workflow = await self.workflows.get(org_id, name)
        self._check_spec(spec)
        published, made = await self.workflows.publish(workflow, spec, caller.id, version)
        if made:
            args["version"] = published.version
            await self._audited(caller, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        return published, made

    async def start_run(
        self,
        org_id: str,
        name: str,
        agent_ref: UUID | str,
        inputs: dict[str, Any],
        *,
        version: int | None = None,
        run_mode: RunMode | None = None,
        max_steps: int | None = None,
        run_name: str = "",
        caller_id: str | None = None,
        principal: Principal | None = None,
    ) -> TaskRun:
        """Record a RUNNING run of a workflow version (the latest, or ``version``) by an
        AUTONOMOUS agent: its goal is the version's instructions, its inputs valid against
        the version's schema, its mode the version's default or a safer one. Hand its id
        to an executor, as for any task.

        Raises:
            NotFoundError: No such workflow, version or agent here.
            InvalidRequestError: The inputs fail the schema (the first failing path and
                why), an unsafe mode, or what ``Runtime.start_run`` refuses.
        """
        await self._authorize(principal, UseCase.TASKS_SUBMIT, org_id)
        found = await self.workflows.version(org_id, name, version)
        checked = check_inputs(found, inputs, self.input_limits)
        mode = run_mode_for(found, run_mode)
        return await self._start(
            org_id,
            agent_ref,
            found.instructions,
            max_steps,
            run_name or found.label,
            caller_id,
            None,
            principal,
            mode,
            workflow=found,
            inputs=checked,
        )

    async def runs(
        self, org_id: str, name: str, *, limit: int = 50, principal: Principal | None = None
    ) -> list[dict[str, Any]]:
        """The workflow's runs, newest first (id, version, agent, mode, status, times)."""
        await self._authorize(principal, UseCase.TASKS_LIST, org_id)
        workflow = await self.workflows.get(org_id, name)
        return await self.workflows.runs(org_id, workflow.id, limit)

    async def acceptance(
        self, org_id: str, *, name: str | None = None, principal: Principal | None = None
    ) -> list[WorkflowAcceptance]:
        """Acceptance of shadow runs per workflow version (``name``: one workflow)."""
        await self._authorize(principal, UseCase.TASKS_LIST, org_id)
        workflow_id = None if name is None else (await self.workflows.get(org_id, name)).id
        return await self.workflows.acceptance(org_id, workflow_id)

    async def payload(self, org_id: str, sha256: str, *, principal: Principal | None = None) -> Any:
        """A stored payload's value: a run's large argument or result (members, who read
        runs' reports), or any call's (admins, who read the audit log).

        Raises:
            InvalidRequestError: Not a sha256 in hex.
            NotFoundError: No such payload in this organisation (or, for a member, none a
                run references: whether another call's exists is not said).
        """
        caller = await self._authorize(principal, UseCase.TASKS_GET, org_id)
        if not _SHA.match(sha256):
            raise InvalidRequestError("a payload is named by its sha256: 64 lowercase hex digits")
        found = await self.store.payloads(org_id, [sha256])
        if not caller.is_admin and not await self.store.payload_of_a_run(org_id, sha256):
            found = {}
        if sha256 not in found:
            raise NotFoundError(f"no payload {sha256} in this organisation")
        return json.loads(found[sha256])

    async def ledger(
        self,
        org_id: str,
        run_id: UUID,
        *,
        workflow: str | None = None,
        payloads: bool = False,
        limit: int | None = None,
        after: str | None = None,
        principal: Principal | None = None,
    ) -> RunLedger:
        """A run's ledger (any run; ``workflow``: only a run of that workflow is found), its
        events a page at a time: at most ``limit`` (``None``: all), those after the cursor
        ``after`` in the timeline's logical order (``next_after`` of the previous page).
        ``payloads``: those the page's events reference.

        Raises:
            NotFoundError: No such run here (of that workflow).
            InvalidRequestError: ``after`` is not a cursor; ``limit`` below 1.
        """
        if limit is not None and limit < 1:
            raise InvalidRequestError("limit must be at least 1")
        cursor = None if after is None else _parse_cursor(after)
        await self._authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id)
        version = None
        if run.workflow_version_id is not None:
            version = await self.workflows.version_by_id(org_id, run.workflow_version_id)
        if workflow is not None and (version is None or version.workflow != workflow):
            raise NotFoundError(f"no run {run_id} of workflow {workflow!r} in this organisation")
        rows = await self.store.audit_rows(org_id, run_id=run_id)
        gate = [r for r in rows if r["mode"] is not None]
        evidence = None
        if version is not None:
            evidence = evidence_of(gate, version.required_evidence)
        approvals = await self.gov.approvals(org_id, run_id=run_id, limit=10_000)
        label = await self.gov.label(org_id, run_id)
        timeline = _timeline(run, rows, approvals, label, version, evidence)
        if cursor is not None:
            timeline = [(key, e) for key, e in timeline if key > cursor]
        page = timeline if limit is None else timeline[:limit]
        more = len(page) < len(timeline)
        events = tuple(e for _, e in page)
        stored: dict[str, Any] = {}
        if payloads:
            refs = sorted({ref for e in events for ref in e.payloads})
            stored = {
                k: json.loads(v) for k, v in (await self.store.payloads(org_id, refs)).items()
            }
        return RunLedger(
            run_id=run.id,
            agent_id=run.agent_id,
            workflow=None if version is None else version.workflow,
            workflow_id=None if version is None else version.workflow_id,
            version=None if version is None else version.version,
            workflow_version_id=run.workflow_version_id,
            risk=None if version is None else version.risk.value,
            requested_by=run.requested_by,
            caller_id=run.caller_id,
            run_mode=run.run_mode,
            status=run.status.value,
            reason=run.reason,
            inputs=run.workflow_inputs,
            evidence=evidence,
            label=label,
            events=events,
            payloads=stored,
            next_after=_cursor(page[-1][0]) if more else None,
        )


def _timeline(
    run: TaskRun,
    rows: list[dict[str, Any]],
    approvals: Iterable[Any],
    label: RunLabelRecord | None,
    version: WorkflowVersion | None,
    evidence: EvidenceCheck | None,
) -> list[tuple[_Key, LedgerEvent]]:
    """The events in order, each with its key in that order (a page's cursor): the start;
    then per step what was proposed, the gate's answers, approvals (in that logical order:
    the clocks of the rows differ); then the end, the evidence check and the label. ``seq``
    numbers the whole timeline, whatever page an event is read in."""
    keyed: list[tuple[_Key, dict[str, Any]]] = []

    def add(key: _Key, **event: Any) -> None:
        keyed.append((key, event))

    add(
        (0, 0, 0, 0),
        kind="started",
        at=run.created_at,
        outcome=run.run_mode.value,
        summary=run.goal[:500],
        data={
            "requested_by": run.requested_by,
            "caller_id": run.caller_id,
            "max_steps": run.max_steps,
            "workflow": None if version is None else version.label,
        },
    )
    for step in run.steps:
        action = step.action
        add(
            (1, step.step_index, 0, 0),
            kind="decided",
            at=step.created_at,
            step_index=step.step_index,
            tool=None if action is None else action.tool,
            outcome=step.decision.value,
            summary=(step.note or step.message or "")[:500],
            data={
                "candidates": [
                    {"tool": c.tool or c.kind, "score": c.score, "valid": c.valid}
                    for c in step.candidates
                ],
                "selected": step.selected,
                "args_sha256": None if action is None else _args_sha256(action.args),
            },
        )
    last_step: int | None = None  # the step of the latest gate row so far (ids are ordered)
    for row in rows:
        if row["mode"] is None:  # a use case on the run
            if row["tool"] == "tasks.submit":
                continue  # the start itself
            add(
                (0, 0, 1, row["id"]) if last_step is None else (1, last_step, 5, row["id"]),
                kind="request",
                at=row["at"],
                tool=row["tool"],
                outcome=row["status"],
                summary=row["reason"] or "",
                data={"principal_id": row["principal_id"], "args": row["args"]},
            )
            continue
        last_step = row["step_index"] if row["step_index"] is not None else last_step
        decision = row["decision"] or ("allowed" if row["status"] == "OK" else "error")
        refs = tuple(r for r in (row.get("args_ref"), row.get("result_ref")) if r)
        add(
            (1, row["step_index"] or 0, 1 if decision == "approval_required" else 4, row["id"]),
            kind="call",
            at=row["at"],
            step_index=row["step_index"],
            tool=row["tool"],
            outcome=decision,
            summary=row["reason"] or "",
            data={
                "tier": row["tier"],
                "connector": row["connector"],
                "status": row["status"],
                "args": row["args"],
                "input_sha256": row["input_sha256"],
                "result_sha256": row["result_sha256"],
                "args_ref": row.get("args_ref"),
                "result_ref": row.get("result_ref"),
                "source_ids": list(row["source_ids"] or ()),
                "source_versions": list(row.get("source_versions") or ()),
                "grant_ids": [str(g) for g in row["grant_ids"] or ()],
                "duration_ms": row["duration_ms"],
            },
            payloads=refs,
        )
    for a in approvals:
        add(
            (1, a.step_index, 2, 0),
            kind="approval_requested",
            at=a.created_at,
            step_index=a.step_index,
            tool=a.tool,
            outcome="PENDING",
            summary=a.reason,
            data={"approval_id": str(a.id), "tier": a.tier, "expires_at": a.expires_at.isoformat()},
            payloads=a.payloads,
        )
        if a.decided_at is not None:
            add(
                (1, a.step_index, 3, 0),
                kind="approval_decided",
                at=a.decided_at,
                step_index=a.step_index,
                tool=a.tool,
                outcome=a.status.value,
                summary=a.note,
                data={"approval_id": str(a.id), "decided_by": a.decided_by},
            )
    if run.finished_at is not None:
        add(
            (3, 0, 0, 0),
            kind="finished",
            at=run.finished_at,
            outcome=run.status.value,
            summary=run.reason or "",
            data={"has_result": run.result is not None},
        )
    if evidence is not None and evidence.required.required and run.finished_at is not None:
        add(
            (3, 0, 1, 0),
            kind="evidence",
            at=run.finished_at,
            outcome="satisfied" if evidence.satisfied else "missing",
            summary="" if evidence.satisfied else evidence.finding(),
            data=evidence.model_dump(mode="json"),
        )
    if label is not None:
        add(
            (4, 0, 0, 0),
            kind="labelled",
            at=label.labelled_at,
            outcome=label.label.value,
            summary=label.note,
            data={"labelled_by": label.labelled_by},
        )
    keyed.sort(key=lambda k: k[0])
    return [(key, LedgerEvent(seq=i, **event)) for i, (key, event) in enumerate(keyed)]


def _cursor(key: _Key) -> str:
    # The event's place in the logical order, not its index: an event recorded meanwhile
    # before the cursor (a request on a running run) cannot shift the next page.
    return ".".join(map(str, key))


def _parse_cursor(after: str) -> _Key:
    if not _CURSOR.match(after):
        raise InvalidRequestError(
            f"after: {after[:100]!r} is not a ledger cursor (the nextAfter of a page)"
        )
    a, b, c, d = (int(part) for part in after.split("."))
    return a, b, c, d


def _args_sha256(args: Any) -> str:
    # The gate's hash of a call's arguments (audit ``input_sha256``): the proposal and the
    # call it became are matched by it, without copying the arguments.
    text = json.dumps(args, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
