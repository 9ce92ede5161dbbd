"""Task runs and their step ledger: a run's row, its steps, its end and its cost."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Json, Jsonb

from cortex_ray._exceptions import NotFoundError
from cortex_ray._types import (
    ActionType,
    AgentAction,
    Candidate,
    DecisionKind,
    Observation,
    RunCost,
    RunMode,
    RunStatus,
    Step,
    StepRecording,
    TaskRun,
    utcnow,
)
from cortex_ray.storage._audit import INSERT_AUDIT, AuditEntry, AuditRows, audit_params
from cortex_ray.storage._database import Conn

__all__ = ["RunRows"]


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


# A run and the audit row of its submission in one statement (the run's parameters first).
_INSERT_RUN_AUDITED = f"WITH run AS ({_INSERT_RUN}) {INSERT_AUDIT}"


_COST_FIELDS = tuple(
    (name, "numeric" if info.annotation is float else "bigint")
    for name, info in RunCost.model_fields.items()
    if name != "loops"
)
"""The additive fields of ``RunCost`` and their SQL types (``add_run_cost``)."""


class RunRows(AuditRows):
    """Runs (a submission or a cancel writes its audit row in the same transaction)."""

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
                await conn.execute(_INSERT_RUN_AUDITED, params + audit_params(audit))
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

    async def work_in_progress(self, recent_s: float) -> int:
        """Work that holds the shared models or is about to (``WorkCounter``), across
        organisations: RUNNING runs with a live lease or created in the last ``recent_s``,
        and turns not ended that hold a live lease, were accepted in the last ``recent_s``,
        or wait behind a live turn of their session. Orphans nobody drives (the
        supervisor's to resume) hold nothing until they are taken again."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT (SELECT count(*) FROM task_runs
                        WHERE status = 'RUNNING'
                          AND ((lease_owner IS NOT NULL AND lease_expires_at > now())
                               OR created_at > now() - make_interval(secs => %(recent)s)))
                     + (SELECT count(*) FROM session_turns t
                        WHERE t.status IN ('ACCEPTED', 'RUNNING')
                          AND (t.lease_expires_at > now()
                               OR t.accepted_at > now() - make_interval(secs => %(recent)s)
                               OR EXISTS (
                                   SELECT 1 FROM session_turns live
                                   WHERE live.org_id = t.org_id
                                     AND live.session_id = t.session_id
                                     AND live.status = 'RUNNING'
                                     AND live.lease_expires_at > now()))) AS n
                """,
                {"recent": recent_s},
            )
            row = await cur.fetchone()
        return int(row["n"]) if row is not None else 0

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
