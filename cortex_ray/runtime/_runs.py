"""Task runs as use cases: start (a ``RunRequest``), run here, resume, cancel, and read a
run, its lease, trace and diagnostics. Driving a run an executor was handed is the
executor seam's (``_execution``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID, uuid4

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import Agent, AgentMode, Principal, RunMode, RunStatus, TaskRun
from cortex_ray.access import UseCase
from cortex_ray.cycle import StepCallback
from cortex_ray.governance import WorkflowVersion
from cortex_ray.observability import (
    GEN_AI_AGENT_NAME,
    RunTrace,
    current_traceparent,
    metrics,
    submission_span,
)
from cortex_ray.observability.diagnostics import Diagnosis
from cortex_ray.runtime._admission import Admission
from cortex_ray.runtime._follow import Drive, OnBusy
from cortex_ray.runtime._follow import resume_or_wait as follow_run
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.runtime._traces import Traces
from cortex_ray.settings import Settings
from cortex_ray.storage import AgentStore, LeaseHolder, RunStore, TraceReader

__all__ = [
    "MAX_CONTACT_CONTEXT_BYTES",
    "RunDriver",
    "RunRequest",
    "RunUseCases",
    "RunsStore",
]

MAX_CONTACT_CONTEXT_BYTES = 8192
"""The largest contact context a run takes, as UTF-8 JSON."""


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What starting a run asks for (``RunUseCases.start``).

    Attributes:
        org_id: The organisation.
        agent_ref: The AUTONOMOUS agent that runs it, by id or name.
        goal: What the run pursues.
        max_steps: Its step budget (``None``: ``settings.decide.default_max_steps``).
        name: A name for people.
        caller_id: The person the run acts for.
        contact_context: A JSON object (at most 8 KiB) shown to the agent with the goal.
        principal: Who asks (``None``: the operator); recorded as ``requested_by``.
        run_mode: execute, dry_run or shadow.
        workflow: The workflow version it is a run of, if any.
        inputs: That run's inputs (checked against the version's schema already).
    """

    org_id: str
    agent_ref: UUID | str
    goal: str
    max_steps: int | None = None
    name: str = ""
    caller_id: str | None = None
    contact_context: dict[str, Any] | None = None
    principal: Principal | None = None
    run_mode: RunMode = RunMode.EXECUTE
    workflow: WorkflowVersion | None = None
    inputs: dict[str, Any] | None = None


class RunsStore(RunStore, AgentStore, TraceReader, Protocol):
    """What the run use cases read and write: runs, their agents, traces and diagnostics."""


class LeaseReader(Protocol):
    """Who holds a run's lease (``RunLeases``)."""

    async def holder(self, org_id: str, run_id: UUID) -> LeaseHolder: ...


class RunDriver(Protocol):
    """What drives a run here (``DecisionCycle``): from its next step, or resumed."""

    @property
    def leases(self) -> LeaseReader: ...

    async def drive(
        self, agent: Agent, run: TaskRun, on_step: StepCallback | None, *, owner: str
    ) -> TaskRun: ...

    async def resume(
        self, org_id: str, run_id: UUID, *, on_step: StepCallback | None = None, owner: str
    ) -> TaskRun: ...


class RunUseCases:
    """Task runs (``Runtime.start_run``, ``cancel_run``, ``get_run``, ...)."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: RunsStore,
        cycle: RunDriver,
        settings: Settings,
        traces: Traces,
        driver_id: str,
        admission: Admission | None = None,
    ) -> None:
        self.gate = gate
        self.store = store
        self.cycle = cycle
        self.settings = settings
        self.traces = traces
        self.driver_id = driver_id
        self.admission = admission

    async def start_run(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        *,
        max_steps: int | None = None,
        name: str = "",
        caller_id: str | None = None,
        contact_context: dict[str, Any] | None = None,
        principal: Principal | None = None,
        run_mode: RunMode = RunMode.EXECUTE,
    ) -> TaskRun:
        """Validate, admit (``Admission``: ``OverloadedError`` at capacity, nothing
        recorded) and record a new RUNNING task run (nothing is executed yet; hand its id
        to an ``Executor``, or call :meth:`drive_run`).

        ``caller_id`` is the person the run acts for; the calling principal is recorded as
        ``requested_by``. ``contact_context`` (a JSON object, at most 8 KiB) is shown to the
        agent with the goal. ``run_mode``: execute, dry_run or shadow (``RunMode``)."""
        request = RunRequest(
            org_id, agent_ref, goal, max_steps, name, caller_id, contact_context, principal,
            run_mode,
        )  # fmt: skip
        return await self.start(request)

    async def start(self, request: RunRequest) -> TaskRun:
        """Validate and record a new RUNNING run (see :meth:`start_run`)."""
        _, _, run = await self._start(request)
        return run

    async def _start(self, request: RunRequest) -> tuple[Principal, Agent, TaskRun]:
        org_id, workflow = request.org_id, request.workflow
        args: dict[str, Any] = {"agent": str(request.agent_ref), "max_steps": request.max_steps}
        if request.run_mode is not RunMode.EXECUTE:
            args["run_mode"] = request.run_mode.value
        if workflow is not None:
            args["workflow"] = workflow.workflow
            args["version"] = workflow.version
        caller, agent = await self.gate.agent_for(
            request.principal, UseCase.TASKS_SUBMIT, org_id, request.agent_ref, args=args
        )
        goal = request.goal
        if not goal or not goal.strip():
            raise InvalidRequestError("the goal is empty")
        if request.contact_context is not None:
            text = json.dumps(request.contact_context, ensure_ascii=False, sort_keys=True)
            size = len(text.encode())
            if size > MAX_CONTACT_CONTEXT_BYTES:
                raise InvalidRequestError(
                    f"contact context: at most {MAX_CONTACT_CONTEXT_BYTES} bytes as JSON, "
                    f"got {size}"
                )
        steps = (
            self.settings.decide.default_max_steps
            if request.max_steps is None
            else request.max_steps
        )
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise InvalidRequestError("max_steps must be an integer")
        limit = self.settings.decide.max_steps_limit
        if not 1 <= steps <= limit:
            raise InvalidRequestError(f"max_steps must be between 1 and {limit}, got {steps}")
        if agent.mode is not AgentMode.AUTONOMOUS:
            # An interactive agent acts for a person (agent grant ∩ caller grant); running
            # it alone would act with the agent's grant only.
            raise InvalidRequestError(
                f"agent {agent.name!r} is {agent.mode.value}; "
                "set its mode to AUTONOMOUS to run tasks"
            )
        if self.admission is not None:  # last: a request that is wrong says so first
            await self.admission.admit(org_id, "run")
        run_id = uuid4()
        with submission_span(
            f"submit_task {agent.name}",
            {"cortex.org_id": org_id, "cortex.run_id": str(run_id), GEN_AI_AGENT_NAME: agent.name},
        ):
            run = TaskRun(
                id=run_id,
                org_id=org_id,
                agent_id=agent.id,
                name=request.name,
                goal=goal.strip(),
                max_steps=steps,
                caller_id=request.caller_id,
                requested_by=caller.id,
                contact_context=request.contact_context or None,
                # every attempt's spans go under this (the hop to the actor is the run's row)
                trace_parent=current_traceparent(),
                run_mode=request.run_mode,
                workflow_version_id=None if workflow is None else workflow.id,
                workflow_inputs=None if workflow is None else dict(request.inputs or {}),
            )
            # The submission's OK row goes in the run's own transaction: one round trip of
            # statements instead of a second transaction, and never a run without its row.
            audit = None
            if UseCase.TASKS_SUBMIT.audit_allowed:
                audit = self.gate.entry(
                    caller, UseCase.TASKS_SUBMIT, org_id, "OK", None, agent, args, run_id=run.id
                )
                if workflow is not None:
                    audit.workflow_id = workflow.workflow_id
            created = await self.store.create_run(run, audit=audit)
        if audit is not None:
            self.gate.log_audited(caller, UseCase.TASKS_SUBMIT, "OK")
        metrics.record(metrics.RUNS_STARTED, org=org_id, agent=agent.name)
        return caller, agent, created

    async def run_autonomous(
        self,
        org_id: str,
        agent_ref: UUID | str,
        goal: str,
        *,
        max_steps: int | None = None,
        name: str = "",
        caller_id: str | None = None,
        on_step: StepCallback | None = None,
        principal: Principal | None = None,
        run_mode: RunMode = RunMode.EXECUTE,
    ) -> TaskRun:
        """Run an agent autonomously against ``goal`` here, until it finishes or the budget
        ends (``start_run`` + ``drive_run``)."""
        request = RunRequest(
            org_id, agent_ref, goal, max_steps, name, caller_id, None, principal, run_mode
        )
        _, agent, run = await self._start(request)
        return await self.cycle.drive(agent, run, on_step, owner=self.driver_id)

    async def resume_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        on_step: StepCallback | None = None,
        principal: Principal | None = None,
    ) -> TaskRun:
        """Continue a RUNNING run here, after its last recorded step (a run already ended is
        returned as it is). A run another driver holds (its lease is live: the API's
        executor, another ``runs resume``) is not driven here: it is returned RUNNING, and
        :meth:`run_lease` says who holds it."""
        caller = await self.gate.authorize(principal, UseCase.TASKS_RESUME, org_id)
        run = await self.store.get_run(org_id, run_id)
        if run.status is RunStatus.RUNNING:
            await self.gate.audited(caller, UseCase.TASKS_RESUME, org_id, run_id=run.id)
            return await self.cycle.resume(org_id, run_id, on_step=on_step, owner=self.driver_id)
        return run

    async def resume_or_wait(
        self,
        org_id: str,
        run: TaskRun,
        *,
        principal: Principal,
        wait: bool,
        on_busy: OnBusy,
        drive: Drive | None = None,
    ) -> TaskRun:
        """Follow a RUNNING run to its end from here (``cortex-ray runs resume [--wait]``):
        drive it, or, while another driver holds its lease, tell ``on_busy`` and either
        leave it to that driver or wait, taking it over when its lease falls free."""
        return await follow_run(
            self, org_id, run, principal=principal, wait=wait, on_busy=on_busy, drive=drive,
            poll_s=min(1.0, self.settings.runs.lease_renew_s),
        )  # fmt: skip

    async def run_lease(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> LeaseHolder:
        """Who drives a run now: its lease's owner and expiry (``live`` False: nobody)."""
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.cycle.leases.holder(org_id, run_id)

    async def cancel_run(
        self,
        org_id: str,
        run_id: UUID,
        *,
        principal: Principal | None = None,
        reason: str | None = None,
    ) -> TaskRun:
        """Stop a RUNNING run, or one AWAITING_APPROVAL (its pending request is then
        CANCELLED), as the person it acts for or an admin: it becomes CANCELLED with
        the reason "cancelled by <principal>" (then ``reason``, if given) and loses its step
        intents, in one transaction; its driver stops at its next step commit, whose fenced
        write finds the run no longer RUNNING. A run that already ended is returned as it
        is: nothing is written and no executor is asked.

        Raises:
            InvalidRequestError: ``reason`` is longer than 500 characters or holds a NUL.
        """
        caller = principal or Principal.operator(org_id)
        args: dict[str, Any] = {"run": str(run_id)}
        if caller.org_id != org_id:
            await self.gate.authorize(caller, UseCase.TASKS_CANCEL, org_id, args=args)
        run = await self.store.get_run(org_id, run_id)
        caller = await self.gate.authorize(
            caller, UseCase.TASKS_CANCEL, org_id, owner_id=run.caller_id, args=args
        )
        if run.status not in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
            return run
        note = (reason or "").strip()
        if len(note) > 500 or "\x00" in note:
            raise InvalidRequestError("a cancel reason is at most 500 characters, without NUL")
        why = f"cancelled by {caller.id}" + (f": {note}" if note else "")
        audit = None
        if UseCase.TASKS_CANCEL.audit_allowed:
            audit = self.gate.entry(
                caller, UseCase.TASKS_CANCEL, org_id, "OK", None, None,
                {**args, "reason": why}, run_id=run_id,
            )  # fmt: skip
        if await self.store.cancel_run(org_id, run_id, why, audit=audit):
            if audit is not None:
                self.gate.log_audited(caller, UseCase.TASKS_CANCEL, "OK")
            # The driver that loses the run records nothing (its fenced write fails): the
            # cancel is where the run ends, so it counts the run's outcome.
            agent = await self.store.get_agent(org_id, run.agent_id)
            metrics.record(
                metrics.RUNS_FINISHED, org=org_id, agent=agent.name,
                outcome=RunStatus.CANCELLED.value,
            )  # fmt: skip
        return await self.store.get_run(org_id, run_id)

    async def list_runs(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        limit: int = 50,
        principal: Principal | None = None,
    ) -> list[TaskRun]:
        """Recent task runs, newest first (without their step logs)."""
        await self.gate.authorize(principal, UseCase.TASKS_LIST, org_id)
        agent_id = None if agent_ref is None else (await self.store.get_agent(org_id, agent_ref)).id
        return await self.store.list_runs(org_id, agent_id, limit=limit)

    async def get_run(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> TaskRun:
        """A run with its step log."""
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.store.get_run(org_id, run_id)

    async def run_trace(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunTrace:
        """The run's locally kept trace (spans in tree order; one trace per attempt unless a
        resume continued it). Empty when spans go only to a collector (``tracing.local``).

        Raises:
            NotFoundError: No such run in the organisation.
        """
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        await self.store.run_status(org_id, run_id)  # 404 for a run that does not exist
        await self.traces.flush()  # this process's finished spans
        return RunTrace.of(run_id, await self.store.trace_spans(org_id, run_id))

    async def run_diagnostics(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> Diagnosis:
        """The run's diagnostic timeline over its attempts (request, model calls, candidates
        and scores, the selected action, tool input and result, retrieval evidence, stalls,
        loops, the end), its cost, and whether it is stalled now.

        Raises:
            NotFoundError: No such run in the organisation.
        """
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        run = await self.store.get_run(org_id, run_id)
        events = await self.store.diagnostics(org_id, run_id=run_id)
        cost = None if run.cost is None else run.cost.model_dump(mode="json")
        return Diagnosis.of(run.id, run.status.value, events, cost)

    async def run_status(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunStatus:
        """Only a run's status (one row): what a long poll reads."""
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
        return await self.store.run_status(org_id, run_id)
