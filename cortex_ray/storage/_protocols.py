"""The stores a use case depends on, one narrow protocol per domain.

A use case takes the protocols it needs, not the concrete ``Store``: in production
``Store`` and ``Database`` satisfy them structurally (their signatures are these; the
``TYPE_CHECKING`` block at the end of this module has mypy prove it), and a unit test
hands it the in-memory fakes of ``tests/fakes/``, which ``tests/test_store_contract.py``
holds to the same behaviour as the real store on PostgreSQL.

Errors are part of the contract: a missing row raises ``NotFoundError``, a duplicate
agent name or an invalid organisation id ``InvalidRequestError``; every read and write is
scoped by organisation (a row of one is never visible from another).

A write that must commit with its audit row takes a connection-like handle from
``UnitOfWork.transaction()``; the protocols are generic in that handle (``Conn`` for the
real database, the fake's own transaction object in tests).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from uuid import UUID

from cortex_ray._types import Agent, Principal, RunStatus, Session, TaskRun, Turn

if TYPE_CHECKING:
    from cortex_ray.observability.diagnostics import DiagnosticEvent
    from cortex_ray.storage._stores import AuditEntry
    from cortex_ray.storage._turns import SessionMessage, TurnRecord, TurnStatus

__all__ = [
    "AgentStore",
    "ApiKeyStore",
    "AuditLog",
    "ConversationLog",
    "PrincipalStore",
    "RunStore",
    "SessionStore",
    "TraceReader",
    "TurnLog",
    "UnitOfWork",
]

ConnT_co = TypeVar("ConnT_co", covariant=True)
ConnT_contra = TypeVar("ConnT_contra", contravariant=True)


class UnitOfWork(Protocol[ConnT_co]):
    """Transactions: writes made through the handle commit together on success and are
    rolled back on error (``Database``)."""

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[ConnT_co]:
        """A handle inside one transaction; ``durable=False`` for telemetry only."""
        ...


class AuditLog(Protocol[ConnT_contra]):
    """The audit log: rows written inside the caller's transaction, read per organisation."""

    async def insert_audit(self, conn: ConnT_contra, entry: AuditEntry) -> None:
        """Append one row (and the payloads it references) in ``conn``'s transaction."""
        ...

    async def audit_rows(
        self, org_id: str, *, run_id: UUID | None = None, gate_only: bool = False
    ) -> list[dict[str, Any]]:
        """The organisation's rows, oldest first (a run's only with ``run_id``; the
        invocation gate's only, those with a mode, with ``gate_only``)."""
        ...


class PrincipalStore(Protocol):
    """Organisations and the principals that act in them."""

    async def ensure_org(self, org_id: str, name: str = "") -> None:
        """Create the organisation if it is new; ``InvalidRequestError`` for an id that is
        not letters, digits, '_', '.', '-' (at most 63, starting with a letter or digit)."""
        ...

    async def put_principal(self, principal: Principal) -> Principal:
        """Create or replace a principal (its organisation created if new)."""
        ...

    async def get_principal(self, org_id: str, principal_id: str) -> Principal:
        """``NotFoundError`` when the organisation has no such principal."""
        ...


class AgentStore(Protocol):
    """Agents, by id or by name within their organisation."""

    async def create_agent(self, agent: Agent) -> Agent:
        """``InvalidRequestError`` when the organisation already has an agent of that name."""
        ...

    async def get_agent(self, org_id: str, agent_id: UUID | str) -> Agent:
        """By id (a UUID or its text) or else by name; ``NotFoundError`` when absent."""
        ...

    async def list_agents(self, org_id: str) -> list[Agent]:
        """Oldest first, then by name."""
        ...

    async def update_agent(self, agent: Agent) -> Agent:
        """Replace persona, mode, tools, skills, grant and critic (never the name), and
        touch ``updated_at``; ``NotFoundError`` when absent."""
        ...


class WorkCounter(Protocol):
    """What admission counts before it accepts more work (``cortex_ray.runtime``)."""

    async def work_in_progress(self, recent_s: float) -> int:
        """Work that holds the shared models or is about to, in every organisation (a
        number, no row of anyone's): RUNNING runs with a live lease or created in the last
        ``recent_s``; turns not ended with a live lease, accepted in the last ``recent_s``,
        or queued behind a live turn of their session."""
        ...


class RunStore(Protocol):
    """Task runs as the use cases see them (the executor's ledger writes are not here)."""

    async def create_run(self, run: TaskRun, *, audit: AuditEntry | None = None) -> TaskRun:
        """Record a new run, atomically with ``audit``'s row when given."""
        ...

    async def get_run(self, org_id: str, run_id: UUID, *, recordings: bool = False) -> TaskRun:
        """A run with its steps; ``NotFoundError`` when absent."""
        ...

    async def run_status(self, org_id: str, run_id: UUID) -> RunStatus:
        """``NotFoundError`` when absent."""
        ...

    async def list_runs(
        self, org_id: str, agent_id: UUID | None = None, limit: int = 50
    ) -> list[TaskRun]:
        """Newest first, at most ``limit``, one agent's with ``agent_id``."""
        ...

    async def cancel_run(
        self, org_id: str, run_id: UUID, reason: str, *, audit: AuditEntry | None = None
    ) -> bool:
        """CANCELLED with ``reason`` (and ``audit``'s row) when RUNNING or
        AWAITING_APPROVAL: ``True``; ``False`` and nothing written when it had ended;
        ``NotFoundError`` when absent."""
        ...

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> None:
        """FAILED with ``reason`` when RUNNING; anything else (absent too) is left as is."""
        ...


class SessionStore(Protocol):
    """Sessions and their stored messages."""

    async def create_session(self, session: Session) -> Session: ...

    async def get_session(self, org_id: str, session_id: UUID) -> Session:
        """``NotFoundError`` when absent."""
        ...

    async def conversation(
        self, org_id: str, session_id: UUID, limit: int | None = None
    ) -> list[Turn]:
        """The stored messages in order (the newest ``limit`` when given)."""
        ...


class ConversationLog(Protocol):
    """A conversation as a person reads it (``TurnStore``)."""

    async def history(self, org_id: str, session_id: UUID) -> list[SessionMessage]:
        """The ended turns' messages in order, then each pending turn's user message."""
        ...


class TurnLog(ConversationLog, Protocol):
    """A conversation's turns as the session use cases admit and read them (``TurnStore``;
    driving a turn is the executor's, not here)."""

    async def accept(
        self,
        org_id: str,
        session_id: UUID,
        caller_id: str,
        message: str,
        *,
        max_pending: int | None = None,
    ) -> TurnRecord:
        """The session's next turn, ACCEPTED. ``InvalidRequestError`` for an empty message,
        ``NotFoundError`` for no such session, ``AccessDeniedError`` when ``caller_id`` is
        not its caller, ``ConflictError`` once it ended or with ``max_pending`` turns not
        ended."""
        ...

    async def get(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnRecord:
        """``NotFoundError`` when the session has no such turn."""
        ...

    async def status(self, org_id: str, session_id: UUID, turn_id: UUID) -> TurnStatus:
        """Only the turn's status (what a long poll reads); ``NotFoundError`` as ``get``."""
        ...


class TraceReader(Protocol):
    """What a run or a turn left to read back: its locally kept spans and its diagnostic
    timeline (written by the cycle and the tracing exporter, not by a use case)."""

    async def trace_spans(self, org_id: str, run_id: UUID) -> list[dict[str, Any]]:
        """Every span of the traces the organisation's run appears in, in start order (the
        organisation's own and those that name none); empty for a run with none."""
        ...

    async def spans_of_trace(self, org_id: str, trace_id: str) -> list[dict[str, Any]]:
        """The spans of one trace the organisation may read, in start order."""
        ...

    async def diagnostics(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
    ) -> list[DiagnosticEvent]:
        """A run's timeline, or a session's (one turn's with ``turn_id``), in the order
        the events were written."""
        ...


class ApiKeyStore(Protocol):
    """Bearer API keys: handed out once, kept as a hash, revocable."""

    async def create_api_key(self, principal: Principal, name: str = "") -> tuple[str, UUID]:
        """A new key (``crx_<prefix>_<secret>``) and its id; the principal is created if new."""
        ...

    async def principal_for_api_key(self, key: str) -> Principal | None:
        """The key's principal; ``None`` when unknown, malformed or revoked."""
        ...

    async def revoke_api_key(self, org_id: str, key_id: UUID) -> tuple[datetime, bool]:
        """When the key was revoked and whether this call did it; ``NotFoundError`` when the
        organisation has no such key."""
        ...


if TYPE_CHECKING:
    from cortex_ray.storage._database import Conn, Database
    from cortex_ray.storage._stores import Store
    from cortex_ray.storage._turns import TurnStore

    def _store_satisfies_the_protocols(store: Store, db: Database, turns: TurnStore) -> None:
        """Never called: mypy checks that the concrete classes are these protocols."""
        uow: UnitOfWork[Conn] = db
        audit: AuditLog[Conn] = store
        principals: PrincipalStore = store
        agents: AgentStore = store
        runs: RunStore = store
        sessions: SessionStore = store
        keys: ApiKeyStore = store
        traces: TraceReader = store
        conversations: ConversationLog = turns
        turn_log: TurnLog = turns
        del uow, audit, principals, agents, runs, sessions, keys, traces, conversations
        del turn_log
