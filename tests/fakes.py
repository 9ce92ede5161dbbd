"""In-memory fakes of the store protocols (``cortex_ray.storage``): use cases tested
without PostgreSQL.

``FakeDatabase`` is the unit of work: a ``transaction()`` yields a ``FakeTransaction`` whose
writes apply on commit and vanish on an error, as PostgreSQL's would. ``FakeStore``
implements ``PrincipalStore``, ``AgentStore``, ``RunStore``, ``SessionStore``,
``ConversationLog``, ``ApiKeyStore`` and ``AuditLog`` with the real store's rules: every
row scoped by organisation, the same exceptions for the same mistakes (``NotFoundError``,
``InvalidRequestError``, and psycopg's ``ForeignKeyViolation`` where the schema refuses a
row that names a missing agent or session), API keys kept as SHA-256 hashes.
``tests/test_store_contract.py`` runs one set of tests against both, so they cannot drift.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import psycopg

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import (
    Agent,
    Principal,
    RunStatus,
    Session,
    TaskRun,
    Turn,
    utcnow,
)
from cortex_ray.observability import scrub, scrub_text
from cortex_ray.storage import AuditEntry, SessionMessage

__all__ = ["AUDIT_COLUMNS", "FakeDatabase", "FakeStore", "FakeTransaction"]

# The CHECK on ``organisations.id`` (migration 0001).
_ORG_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

AUDIT_COLUMNS = frozenset(
    {
        "org_id", "id", "at", "principal_id", "agent_id", "mode", "tool", "action_type",
        "status", "reason", "args", "duration_ms", "run_id", "step_index", "session_id",
        "idempotency_key", "tier", "decision", "input_sha256", "result_sha256", "source_ids",
        "connector", "grant_ids", "workflow_id", "run_mode", "args_ref", "result_ref",
        "source_versions",
    }
)  # fmt: skip
"""The columns of an ``audit_log`` row as ``audit_rows`` returns it."""


_NOT_INSERTED = (
    "result", "reason", "finished_at", "trace_attempt", "cost", "deadline_at"
)  # fmt: skip
"""The fields of a ``TaskRun`` that ``Store.create_run`` does not write (read back empty)."""


class FakeTransaction:
    """The handle of one fake transaction: writes wait here until it commits."""

    def __init__(self) -> None:
        self._writes: list[Callable[[], None]] = []
        self.open = True

    def on_commit(self, write: Callable[[], None]) -> None:
        if not self.open:
            raise RuntimeError("this transaction has ended")
        self._writes.append(write)

    def _commit(self) -> None:
        self.open = False
        for write in self._writes:
            write()


class FakeDatabase:
    """The unit of work (``UnitOfWork[FakeTransaction]``): commit on success, roll back on
    an error; counts both so a test can say what happened."""

    def __init__(self) -> None:
        self.commits = 0
        self.rollbacks = 0

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[FakeTransaction]:
        tx = FakeTransaction()
        try:
            yield tx
        except BaseException:
            tx.open = False
            self.rollbacks += 1
            raise
        tx._commit()
        self.commits += 1


@dataclass
class _ApiKey:
    org_id: str
    principal_id: str
    key_hash: bytes
    revoked_at: datetime | None = None


def _key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _as_uuid(ref: UUID | str) -> UUID | None:
    if isinstance(ref, UUID):
        return ref
    try:
        return UUID(str(ref))
    except ValueError:
        return None


def _foreign_key(what: str) -> psycopg.errors.ForeignKeyViolation:
    return psycopg.errors.ForeignKeyViolation(f"insert violates a foreign key: no {what}")


class FakeStore:
    """Organisations, principals, agents, runs, sessions, API keys and audit, in memory."""

    def __init__(self, db: FakeDatabase | None = None) -> None:
        self.db = db or FakeDatabase()
        self.orgs: set[str] = set()
        self.principals: dict[tuple[str, str], Principal] = {}
        self.agents: dict[tuple[str, UUID], Agent] = {}
        self.runs: dict[tuple[str, UUID], TaskRun] = {}
        self.sessions: dict[tuple[str, UUID], Session] = {}
        self.messages: dict[tuple[str, UUID], list[Turn]] = {}
        self.api_keys: dict[tuple[str, UUID], _ApiKey] = {}
        self.audit: list[dict[str, Any]] = []
        self.payloads: dict[tuple[str, str], str] = {}
        self._audit_ids = count(1)
        self._order = count()
        self._inserted: dict[tuple[str, UUID], int] = {}

    # organisations and principals ---------------------------------------------------------

    async def ensure_org(self, org_id: str, name: str = "") -> None:
        if not _ORG_ID.fullmatch(org_id):
            raise InvalidRequestError(
                f"invalid organisation id {org_id!r}: use letters, digits, '_', '.', '-'"
            )
        self.orgs.add(org_id)

    async def put_principal(self, principal: Principal) -> Principal:
        await self.ensure_org(principal.org_id)
        self.principals[principal.org_id, principal.id] = principal
        return principal

    async def get_principal(self, org_id: str, principal_id: str) -> Principal:
        try:
            return self.principals[org_id, principal_id]
        except KeyError:
            raise NotFoundError(
                f"principal {principal_id!r} not found in organisation {org_id!r}"
            ) from None

    # agents -------------------------------------------------------------------------------

    async def create_agent(self, agent: Agent) -> Agent:
        await self.ensure_org(agent.org_id)
        taken = any(
            org == agent.org_id and (key == agent.id or a.name == agent.name)
            for (org, key), a in self.agents.items()
        )
        if taken:
            raise InvalidRequestError(
                f"an agent named {agent.name!r} already exists in {agent.org_id!r}"
            )
        self.agents[agent.org_id, agent.id] = agent
        self._inserted[agent.org_id, agent.id] = next(self._order)
        return agent

    async def get_agent(self, org_id: str, agent_id: UUID | str) -> Agent:
        key = _as_uuid(agent_id)
        for (org, id_), agent in self.agents.items():
            if org == org_id and (id_ == key if key is not None else agent.name == agent_id):
                return agent
        raise NotFoundError(f"agent {agent_id!s} not found in organisation {org_id!r}")

    async def list_agents(self, org_id: str) -> list[Agent]:
        return sorted(
            (a for (org, _), a in self.agents.items() if org == org_id),
            key=lambda a: (a.created_at, a.name),
        )

    async def update_agent(self, agent: Agent) -> Agent:
        stored = self.agents.get((agent.org_id, agent.id))
        if stored is None:
            raise NotFoundError(f"agent {agent.id} not found in organisation {agent.org_id!r}")
        changed = stored.model_copy(
            update={
                "persona": agent.persona,
                "mode": agent.mode,
                "tools": agent.tools,
                "skills": agent.skills,
                "grant": agent.grant,
                "critic": agent.critic,
                "updated_at": utcnow(),
            }
        )
        self.agents[agent.org_id, agent.id] = changed
        return changed

    # task runs ----------------------------------------------------------------------------

    async def create_run(self, run: TaskRun, *, audit: AuditEntry | None = None) -> TaskRun:
        if (run.org_id, run.agent_id) not in self.agents:
            raise _foreign_key(f"agent {run.agent_id} in {run.org_id!r}")
        if (run.org_id, run.id) in self.runs:
            raise psycopg.errors.UniqueViolation(f"run {run.id} exists")
        # What ``Store.create_run`` inserts: no steps, cost or outcome yet.
        self.runs[run.org_id, run.id] = run.model_copy(
            update={**dict.fromkeys(_NOT_INSERTED), "steps": ()}
        )
        self._inserted[run.org_id, run.id] = next(self._order)
        if audit is not None:
            self._append_audit(audit)
        return run

    def _run(self, org_id: str, run_id: UUID) -> TaskRun:
        try:
            return self.runs[org_id, run_id]
        except KeyError:
            raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}") from None

    async def get_run(self, org_id: str, run_id: UUID, *, recordings: bool = False) -> TaskRun:
        return self._run(org_id, run_id)

    async def run_status(self, org_id: str, run_id: UUID) -> RunStatus:
        return self._run(org_id, run_id).status

    async def list_runs(
        self, org_id: str, agent_id: UUID | None = None, limit: int = 50
    ) -> list[TaskRun]:
        runs = [
            r
            for (org, _), r in self.runs.items()
            if org == org_id and (agent_id is None or r.agent_id == agent_id)
        ]
        runs.sort(key=lambda r: (r.created_at, self._inserted[org_id, r.id]), reverse=True)
        return [r.model_copy(update={"steps": ()}) for r in runs[:limit]]

    def _finish(self, run: TaskRun, status: RunStatus, reason: str) -> None:
        self.runs[run.org_id, run.id] = run.model_copy(
            update={"status": status, "reason": reason, "result": None, "finished_at": utcnow()}
        )

    async def cancel_run(
        self, org_id: str, run_id: UUID, reason: str, *, audit: AuditEntry | None = None
    ) -> bool:
        run = self._run(org_id, run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
            return False
        self._finish(run, RunStatus.CANCELLED, reason)
        if audit is not None:
            self._append_audit(audit)
        return True

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> None:
        run = self.runs.get((org_id, run_id))
        if run is not None and run.status is RunStatus.RUNNING:
            self._finish(run, RunStatus.FAILED, reason)

    # sessions -----------------------------------------------------------------------------

    async def create_session(self, session: Session) -> Session:
        if (session.org_id, session.agent_id) not in self.agents:
            raise _foreign_key(f"agent {session.agent_id} in {session.org_id!r}")
        if (session.org_id, session.id) in self.sessions:
            raise psycopg.errors.UniqueViolation(f"session {session.id} exists")
        self.sessions[session.org_id, session.id] = session.model_copy(update={"ended_at": None})
        return session

    async def get_session(self, org_id: str, session_id: UUID) -> Session:
        try:
            return self.sessions[org_id, session_id]
        except KeyError:
            raise NotFoundError(
                f"session {session_id} not found in organisation {org_id!r}"
            ) from None

    async def conversation(
        self, org_id: str, session_id: UUID, limit: int | None = None
    ) -> list[Turn]:
        turns = self.messages.get((org_id, session_id), [])
        return list(turns if limit is None else turns[max(len(turns) - limit, 0) :])

    async def history(self, org_id: str, session_id: UUID) -> list[SessionMessage]:
        """As ``TurnStore.history`` for a session whose messages were appended outside
        any turn (the fake accepts no turns): each message, with no turn."""
        return [
            SessionMessage(role=t.role, content=t.content, tool=t.tool)
            for t in self.messages.get((org_id, session_id), [])
        ]

    async def append_messages(
        self, conn: FakeTransaction, org_id: str, session_id: UUID, turns: Sequence[Turn]
    ) -> None:
        """As ``Store.append_messages``: in ``conn``'s transaction, to an existing session."""
        if (org_id, session_id) not in self.sessions:
            raise _foreign_key(f"session {session_id} in {org_id!r}")
        added = list(turns)
        conn.on_commit(lambda: self.messages.setdefault((org_id, session_id), []).extend(added))

    # API keys -----------------------------------------------------------------------------

    async def create_api_key(self, principal: Principal, name: str = "") -> tuple[str, UUID]:
        if (principal.org_id, principal.id) not in self.principals:
            await self.put_principal(principal)
        key_id = uuid4()
        key = f"crx_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
        self.api_keys[principal.org_id, key_id] = _ApiKey(
            principal.org_id, principal.id, _key_hash(key)
        )
        return key, key_id

    async def principal_for_api_key(self, key: str) -> Principal | None:
        if not key.startswith("crx_") or len(key) > 200:
            return None
        digest = _key_hash(key)
        for stored in self.api_keys.values():
            if stored.key_hash == digest and stored.revoked_at is None:
                return self.principals[stored.org_id, stored.principal_id]
        return None

    async def revoke_api_key(self, org_id: str, key_id: UUID) -> tuple[datetime, bool]:
        stored = self.api_keys.get((org_id, key_id))
        if stored is None:
            raise NotFoundError(f"no API key {key_id} in organisation {org_id!r}")
        if stored.revoked_at is not None:
            return stored.revoked_at, False
        stored.revoked_at = utcnow()
        return stored.revoked_at, True

    # audit --------------------------------------------------------------------------------

    async def insert_audit(self, conn: FakeTransaction, entry: AuditEntry) -> None:
        conn.on_commit(lambda: self._append_audit(entry))

    def _append_audit(self, entry: AuditEntry) -> None:
        for sha, body in entry.payloads:
            self.payloads.setdefault((entry.org_id, sha), body)
        args = (
            json.loads(entry.args_json)
            if entry.args_json is not None
            else json.loads(json.dumps(scrub(entry.args), default=str))
        )
        self.audit.append(
            {
                "org_id": entry.org_id,
                "id": next(self._audit_ids),
                "at": utcnow(),
                "principal_id": entry.principal_id,
                "agent_id": entry.agent_id,
                "mode": None if entry.mode is None else entry.mode.value,
                "tool": entry.tool,
                "action_type": entry.action_type.value,
                "status": entry.status,
                "reason": scrub_text(entry.reason) if entry.reason else entry.reason,
                "args": args,
                "duration_ms": entry.duration_ms,
                "run_id": entry.run_id,
                "step_index": entry.step_index,
                "session_id": entry.session_id,
                "idempotency_key": entry.idempotency_key,
                "tier": None if entry.tier is None else entry.tier.value,
                "decision": entry.decision,
                "input_sha256": entry.input_sha256,
                "result_sha256": entry.result_sha256,
                "source_ids": list(entry.source_ids) if entry.source_ids else None,
                "connector": entry.connector,
                "grant_ids": list(entry.grant_ids) if entry.grant_ids else None,
                "workflow_id": entry.workflow_id,
                "run_mode": entry.run_mode,
                "args_ref": entry.args_ref,
                "result_ref": entry.result_ref,
                "source_versions": list(entry.source_versions) if entry.source_versions else None,
            }
        )

    async def audit_rows(
        self, org_id: str, *, run_id: UUID | None = None, gate_only: bool = False
    ) -> list[dict[str, Any]]:
        return [
            dict(row)
            for row in self.audit
            if row["org_id"] == org_id
            and (run_id is None or row["run_id"] == run_id)
            and (not gate_only or row["mode"] is not None)
        ]


if TYPE_CHECKING:
    from cortex_ray.storage import (
        AgentStore,
        ApiKeyStore,
        AuditLog,
        ConversationLog,
        PrincipalStore,
        RunStore,
        SessionStore,
        UnitOfWork,
    )

    def _fakes_satisfy_the_protocols(store: FakeStore, db: FakeDatabase) -> None:
        """Never called: mypy checks that the fakes are the protocols the real store is."""
        uow: UnitOfWork[FakeTransaction] = db
        audit: AuditLog[FakeTransaction] = store
        principals: PrincipalStore = store
        agents: AgentStore = store
        runs: RunStore = store
        sessions: SessionStore = store
        keys: ApiKeyStore = store
        conversations: ConversationLog = store
        del uow, audit, principals, agents, runs, sessions, keys, conversations
