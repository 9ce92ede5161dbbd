"""Approvals inside the autonomous cycle (issue 18, point 3): pausing a run on a call whose
policy requires approval, and settling the decision when the run is resumed.

A request is a row (``approvals``), written in the driver's fenced transaction together
with the call's audit row and the run's move to AWAITING_APPROVAL (its lease released): a
paused run holds no driver, no actor and no thread, so it survives any crash. A person's
decision (or the request's expiry) puts the run back to RUNNING; whoever resumes it then
finds the decided request for its next step here:

- approved: the step is not decided again; the recorded decision is replayed and the call
  goes through the gate, which evaluates the policy again (a grant revoked meanwhile still
  denies) without asking for approval twice;
- rejected or expired: the step is recorded with a REFUSED observation saying so, and the
  agent decides its next step knowing it.

An interactive turn has a person waiting on the other end, so it waits too
(``await_turn_approval``): the request (tied to the session, the turn and the tool round)
is recorded, an APPROVAL_REQUIRED event streamed, and the row read every
``approval_poll_s`` (the turn's lease renewed meanwhile) until it is decided or expires.
A turn recovered after its driver died finds its round's request again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from cortex_ray._types import (
    Decision,
    Observation,
    ObservationStatus,
    RunStatus,
    Step,
    TaskRun,
    TurnEvent,
    TurnEventKind,
    utcnow,
)
from cortex_ray.act import Dispatch, InvocationContext
from cortex_ray.governance import Approval, ApprovalStatus, GovernanceStore
from cortex_ray.storage import RunLease, TurnLease

if TYPE_CHECKING:
    from cortex_ray._cycle import DecisionCycle

__all__ = [
    "await_turn_approval",
    "pause_for_approval",
    "refusal_reason",
    "replayed",
    "settle_approval",
]

EVIDENCE_CALLS = 5
"""How many of the run's latest calls an approval request shows as its evidence."""


async def pause_for_approval(
    cycle: DecisionCycle,
    store: GovernanceStore,
    run: TaskRun,
    lease: RunLease,
    step_index: int,
    decision: Decision,
    dispatch: Dispatch,
    observations: list[Observation],
    *,
    clear_intent: bool,
) -> TaskRun:
    """Record the request, the call's audit row, and the run AWAITING_APPROVAL (lease
    released), in one fenced transaction; returns the run as it now is."""
    assert decision.action is not None
    audit = dispatch.audit
    evidence = [
        {"tool": o.tool, "args": o.args, "status": o.status.value, "summary": o.summary[:500]}
        for o in observations[-EVIDENCE_CALLS:]
    ]
    approval = Approval(
        org_id=run.org_id,
        run_id=run.id,
        step_index=step_index,
        tool=decision.action.tool,
        args=decision.action.args,
        tier=audit.tier.value if audit.tier is not None else "write",
        decision=decision.model_dump(mode="json"),
        evidence=evidence,
        reason=audit.reason or "",
        requested_by=run.requested_by or audit.principal_id,
        expires_at=utcnow() + timedelta(seconds=cycle.settings.governance.approval_ttl_s),
    )
    async with cycle.leases.fenced(lease) as conn:
        if clear_intent:
            await cycle.store.clear_intent(conn, run.org_id, run.id, step_index)
        await cycle.store.insert_audit(conn, audit)
        await store.insert_approval(conn, approval)
        await conn.execute(
            """
            UPDATE task_runs SET status = 'AWAITING_APPROVAL', lease_owner = NULL,
                lease_expires_at = NULL
            WHERE org_id = %s AND id = %s
            """,
            (run.org_id, run.id),
        )
    return run.model_copy(
        update={"status": RunStatus.AWAITING_APPROVAL, "reason": f"awaiting approval {approval.id}"}
    )


def replayed(approval: Approval) -> Decision:
    """The decision the request recorded, as DECIDE made it."""
    return Decision.model_validate(approval.decision)


async def settle_approval(
    cycle: DecisionCycle,
    store: GovernanceStore,
    ctx: InvocationContext,
    run: TaskRun,
    lease: RunLease,
    observations: list[Observation],
) -> tuple[TaskRun, Approval | None]:
    """At resume: the approved request for the run's next step (to carry out), or, for a
    rejected or expired one, that step recorded as refused (the run read again)."""
    step_index = len(run.steps)
    approval = await store.approval_for_step(run.org_id, run.id, step_index)
    if approval is None or approval.status is ApprovalStatus.PENDING:
        return run, None
    if approval.status is ApprovalStatus.APPROVED:
        return run, approval
    decision = replayed(approval)
    action = decision.action
    assert action is not None
    why = refusal_reason(approval)
    observation = Observation(
        tool=action.tool,
        action_type=action.action_type,
        status=ObservationStatus.REFUSED,
        summary=f"refused: {why} (not executed)",
        step_index=step_index,
        args=action.args,
    )
    step = Step(
        run_id=run.id,
        step_index=step_index,
        decision=decision.kind,
        candidates=decision.candidates,
        selected=decision.selected,
        action=action,
        action_type=action.action_type,
        observation=observation,
        note=why,
    )
    audit = cycle.dispatcher.audit_entry(ctx, action, status="REFUSED", reason=why)
    await cycle.learner.record_step(
        await cycle.store.get_agent(run.org_id, run.agent_id),
        run,
        step,
        decision,
        audit,
        clear_intent=False,
        lease=lease,
    )
    observations.append(observation)
    return await cycle.store.get_run(run.org_id, run.id), None


def refusal_reason(approval: Approval) -> str:
    """Why a request that was not approved stops its call (what the agent observes)."""
    if approval.status is ApprovalStatus.EXPIRED:
        return f"approval expired at {approval.expires_at.isoformat(timespec='seconds')}"
    if approval.status is ApprovalStatus.CANCELLED:
        return "approval cancelled" + (f": {approval.note}" if approval.note else "")
    return f"approval rejected by {approval.decided_by}" + (
        f": {approval.note}" if approval.note else ""
    )


async def await_turn_approval(
    cycle: DecisionCycle,
    store: GovernanceStore,
    lease: TurnLease,
    round_index: int,
    decision: Decision,
    dispatch: Dispatch,
    observations: list[Observation],
    emit: Callable[[TurnEvent], Awaitable[None]],
) -> Approval:
    """Record the round's request (or find the one a previous attempt of the turn made),
    stream APPROVAL_REQUIRED, and wait until it is decided or expires (then EXPIRED here:
    it counts as a rejection). Returns the request as decided."""
    assert decision.action is not None
    audit = dispatch.audit
    turn = lease.turn
    wanted = Approval(
        org_id=turn.org_id,
        session_id=turn.session_id,
        turn_id=turn.id,
        step_index=round_index,
        tool=decision.action.tool,
        args=decision.action.args,
        tier=audit.tier.value if audit.tier is not None else "write",
        decision=decision.model_dump(mode="json"),
        evidence=[
            {"tool": o.tool, "args": o.args, "status": o.status.value, "summary": o.summary[:500]}
            for o in observations[-EVIDENCE_CALLS:]
        ],
        reason=audit.reason or "",
        requested_by=turn.caller_id,
        expires_at=utcnow() + timedelta(seconds=cycle.settings.governance.approval_ttl_s),
    )
    approval = await store.put_turn_approval(wanted)
    await emit(
        TurnEvent(
            kind=TurnEventKind.APPROVAL_REQUIRED,
            round=round_index,
            tool=approval.tool,
            args=approval.args,
            text=approval.reason,
            approval_id=approval.id,
            approvers=approval.approvers,
            expires_at=approval.expires_at,
        )
    )
    poll = cycle.settings.governance.approval_poll_s
    while approval.status is ApprovalStatus.PENDING:
        left = (approval.expires_at - utcnow()).total_seconds()
        if left <= 0:
            expired = await store.decide(approval.org_id, approval.id, ApprovalStatus.EXPIRED, None)
            approval = expired or await store.approval(approval.org_id, approval.id)
            break
        await asyncio.sleep(min(poll, left))
        approval = await store.approval(approval.org_id, approval.id)
    return approval
