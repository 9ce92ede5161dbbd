"""Rows in and out of PostgreSQL for everything but memory (see ``cortex_ray.memory``).

Every statement is scoped by organisation; functions that take a connection run inside the
caller's transaction, so one cycle step can write its ledger row, audit row and memory rows
atomically.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4

import psycopg
from psycopg.types.json import Json, Jsonb

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._types import (
    ActionType,
    Agent,
    AgentAction,
    AgentMode,
    Candidate,
    CapabilityTier,
    DecisionKind,
    Grant,
    Observation,
    Principal,
    PrincipalKind,
    RunCost,
    RunMode,
    RunStatus,
    Session,
    SessionStatus,
    Step,
    StepRecording,
    TaskRun,
    Turn,
    utcnow,
)
from cortex_ray.observability import scrub, scrub_text
from cortex_ray.observability.diagnostics import DiagnosticEvent
from cortex_ray.storage._database import Conn, Database

__all__ = ["AuditEntry", "Store"]


def _grant_json(grant: Grant | None) -> Jsonb | None:
    return None if grant is None else Jsonb(grant.model_dump(mode="json"))


def _grant(value: Any) -> Grant | None:
    return None if value is None else Grant.model_validate(value)


def _principal(row: dict[str, Any]) -> Principal:
    return Principal(
        id=row["id"],
        org_id=row["org_id"],
        kind=PrincipalKind(row["kind"]),
        name=row["name"],
        is_admin=row["is_admin"],
        grant=_grant(row["grant_policy"]),
    )


def _key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _agent(row: dict[str, Any]) -> Agent:
    return Agent(
        id=row["id"],
        org_id=row["org_id"],
        name=row["name"],
        persona=row["persona"],
        mode=AgentMode(row["mode"]),
        tools=tuple(row["tools"]),
        skills=tuple(row["skills"]),
        grant=_grant(row["grant_policy"]),
        critic=row["critic"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


# A step log's columns: not its recording (a few kB a step, read only for replay).
_STEP_COLUMNS = (
    "run_id, step_index, decision, candidates, selected, action, action_type, observation, "
    "message, note, created_at"
)


def _step(row: dict[str, Any]) -> Step:
    return Step(
        run_id=row["run_id"],
        step_index=row["step_index"],
        decision=DecisionKind(row["decision"]),
        candidates=tuple(Candidate.model_validate(c) for c in row["candidates"]),
        selected=row["selected"],
        action=None if row["action"] is None else AgentAction.model_validate(row["action"]),
        action_type=None if row["action_type"] is None else ActionType(row["action_type"]),
        observation=(
            None if row["observation"] is None else Observation.model_validate(row["observation"])
        ),
        message=row["message"],
        note=row["note"],
        created_at=row["created_at"],
        recording=None
        if row.get("recording") is None
        else StepRecording.model_validate(row["recording"]),
    )


def _run(row: dict[str, Any], steps: Sequence[Step] = ()) -> TaskRun:
    return TaskRun(
        id=row["id"],
        org_id=row["org_id"],
        agent_id=row["agent_id"],
        name=row["name"],
        goal=row["goal"],
        status=RunStatus(row["status"]),
        max_steps=row["max_steps"],
        caller_id=row["caller_id"],
        requested_by=row["requested_by"],
        contact_context=row["contact_context"],
        result=row["result"],
        reason=row["reason"],
        steps=tuple(steps),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        trace_parent=row.get("trace_parent"),
        trace_attempt=row.get("trace_attempt"),
        cost=None if row.get("cost") is None else RunCost.model_validate(row["cost"]),
        run_mode=RunMode(row.get("run_mode") or RunMode.EXECUTE),
        workflow_version_id=row.get("workflow_version_id"),
        workflow_inputs=row.get("workflow_inputs"),
        deadline_at=row.get("deadline_at"),
    )


_INSERT_RUN = """
INSERT INTO task_runs (org_id, id, agent_id, name, goal, status, max_steps, caller_id,
                       requested_by, contact_context, created_at, trace_parent, run_mode,
                       workflow_version_id, workflow_inputs)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

# ``args`` goes as JSON text (see ``_audit_params``).
_INSERT_AUDIT = """
INSERT INTO audit_log (org_id, principal_id, agent_id, mode, tool, action_type, status,
                       reason, args, duration_ms, run_id, step_index, session_id,
                       idempotency_key, tier, decision, input_sha256, result_sha256,
                       source_ids, connector, grant_ids, workflow_id, run_mode, args_ref,
                       result_ref, source_versions)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s,
        %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

# A run and the audit row of its submission in one statement (the run's parameters first).
_INSERT_RUN_AUDITED = f"WITH run AS ({_INSERT_RUN}) {_INSERT_AUDIT}"


def _audit_params(entry: AuditEntry) -> tuple[Any, ...]:
    return (
        entry.org_id,
        entry.principal_id,
        entry.agent_id,
        None if entry.mode is None else entry.mode.value,
        entry.tool,
        entry.action_type.value,
        entry.status,
        scrub_text(entry.reason) if entry.reason else entry.reason,
        # Scrubbed (the one scrubber spans and diagnostics use: a credential in a tool's
        # arguments never reaches the audit log), then encoded once, as text
        # (``default=str``: any value an argument may hold); decoding it again only for
        # Jsonb to encode it a second time cost a second pass.
        entry.args_json
        if entry.args_json is not None
        else json.dumps(scrub(entry.args), default=str),
        entry.duration_ms,
        entry.run_id,
        entry.step_index,
        entry.session_id,
        entry.idempotency_key,
        None if entry.tier is None else entry.tier.value,
        entry.decision,
        entry.input_sha256,
        entry.result_sha256,
        list(entry.source_ids) if entry.source_ids else None,
        entry.connector,
        list(entry.grant_ids) if entry.grant_ids else None,
        entry.workflow_id,
        entry.run_mode,
        entry.args_ref,
        entry.result_ref,
        list(entry.source_versions) if entry.source_versions else None,
    )


_INSERT_PAYLOAD = """
INSERT INTO payloads (org_id, sha256, body, bytes) VALUES (%s, %s, %s, %s)
ON CONFLICT (org_id, sha256) DO NOTHING
"""


class AuditEntry:
    """One dispatch through the invocation gate, as the audit log records it."""

    __slots__ = (
        "action_type",
        "agent_id",
        "args",
        "args_json",
        "args_ref",
        "connector",
        "decision",
        "duration_ms",
        "grant_ids",
        "idempotency_key",
        "input_sha256",
        "mode",
        "org_id",
        "payloads",
        "principal_id",
        "reason",
        "result_ref",
        "result_sha256",
        "run_id",
        "run_mode",
        "session_id",
        "source_ids",
        "source_versions",
        "status",
        "step_index",
        "tier",
        "tool",
        "workflow_id",
    )

    def __init__(
        self,
        *,
        org_id: str,
        principal_id: str,
        tool: str,
        action_type: ActionType,
        status: str,
        reason: str | None,
        args: dict[str, Any],
        duration_ms: float,
        agent_id: UUID | None = None,
        mode: AgentMode | None = None,
        run_id: UUID | None = None,
        step_index: int | None = None,
        session_id: UUID | None = None,
        idempotency_key: str | None = None,
        tier: CapabilityTier | None = None,
        decision: str | None = None,
        input_sha256: str | None = None,
        result_sha256: str | None = None,
        source_ids: tuple[str, ...] = (),
        connector: str | None = None,
        grant_ids: tuple[UUID, ...] = (),
        workflow_id: UUID | None = None,
        run_mode: str | None = None,
        args_ref: str | None = None,
        result_ref: str | None = None,
        source_versions: tuple[str, ...] = (),
        payloads: tuple[tuple[str, str], ...] = (),
        args_json: str | None = None,
    ) -> None:
        self.org_id = org_id
        self.principal_id = principal_id
        self.tool = tool
        self.action_type = action_type
        self.status = status
        self.reason = reason
        self.args = args
        self.duration_ms = duration_ms
        self.agent_id = agent_id
        self.mode = mode
        self.run_id = run_id
        self.step_index = step_index
        self.session_id = session_id
        self.idempotency_key = idempotency_key
        self.tier = tier
        self.decision = decision
        self.input_sha256 = input_sha256
        self.result_sha256 = result_sha256
        self.source_ids = source_ids
        self.connector = connector
        self.grant_ids = grant_ids
        self.workflow_id = workflow_id
        self.run_mode = run_mode
        self.args_ref = args_ref
        self.result_ref = result_ref
        self.source_versions = source_versions
        self.payloads = payloads
        self.args_json = args_json
        """``args`` already scrubbed and encoded as JSON text, when the gate did it."""
        """(sha256, text) of the large arguments or result this row references by hash
        (``args_ref``, ``result_ref``): stored once per organisation with the row."""


_COST_FIELDS = tuple(
    (name, "numeric" if info.annotation is float else "bigint")
    for name, info in RunCost.model_fields.items()
    if name != "loops"
)
"""The additive fields of ``RunCost`` and their SQL types (``add_run_cost``)."""


class Store:
    """Typed reads and writes of organisations, principals, agents, runs, sessions and audit."""

    def __init__(self, db: Database) -> None:
        self._diagnostics_pruned: datetime | None = None
        self.db = db

    # organisations and principals ---------------------------------------------------------

    async def ensure_org(self, org_id: str, name: str = "") -> None:
        try:
            async with self.db.transaction() as conn:
                await conn.execute(
                    "INSERT INTO organisations (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    (org_id, name),
                )
        except psycopg.errors.CheckViolation as exc:
            raise InvalidRequestError(
                f"invalid organisation id {org_id!r}: use letters, digits, '_', '.', '-'"
            ) from exc

    async def put_principal(self, principal: Principal) -> Principal:
        await self.ensure_org(principal.org_id)
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO principals (org_id, id, kind, name, is_admin, grant_policy)
                VALUES (%s, %s, %s, %s, %s, %s)
                ON CONFLICT (org_id, id) DO UPDATE SET kind = EXCLUDED.kind,
                    name = EXCLUDED.name, is_admin = EXCLUDED.is_admin,
                    grant_policy = EXCLUDED.grant_policy
                """,
                (
                    principal.org_id,
                    principal.id,
                    principal.kind.value,
                    principal.name,
                    principal.is_admin,
                    _grant_json(principal.grant),
                ),
            )
        return principal

    async def get_principal(self, org_id: str, principal_id: str) -> Principal:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM principals WHERE org_id = %s AND id = %s", (org_id, principal_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"principal {principal_id!r} not found in organisation {org_id!r}")
        return _principal(row)

    # agents -------------------------------------------------------------------------------

    async def create_agent(self, agent: Agent) -> Agent:
        await self.ensure_org(agent.org_id)
        try:
            async with self.db.transaction() as conn:
                cur = await conn.execute(
                    """
                    INSERT INTO agents (org_id, id, name, persona, mode, tools, skills,
                                        grant_policy, critic, created_at, updated_at)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *
                    """,
                    (
                        agent.org_id,
                        agent.id,
                        agent.name,
                        agent.persona,
                        agent.mode.value,
                        list(agent.tools),
                        list(agent.skills),
                        _grant_json(agent.grant),
                        agent.critic,
                        agent.created_at,
                        agent.updated_at,
                    ),
                )
                row = await cur.fetchone()
        except psycopg.errors.UniqueViolation as exc:
            raise InvalidRequestError(
                f"an agent named {agent.name!r} already exists in {agent.org_id!r}"
            ) from exc
        assert row is not None
        return _agent(row)

    async def get_agent(self, org_id: str, agent_id: UUID | str) -> Agent:
        # One statement: outside a transaction it is one round trip, not three.
        async with self.db.connection() as conn:
            return await self.get_agent_in(conn, org_id, agent_id)

    async def get_agent_in(self, conn: Conn, org_id: str, agent_id: UUID | str) -> Agent:
        try:
            key = agent_id if isinstance(agent_id, UUID) else UUID(str(agent_id))
        except ValueError:
            key = None
        if key is not None:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s AND id = %s", (org_id, key)
            )
        else:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s AND name = %s", (org_id, str(agent_id))
            )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"agent {agent_id!s} not found in organisation {org_id!r}")
        return _agent(row)

    async def list_agents(self, org_id: str) -> list[Agent]:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM agents WHERE org_id = %s ORDER BY created_at, name", (org_id,)
            )
            return [_agent(r) for r in await cur.fetchall()]

    async def update_agent(self, agent: Agent) -> Agent:
        async with self.db.transaction() as conn:
            return await self.update_agent_in(conn, agent)

    async def update_agent_in(self, conn: Conn, agent: Agent) -> Agent:
        cur = await conn.execute(
            """
            UPDATE agents SET persona = %s, mode = %s, tools = %s, skills = %s,
                   grant_policy = %s, critic = %s, updated_at = now()
            WHERE org_id = %s AND id = %s RETURNING *
            """,
            (
                agent.persona,
                agent.mode.value,
                list(agent.tools),
                list(agent.skills),
                _grant_json(agent.grant),
                agent.critic,
                agent.org_id,
                agent.id,
            ),
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"agent {agent.id} not found in organisation {agent.org_id!r}")
        return _agent(row)

    # task runs and their ledger -----------------------------------------------------------

    async def create_run(self, run: TaskRun, *, audit: AuditEntry | None = None) -> TaskRun:
        """Record a new run, and with ``audit`` the row that audits its submission.

        One statement (the audit row's INSERT takes the run's as a data-modifying CTE), so
        one transaction and one round trip: a run never exists without its row, and no
        BEGIN or COMMIT waits on the server on its own."""
        params = (
            run.org_id,
            run.id,
            run.agent_id,
            run.name,
            run.goal,
            run.status.value,
            run.max_steps,
            run.caller_id,
            run.requested_by,
            None if run.contact_context is None else Jsonb(run.contact_context),
            run.created_at,
            run.trace_parent,
            run.run_mode.value,
            run.workflow_version_id,
            None if run.workflow_inputs is None else Jsonb(run.workflow_inputs),
        )
        async with self.db.connection() as conn:
            if audit is None:
                await conn.execute(_INSERT_RUN, params)
            else:
                await conn.execute(_INSERT_RUN_AUDITED, params + _audit_params(audit))
        return run

    async def get_run(self, org_id: str, run_id: UUID, *, recordings: bool = False) -> TaskRun:
        """A run with its step log; with ``recordings``, each step with its recording too
        (``None`` for a step made with ``record_decisions`` off, or before migration 0008):
        what replay reads, a few kB a step that the step log leaves out."""
        columns = f"{_STEP_COLUMNS}, recording" if recordings else _STEP_COLUMNS
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM task_runs WHERE org_id = %s AND id = %s", (org_id, run_id)
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}")
            cur = await conn.execute(
                f"SELECT {columns} FROM run_steps WHERE org_id = %s AND run_id = %s "
                "ORDER BY step_index",
                (org_id, run_id),
            )
            steps = [_step(r) for r in await cur.fetchall()]
        return _run(row, steps)

    async def run_status(self, org_id: str, run_id: UUID) -> RunStatus:
        """A run's status alone: one indexed row, no ledger (for polling)."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT status FROM task_runs WHERE org_id = %s AND id = %s", (org_id, run_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}")
        return RunStatus(row["status"])

    async def fail_run(self, org_id: str, run_id: UUID, reason: str) -> None:
        """Move a RUNNING run to FAILED with ``reason``; a terminal run stays as it is."""
        async with self.db.transaction() as conn:
            await self.finish_run(conn, org_id, run_id, RunStatus.FAILED, reason=reason)

    async def cancel_run(
        self, org_id: str, run_id: UUID, reason: str, *, audit: AuditEntry | None = None
    ) -> bool:
        """Stop a RUNNING run, or one AWAITING_APPROVAL (its pending request becomes
        CANCELLED, never to be decided): CANCELLED with ``reason``, its step intents removed,
        and with ``audit`` the row that audits it, in one transaction. ``False`` (and
        nothing written) when the run has ended; its driver stops at its next step commit,
        whose fenced write finds the run no longer RUNNING."""
        async with self.db.transaction() as conn:
            # The run's pending request is locked before the run, in the order a decision
            # and the expiry sweep lock them: a cancel racing a decision waits, never
            # deadlocks.
            await conn.execute(
                "SELECT 1 FROM approvals WHERE org_id = %s AND run_id = %s "
                "AND status = 'PENDING' FOR UPDATE",
                (org_id, run_id),
            )
            cur = await conn.execute(
                "SELECT status FROM task_runs WHERE org_id = %s AND id = %s FOR UPDATE",
                (org_id, run_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"task run {run_id} not found in organisation {org_id!r}")
            if row["status"] == RunStatus.AWAITING_APPROVAL.value:
                await conn.execute(
                    """
                    UPDATE approvals SET status = 'CANCELLED', decided_at = now(), note = %s
                    WHERE org_id = %s AND run_id = %s AND status = 'PENDING'
                    """,
                    (reason, org_id, run_id),
                )
                # finish_run moves only a RUNNING run: the row is locked, so nobody else
                # moves it between these two statements.
                await conn.execute(
                    "UPDATE task_runs SET status = 'RUNNING' WHERE org_id = %s AND id = %s",
                    (org_id, run_id),
                )
            elif row["status"] != RunStatus.RUNNING.value:
                return False
            await self.finish_run(conn, org_id, run_id, RunStatus.CANCELLED, reason=reason)
            await conn.execute(
                "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s", (org_id, run_id)
            )
            if audit is not None:
                await self.insert_audit(conn, audit)
        return True

    async def running_runs(self, org_id: str | None = None, limit: int = 1000) -> list[TaskRun]:
        """RUNNING runs, oldest first, in one organisation or all (a supervisor's start-up
        scan: each may need resuming). Without their ledgers."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM task_runs
                WHERE status = 'RUNNING' AND (%s::text IS NULL OR org_id = %s)
                ORDER BY created_at LIMIT %s
                """,
                (org_id, org_id, limit),
            )
            return [_run(r) for r in await cur.fetchall()]

    async def list_runs(
        self, org_id: str, agent_id: UUID | None = None, limit: int = 50
    ) -> list[TaskRun]:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM task_runs WHERE org_id = %s AND (%s::uuid IS NULL OR agent_id = %s)
                ORDER BY created_at DESC LIMIT %s
                """,
                (org_id, agent_id, agent_id, limit),
            )
            return [_run(r) for r in await cur.fetchall()]

    @staticmethod
    async def insert_step(conn: Conn, org_id: str, step: Step) -> None:
        """Write one ledger row; (org, run, step index) is the primary key, so never twice."""
        await conn.execute(
            """
            INSERT INTO run_steps (org_id, run_id, step_index, decision, candidates, selected,
                                   action, action_type, observation, message, note, created_at,
                                   recording)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                org_id,
                step.run_id,
                step.step_index,
                step.decision.value,
                Json([c.model_dump(mode="json") for c in step.candidates]),
                step.selected,
                None if step.action is None else Json(step.action.model_dump(mode="json")),
                None if step.action_type is None else step.action_type.value,
                None
                if step.observation is None
                else Json(step.observation.model_dump(mode="json")),
                step.message,
                step.note,
                step.created_at,
                # json, not jsonb: a recording keeps its keys' order (a tool's parameters
                # are shown in it), so that a replay rebuilds the same prompt.
                None if step.recording is None else Json(step.recording.model_dump(mode="json")),
            ),
        )

    @staticmethod
    async def finish_run(
        conn: Conn,
        org_id: str,
        run_id: UUID,
        status: RunStatus,
        *,
        result: str | None = None,
        reason: str | None = None,
    ) -> datetime:
        """Move a RUNNING run to its terminal state; returns the time it finished.

        The lease goes with it, and so do the run's step intents: nobody resumes an ended
        run (no statement reads a result back, so both pipeline with the caller's)."""
        finished_at = utcnow()
        await conn.execute(
            """
            UPDATE task_runs SET status = %s, result = %s, reason = %s, finished_at = %s,
                lease_owner = NULL, lease_expires_at = NULL
            WHERE org_id = %s AND id = %s AND status = 'RUNNING'
            """,
            (status.value, result, reason, finished_at, org_id, run_id),
        )
        await conn.execute(
            "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s", (org_id, run_id)
        )
        return finished_at

    # sessions -----------------------------------------------------------------------------

    async def create_session(self, session: Session) -> Session:
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO sessions (org_id, id, agent_id, caller_id, status, created_at)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                (
                    session.org_id,
                    session.id,
                    session.agent_id,
                    session.caller_id,
                    session.status.value,
                    session.created_at,
                ),
            )
        return session

    async def get_session(self, org_id: str, session_id: UUID) -> Session:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "SELECT * FROM sessions WHERE org_id = %s AND id = %s", (org_id, session_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"session {session_id} not found in organisation {org_id!r}")
        return Session(
            id=row["id"],
            org_id=row["org_id"],
            agent_id=row["agent_id"],
            caller_id=row["caller_id"],
            status=SessionStatus(row["status"]),
            created_at=row["created_at"],
            ended_at=row["ended_at"],
        )

    async def agent_name_of(self, org_id: str, kind: Literal["run", "session"], id: UUID) -> str:
        """The name of the agent a task run or a session belongs to, in one statement (what
        a session actor shows Ray's dashboard)."""
        table = "task_runs" if kind == "run" else "sessions"
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"SELECT a.name FROM {table} x JOIN agents a "
                "ON a.org_id = x.org_id AND a.id = x.agent_id WHERE x.org_id = %s AND x.id = %s",
                (org_id, id),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"{kind} {id} not found in organisation {org_id!r}")
        name: str = row["name"]
        return name

    @staticmethod
    async def end_session(conn: Conn, org_id: str, session_id: UUID, at: datetime) -> None:
        await conn.execute(
            "UPDATE sessions SET status = 'ENDED', ended_at = %s WHERE org_id = %s AND id = %s",
            (at, org_id, session_id),
        )

    async def conversation(
        self, org_id: str, session_id: UUID, limit: int | None = None
    ) -> list[Turn]:
        """The session's messages in order (the newest ``limit`` when given)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT role, content, tool FROM (
                    SELECT * FROM session_messages WHERE org_id = %s AND session_id = %s
                    ORDER BY seq DESC LIMIT %s) AS recent
                ORDER BY seq
                """,
                (org_id, session_id, limit),
            )
            return [
                Turn(role=r["role"], content=r["content"], tool=r["tool"])
                for r in await cur.fetchall()
            ]

    @staticmethod
    async def append_messages(
        conn: Conn, org_id: str, session_id: UUID, turns: Sequence[Turn]
    ) -> None:
        # Serialise writers of one session so that sequence numbers stay contiguous.
        await conn.execute(
            "SELECT 1 FROM sessions WHERE org_id = %s AND id = %s FOR UPDATE", (org_id, session_id)
        )
        cur = await conn.execute(
            "SELECT coalesce(max(seq), -1) AS last FROM session_messages "
            "WHERE org_id = %s AND session_id = %s",
            (org_id, session_id),
        )
        row = await cur.fetchone()
        seq = (row["last"] if row else -1) + 1
        async with conn.cursor() as c:
            await c.executemany(
                """
                INSERT INTO session_messages (org_id, session_id, seq, role, content, tool)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                [
                    (org_id, session_id, seq + i, t.role, t.content, t.tool)
                    for i, t in enumerate(turns)
                ],
            )

    # API keys -----------------------------------------------------------------------------

    async def create_api_key(self, principal: Principal, name: str = "") -> tuple[str, UUID]:
        """A new bearer key for ``principal``: the key is returned once, only its hash is kept.

        Keys carry 256 random bits, so a plain SHA-256 (not a slow password hash) is the
        right digest: nothing to brute-force, and lookups stay one index probe.
        """
        if not await self._has_principal(principal):
            await self.put_principal(principal)
        key_id = uuid4()
        prefix = secrets.token_hex(4)
        key = f"crx_{prefix}_{secrets.token_urlsafe(32)}"
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO api_keys (org_id, id, principal_id, key_hash, prefix, name)
                VALUES (%s, %s, %s, %s, %s, %s)
                """,
                (principal.org_id, key_id, principal.id, _key_hash(key), prefix, name),
            )
        return key, key_id

    async def _has_principal(self, principal: Principal) -> bool:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM principals WHERE org_id = %s AND id = %s",
                (principal.org_id, principal.id),
            )
            return await cur.fetchone() is not None

    async def principal_for_api_key(self, key: str) -> Principal | None:
        """The principal a bearer key belongs to, or None (unknown, malformed or revoked)."""
        if not key.startswith("crx_") or len(key) > 200:
            return None
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT p.* FROM api_keys k
                JOIN principals p ON p.org_id = k.org_id AND p.id = k.principal_id
                WHERE k.key_hash = %s AND k.revoked_at IS NULL
                """,
                (_key_hash(key),),
            )
            row = await cur.fetchone()
        return None if row is None else _principal(row)

    async def revoke_api_key(self, org_id: str, key_id: UUID) -> tuple[datetime, bool]:
        """Revoke a key: when it was revoked, and whether this call did it (``False``: it
        already was, and nothing changed)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                "UPDATE api_keys SET revoked_at = now() "
                "WHERE org_id = %s AND id = %s AND revoked_at IS NULL RETURNING revoked_at",
                (org_id, key_id),
            )
            row = await cur.fetchone()
            if row is not None:
                return row["revoked_at"], True
            cur = await conn.execute(
                "SELECT revoked_at FROM api_keys WHERE org_id = %s AND id = %s",
                (org_id, key_id),
            )
            row = await cur.fetchone()
        if row is None or row["revoked_at"] is None:
            raise NotFoundError(f"no API key {key_id} in organisation {org_id!r}")
        return row["revoked_at"], False

    # step intents (crash-resume) ----------------------------------------------------------

    async def insert_intent(
        self,
        org_id: str,
        run_id: UUID,
        step_index: int,
        action: AgentAction,
        *,
        conn: Conn | None = None,
    ) -> None:
        """Record that a side-effecting step is about to act: in its own transaction, or
        in ``conn``'s (the driver's fenced one, so a driver that lost its lease leaves no
        intent behind)."""
        if conn is None:
            async with self.db.transaction() as own:
                await self.insert_intent(org_id, run_id, step_index, action, conn=own)
            return
        await conn.execute(
            """
            INSERT INTO step_intents (org_id, run_id, step_index, action)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (org_id, run_id, step_index) DO UPDATE SET action = EXCLUDED.action,
                started_at = now()
            """,
            (org_id, run_id, step_index, Jsonb(action.model_dump(mode="json"))),
        )

    @staticmethod
    async def take_intent(
        conn: Conn, org_id: str, run_id: UUID, step_index: int
    ) -> AgentAction | None:
        """Remove and return an intent left behind by an interrupted step, if any (inside
        the caller's transaction, so the removal commits with what records it)."""
        cur = await conn.execute(
            "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s AND step_index = %s "
            "RETURNING action",
            (org_id, run_id, step_index),
        )
        row = await cur.fetchone()
        return None if row is None else AgentAction.model_validate(row["action"])

    @staticmethod
    async def clear_intent(conn: Conn, org_id: str, run_id: UUID, step_index: int) -> None:
        await conn.execute(
            "DELETE FROM step_intents WHERE org_id = %s AND run_id = %s AND step_index = %s",
            (org_id, run_id, step_index),
        )

    # audit --------------------------------------------------------------------------------

    @staticmethod
    async def insert_audit(conn: Conn, entry: AuditEntry) -> None:
        """One audit row, and the payloads it references (each kept once per organisation:
        a payload already stored is not written again)."""
        for sha, body in entry.payloads:
            await conn.execute(_INSERT_PAYLOAD, (entry.org_id, sha, body, len(body.encode())))
        await conn.execute(_INSERT_AUDIT, _audit_params(entry))

    async def payload_of_a_run(self, org_id: str, sha256: str) -> bool:
        """Whether a call of some run, or an approval request (members read requests
        whole), references this payload (a member may read it, as the run's report); a
        direct call's or a session's alone is the admins'."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT EXISTS (SELECT 1 FROM audit_log WHERE org_id = %s AND args_ref = %s
                                 AND run_id IS NOT NULL)
                    OR EXISTS (SELECT 1 FROM audit_log WHERE org_id = %s AND result_ref = %s
                                 AND run_id IS NOT NULL)
                    OR EXISTS (SELECT 1 FROM approvals WHERE org_id = %s
                                 AND %s IN (args_ref, decision_ref, evidence_ref)) AS found
                """,
                (org_id, sha256, org_id, sha256, org_id, sha256),
            )
            row = await cur.fetchone()
        return bool(row and row["found"])

    async def payloads(self, org_id: str, shas: Sequence[str]) -> dict[str, str]:
        """Stored payloads by sha256 (JSON text), those of this organisation only."""
        if not shas:
            return {}
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT sha256, body FROM payloads WHERE org_id = %s AND sha256 = ANY(%s)",
                (org_id, list(shas)),
            )
            return {r["sha256"]: r["body"] for r in await cur.fetchall()}

    async def audit_rows(
        self, org_id: str, *, run_id: UUID | None = None, gate_only: bool = False
    ) -> list[dict[str, Any]]:
        """The organisation's audit rows, oldest first: only a run's with ``run_id``; only
        the invocation gate's (tool calls, which always carry the mode) with ``gate_only``,
        leaving out the use-case rows (``agents.create``, ``tasks.submit``, ...)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM audit_log
                WHERE org_id = %s AND (%s::uuid IS NULL OR run_id = %s)
                  AND (NOT %s OR mode IS NOT NULL)
                ORDER BY id
                """,
                (org_id, run_id, run_id, gate_only),
            )
            return list(await cur.fetchall())

    async def add_run_cost(self, org_id: str, run_id: UUID, cost: RunCost) -> RunCost:
        """Add one attempt's cost to the run's (``task_runs.cost``) in one statement; returns
        the sum. The attempt's loops replace the run's (an attempt replays the run's steps,
        so its loops hold the earlier ones)."""
        added = cost.model_dump(mode="json")
        sums = ", ".join(
            f"'{name}', coalesce((cost->>'{name}')::{kind}, 0)"
            f" + (%(new)s::jsonb->>'{name}')::{kind}"
            for name, kind in _COST_FIELDS
        )
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"""
                UPDATE task_runs SET cost = jsonb_build_object({sums},
                    'loops', CASE WHEN jsonb_array_length(%(new)s::jsonb->'loops') > 0
                                  THEN %(new)s::jsonb->'loops'
                                  ELSE coalesce(cost->'loops', '[]'::jsonb) END)
                WHERE org_id = %(org)s AND id = %(run)s
                RETURNING cost
                """,
                {"new": Jsonb(added), "org": org_id, "run": run_id},
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no run {run_id}")
        return RunCost.model_validate(row["cost"])

    async def append_diagnostics(
        self,
        org_id: str,
        events: Sequence[DiagnosticEvent],
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
        retention_days: float | None = None,
    ) -> None:
        """Append timeline events (already scrubbed and bounded; committed as telemetry, see
        ``Database.transaction``); with ``retention_days``, delete rows older than that
        about once an hour."""
        rows = [
            (org_id, run_id, session_id, turn_id, e.seq, e.at, e.kind, e.step, Jsonb(e.data))
            for e in events
        ]
        async with self.db.transaction(durable=False) as conn, conn.cursor() as cur:
            async with cur.copy(  # one COPY, not one INSERT an event: ~3 events a step
                "COPY diagnostics (org_id, run_id, session_id, turn_id, seq, at, kind, step,"
                " data) FROM STDIN"
            ) as copy:
                for row in rows:
                    await copy.write_row(row)
            now = datetime.now(UTC)
            if retention_days is not None and (
                self._diagnostics_pruned is None
                or now - self._diagnostics_pruned > timedelta(hours=1)
            ):
                await cur.execute(
                    "DELETE FROM diagnostics WHERE at < %s",
                    (now - timedelta(days=retention_days),),
                )
                self._diagnostics_pruned = now

    async def diagnostics(
        self,
        org_id: str,
        *,
        run_id: UUID | None = None,
        session_id: UUID | None = None,
        turn_id: UUID | None = None,
    ) -> list[DiagnosticEvent]:
        """A run's timeline (every attempt), or a session's (one turn's with ``turn_id``),
        in the order the events were written."""
        args: tuple[UUID | None, ...]
        if run_id is not None:
            where, args = "run_id = %s", (run_id,)
        elif turn_id is not None:
            where, args = "session_id = %s AND turn_id = %s", (session_id, turn_id)
        else:
            where, args = "session_id = %s", (session_id,)
        async with self.db.connection() as conn:
            cur = await conn.execute(
                f"SELECT seq, at, kind, step, data FROM diagnostics "
                f"WHERE org_id = %s AND {where} ORDER BY id",
                (org_id, *args),
            )
            return [DiagnosticEvent.model_validate(r) for r in await cur.fetchall()]

    async def set_trace_attempt(self, org_id: str, run_id: UUID, span_id: str) -> None:
        """Remember the span id of the attempt now driving the run (the next links to it)."""
        async with self.db.transaction(durable=False) as conn:
            await conn.execute(
                "UPDATE task_runs SET trace_attempt = %s WHERE org_id = %s AND id = %s",
                (span_id, org_id, run_id),
            )

    async def spans_of_trace(self, org_id: str, trace_id: str) -> list[dict[str, Any]]:
        """The locally kept spans of one trace that the organisation may read (its own and
        those that name no organisation), in start order."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM trace_spans
                WHERE trace_id = %s AND (org_id = %s OR org_id IS NULL)
                ORDER BY start_time, span_id
                """,
                (trace_id, org_id),
            )
            return list(await cur.fetchall())

    async def trace_spans(self, org_id: str, run_id: UUID) -> list[dict[str, Any]]:
        """Every locally kept span of the traces in which the organisation's run appears
        (its attempts: a span naming the run's organisation and id marks each trace), in
        start order: the organisation's own spans and those that name none (HTTP requests,
        model replicas), never another organisation's (a caller chooses its trace id, so
        two organisations' requests may share one)."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM trace_spans
                WHERE trace_id IN (
                    SELECT trace_id FROM trace_spans WHERE org_id = %s AND run_id = %s
                ) AND (org_id = %s OR org_id IS NULL)
                ORDER BY start_time, span_id
                """,
                (org_id, run_id, org_id),
            )
            return list(await cur.fetchall())
