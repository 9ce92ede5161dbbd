"""What people review, as use cases: what a run did and would have done (its report), the
labels of shadow runs, and approval requests (list, decide, expire)."""

from __future__ import annotations

from uuid import UUID

from cortex_ray._exceptions import ConflictError, InvalidRequestError
from cortex_ray._types import Principal, RunMode, utcnow
from cortex_ray.access import UseCase
from cortex_ray.governance import (
    Approval,
    ApprovalStatus,
    GovernanceStore,
    ReportedCall,
    RunLabel,
    RunLabelRecord,
    RunReport,
    ShadowAcceptance,
)
from cortex_ray.runtime._gate import UseCaseGate
from cortex_ray.storage import Store

__all__ = ["ReviewUseCases"]


class ReviewUseCases:
    """Run reports, shadow labels and approvals (reached as ``Runtime.governance``);
    ``excludes_requester``: a run's requester may not decide its approvals."""

    def __init__(
        self,
        gate: UseCaseGate,
        store: Store,
        governance: GovernanceStore,
        *,
        excludes_requester: bool = False,
    ) -> None:
        self.gate = gate
        self.store = store
        self.gov = governance
        self.excludes_requester = excludes_requester

    async def run_report(
        self, org_id: str, run_id: UUID, *, principal: Principal | None = None
    ) -> RunReport:
        """What a run did and, dry or shadow, would have done (from its audit rows)."""
        await self.gate.authorize(principal, UseCase.TASKS_GET, org_id)
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
        caller = await self.gate.authorize(principal, UseCase.TASKS_LABEL, org_id, args=args)
        if len(note) > 2000:
            raise InvalidRequestError("a label's note is at most 2000 characters")
        run = await self.store.get_run(org_id, run_id)
        if run.run_mode is not RunMode.SHADOW:
            raise InvalidRequestError(f"run {run_id} is a {run.run_mode.value} run, not shadow")
        if not run.status.ended:
            raise ConflictError(f"run {run_id} has not ended ({run.status.value})")
        record = await self.gov.put_label(org_id, run_id, label, note, caller.id)
        await self.gate.audited(caller, UseCase.TASKS_LABEL, org_id, args=args)
        return record

    async def shadow_report(
        self,
        org_id: str,
        *,
        agent_ref: UUID | str | None = None,
        principal: Principal | None = None,
    ) -> list[ShadowAcceptance]:
        """Acceptance of shadow runs per agent (``agent_ref``: one agent)."""
        await self.gate.authorize(principal, UseCase.TASKS_LIST, org_id)
        agent_id = None
        if agent_ref is not None:
            agent_id = (await self.store.get_agent(org_id, agent_ref)).id
        return await self.gov.shadow_acceptance(org_id, agent_id)

    async def list_approvals(
        self,
        org_id: str,
        *,
        status: ApprovalStatus | None = None,
        run_id: UUID | None = None,
        principal: Principal | None = None,
    ) -> list[Approval]:
        """The organisation's approval requests, oldest first."""
        await self.gate.authorize(principal, UseCase.APPROVALS_LIST, org_id)
        return await self.gov.approvals(org_id, status=status, run_id=run_id)

    async def get_approval(
        self, org_id: str, approval_id: UUID, *, principal: Principal | None = None
    ) -> Approval:
        await self.gate.authorize(principal, UseCase.APPROVALS_LIST, org_id)
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
        caller = await self.gate.authorize(
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
        await self.gate.audited(caller, UseCase.APPROVALS_DECIDE, org_id, args=args)
        return decided

    async def expire_approvals(self) -> list[Approval]:
        """Expire every pending request whose time is up (the supervisor's sweep): each
        counts as a rejection, its run back to RUNNING for the executor."""
        return await self.gov.expire_due()
