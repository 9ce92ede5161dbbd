"""The workflow use cases (``Runtime.workflows``): definitions, immutable versions, runs
and their ledgers, each decided and audited by the ``UseCaseGate``. What they manage (the
store, the checks, the ledger's timeline) is ``cortex_ray.governance``'s."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from uuid import UUID

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import Principal, RunMode, TaskRun
from cortex_ray.access import UseCase
from cortex_ray.governance import (
    NAME_PATTERN,
    GovernanceStore,
    InputLimits,
    RunLedger,
    Workflow,
    WorkflowAcceptance,
    WorkflowStore,
    WorkflowVersion,
    WorkflowVersionSpec,
    check_input_schema,
    check_inputs,
    is_sha256,
    ledger_page,
    parse_cursor,
    run_mode_for,
)
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.runtime._runs import RunRequest
from cortex_ray.storage import Store

__all__ = ["Workflows"]


class Workflows:
    """Workflow definitions, versions, runs and ledgers, as use cases (see the module
    docstring); ``start`` records a run (``RunUseCases.start``)."""

    def __init__(
        self,
        *,
        gate: UseCaseGate,
        store: Store,
        governance: GovernanceStore,
        tool_connector: Callable[[str, str], Awaitable[tuple[bool, str | None]]],
        connectors: Callable[[str], Awaitable[Iterable[str]]],
        start: Callable[[RunRequest], Awaitable[TaskRun]],
        input_limits: InputLimits | None = None,
    ) -> None:
        self.gate = gate
        self.input_limits = input_limits or InputLimits()
        self.store = store
        self.gov = governance
        self.workflows = WorkflowStore(store.db)
        self._tool_connector = tool_connector
        self._connectors = connectors
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
        caller = await self.gate.authorize(principal, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
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
        await self.gate.audited(caller, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        return made

    async def list_workflows(
        self, org_id: str, *, principal: Principal | None = None
    ) -> list[Workflow]:
        await self.gate.authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
        return await self.workflows.in_org(org_id)

    async def get(
        self, org_id: str, name: str, *, principal: Principal | None = None
    ) -> tuple[Workflow, list[WorkflowVersion]]:
        """A workflow and its versions, oldest first."""
        await self.gate.authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
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
        await self.gate.authorize(principal, UseCase.WORKFLOWS_LIST, org_id)
        return await self.workflows.version(org_id, name, version)

    async def _check_spec(self, org_id: str, spec: WorkflowVersionSpec) -> None:
        """The spec's tools and connectors exist for the organisation (its MCP servers'
        included); its schema and approval tools are sound."""
        check_input_schema(spec.input_schema, self.input_limits)
        found = {
            t: await self._tool_connector(org_id, t) for t in {*spec.tools, *spec.approval_tools}
        }
        unknown = [t for t in spec.tools if not found[t][0]]
        if unknown:
            raise InvalidRequestError(f"tools: unknown tools: {', '.join(sorted(unknown))}")
        registered = set(await self._connectors(org_id))
        strangers = sorted(set(spec.connectors) - registered)
        if strangers:
            raise InvalidRequestError(
                f"connectors: no connector registered as {', '.join(strangers)}"
            )
        ungated = [
            t
            for t in spec.approval_tools
            if t not in spec.tools and found[t][1] not in spec.connectors
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
        caller = await self.gate.authorize(principal, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
        workflow = await self.workflows.get(org_id, name)
        await self._check_spec(org_id, spec)
        published, made = await self.workflows.publish(workflow, spec, caller.id, version)
        if made:
            args["version"] = published.version
            await self.gate.audited(caller, UseCase.WORKFLOWS_DEFINE, org_id, args=args)
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
        await self.gate.authorize(principal, UseCase.TASKS_SUBMIT, org_id)
        found = await self.workflows.version(org_id, name, version)
        checked = check_inputs(found, inputs, self.input_limits)
        mode = run_mode_for(found, run_mode)
        return await self._start(
            RunRequest(
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
        )

    async def runs(
        self, org_id: str, name: str, *, limit: int = 50, principal: Principal | None = None
    ) -> list[dict[str, Any]]:
        """The workflow's runs, newest first (id, version, agent, mode, status, times)."""
        await self.gate.authorize(principal, UseCase.TASKS_LIST, org_id)
        workflow = await self.workflows.get(org_id, name)
        return await self.workflows.runs(org_id, workflow.id, limit)

    async def acceptance(
        self, org_id: str, *, name: str | None = None, principal: Principal | None = None
    ) -> list[WorkflowAcceptance]:
        """Acceptance of shadow runs per workflow version (``name``: one workflow)."""
        await self.gate.authorize(principal, UseCase.TASKS_LIST, org_id)
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
        caller = await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        if not is_sha256(sha256):
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
        cursor = None if after is None else parse_cursor(after)
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id)
        version = None
        if run.workflow_version_id is not None:
            version = await self.workflows.version_by_id(org_id, run.workflow_version_id)
        if workflow is not None and (version is None or version.workflow != workflow):
            raise NotFoundError(f"no run {run_id} of workflow {workflow!r} in this organisation")
        rows = await self.store.audit_rows(org_id, run_id=run_id)
        approvals = await self.gov.approvals(org_id, run_id=run_id, limit=10_000)
        label = await self.gov.label(org_id, run_id)
        ledger = ledger_page(run, rows, approvals, label, version, after=cursor, limit=limit)
        if not payloads:
            return ledger
        refs = sorted({ref for e in ledger.events for ref in e.payloads})
        stored = {k: json.loads(v) for k, v in (await self.store.payloads(org_id, refs)).items()}
        return ledger.model_copy(update={"payloads": stored})
