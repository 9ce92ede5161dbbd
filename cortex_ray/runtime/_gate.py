"""The use-case gate: every use case of the door is decided and audited here, once.

``UseCaseGate`` is what a use-case service asks: ``authorize`` decides a use case for the
calling principal (``AccessControlService.authorize``; a refusal is audited and raised),
``audited`` writes the OK row of an allowed one that is audited when allowed, and
``entry`` / ``log_audited`` let a use case write that row in the same transaction as the
write it audits. ``agent_for`` and ``session_for`` decide a use case on one agent or one
session, looked up only for a member of its organisation.
"""

from __future__ import annotations

import logging
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID

from pydantic import ValidationError

from cortex_ray._exceptions import AccessDeniedError
from cortex_ray._types import Agent, Principal, Session
from cortex_ray.access import AccessControlService, UseCase, UseCaseRequest
from cortex_ray.act import ToolRegistry
from cortex_ray.storage import AgentStore, AuditEntry, AuditLog, SessionStore, UnitOfWork

__all__ = ["AccessGate", "GateStore", "UseCaseGate", "first_error"]

log = logging.getLogger("cortex_ray.runtime")

ConnT = TypeVar("ConnT")


class GateStore(AgentStore, SessionStore, AuditLog[ConnT], Protocol[ConnT]):
    """What the gate reads and writes: the agent or session a use case concerns, and the
    audit log, whose rows commit in a transaction of the store's unit of work (``Store``
    on ``Database``; ``FakeStore`` on ``FakeDatabase`` in the unit tests)."""

    @property
    def db(self) -> UnitOfWork[ConnT]:
        """The unit of work the audit rows are written in."""
        ...


class UseCaseGate(Protocol):
    """Authorize and audit a use case (see the module docstring)."""

    async def authorize(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        owner_id: str | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        approvers: tuple[str, ...] = (),
    ) -> Principal:
        """Decide ``use_case`` for the caller (the operator when ``None``); a refusal is
        audited and raised as ``AccessDeniedError``. Returns the acting principal."""
        ...

    async def audited(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> None:
        """The OK row of an allowed use case that is audited when allowed."""
        ...

    def entry(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        status: str,
        reason: str | None,
        agent: Agent | None,
        args: dict[str, Any] | None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> AuditEntry:
        """A use case's audit row, for the caller to write with the write it audits."""
        ...

    def log_audited(self, caller: Principal, use_case: UseCase, status: str) -> None:
        """The log line of an audit row written by the caller."""
        ...

    async def agent_for(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        agent_ref: UUID | str,
        *,
        args: dict[str, Any] | None = None,
    ) -> tuple[Principal, Agent]:
        """The agent a use case concerns and the acting principal, the use case decided."""
        ...

    async def session_for(
        self, principal: Principal | None, use_case: UseCase, org_id: str, session_id: UUID
    ) -> tuple[Principal, Session]:
        """The session a use case concerns and the acting principal (its owner is the
        session's caller), the use case decided."""
        ...


class AccessGate(Generic[ConnT]):
    """The ``UseCaseGate`` of a runtime: decided by ``access``, audited in ``store``."""

    def __init__(
        self, store: GateStore[ConnT], registry: ToolRegistry, access: AccessControlService
    ) -> None:
        self.store = store
        self.registry = registry
        self.access = access

    async def authorize(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        owner_id: str | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        approvers: tuple[str, ...] = (),
    ) -> Principal:
        caller = principal or Principal.operator(org_id)
        category = None
        if use_case is UseCase.MEMORY_SEARCH:
            tool = self.registry.get("memory_search")
            category = self.registry.classifier.classify(tool or "memory_search")
        request = UseCaseRequest(
            org_id, agent=agent, owner_id=owner_id, tool_category=category, approvers=approvers
        )
        decision = self.access.authorize(caller, use_case, request)
        if not decision.allowed:
            await self._audit(
                caller, use_case, org_id, "REFUSED", decision.reason, agent, args, session_id
            )
            log.info("refused %s for %s: %s", use_case.label, caller.id, decision.reason)
            raise AccessDeniedError(decision.reason)
        return caller

    async def audited(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        *,
        agent: Agent | None = None,
        args: dict[str, Any] | None = None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> None:
        if use_case.audit_allowed:
            await self._audit(caller, use_case, org_id, "OK", None, agent, args, session_id, run_id)

    async def _audit(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        status: str,
        reason: str | None,
        agent: Agent | None,
        args: dict[str, Any] | None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> None:
        entry = self.entry(
            caller, use_case, org_id, status, reason, agent, args, session_id, run_id
        )
        async with self.store.db.transaction() as conn:
            await self.store.insert_audit(conn, entry)
        self.log_audited(caller, use_case, status)

    def entry(
        self,
        caller: Principal,
        use_case: UseCase,
        org_id: str,
        status: str,
        reason: str | None,
        agent: Agent | None,
        args: dict[str, Any] | None,
        session_id: UUID | None = None,
        run_id: UUID | None = None,
    ) -> AuditEntry:
        return AuditEntry(
            org_id=org_id,
            principal_id=caller.id,
            agent_id=None if agent is None else agent.id,
            mode=None,
            tool=use_case.label,
            action_type=use_case.category,
            status=status,
            reason=reason,
            args=args or {},
            duration_ms=0.0,
            run_id=run_id,
            step_index=None,
            session_id=session_id,
            idempotency_key=None,
            tier=use_case.tier,
        )

    def log_audited(self, caller: Principal, use_case: UseCase, status: str) -> None:
        log.info(
            "use case %s category=%s status=%s principal=%s",
            use_case.label,
            use_case.category.value,
            status,
            caller.id,
            extra={"action_type": use_case.category.value, "use_case": use_case.label},
        )

    async def agent_for(
        self,
        principal: Principal | None,
        use_case: UseCase,
        org_id: str,
        agent_ref: UUID | str,
        *,
        args: dict[str, Any] | None = None,
    ) -> tuple[Principal, Agent]:
        # Looked up only for a member: another organisation's principal learns nothing.
        caller = principal or Principal.operator(org_id)
        if caller.org_id != org_id:
            await self.authorize(caller, use_case, org_id, args=args)
        agent = await self.store.get_agent(org_id, agent_ref)
        return await self.authorize(caller, use_case, org_id, agent=agent, args=args), agent

    async def session_for(
        self, principal: Principal | None, use_case: UseCase, org_id: str, session_id: UUID
    ) -> tuple[Principal, Session]:
        caller = principal or Principal.operator(org_id)
        if caller.org_id != org_id:
            await self.authorize(caller, use_case, org_id, session_id=session_id)
        session = await self.store.get_session(org_id, session_id)
        caller = await self.authorize(
            caller, use_case, org_id, owner_id=session.caller_id, session_id=session_id
        )
        return caller, session


def first_error(exc: ValidationError) -> str:
    """The first error of a validation, as ``where: what``."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ())) or "value"
    return f"{where}: {error.get('msg', 'invalid')}"
