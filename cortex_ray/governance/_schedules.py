"""Schedules (issue 18, point 6): recurring (cron expression or interval, in a time zone)
and one-off autonomous tasks, stored in PostgreSQL and fired exactly once per due time.

**Exactly once.** Firing a due schedule creates its run, with an id derived from the
schedule and the due time (``uuid5``), and moves ``next_run_at`` on only if it still is
that due time (compare and set), in one transaction, for a batch of due schedules locked
``FOR UPDATE SKIP LOCKED``: two schedulers (two API replicas) sweeping at once take
different schedules instead of waiting for each other; and should both reach the same due
time, the second insert conflicts and makes nothing and its compare and set matches no row.
A scheduler that dies mid-way rolls back: the schedule stays due for the next sweep.

**Missed runs** (the stack was down over several due times): they coalesce into one run,
fired at once, and the schedule moves to its first due time after now. A one-off schedule
missed fires once, late. Each run is capped by the schedule's ``max_steps`` and in time by
its ``max_seconds`` (default ``DEFAULT_MAX_SECONDS``): the run's deadline is set when it is
fired, and a run still going past it ends FAILED at its next step.

**Workflow schedules** name a workflow (and optionally a pinned version) and its inputs
instead of a goal. Each firing resolves the version (the pinned one, or the latest at that
moment) and checks the inputs against its schema and the schedule's mode against its
default with the very checks a workflow run's start makes (``check_inputs``,
``run_mode_for``): a version published since the schedule was made cannot be bypassed. A
firing that fails them records its run FAILED, with the finding as its reason, and the
finding on the schedule (``last_error``); the loop goes on, and so does the schedule.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import RunMode, RunStatus, utcnow
from cortex_ray.governance._patterns import InputLimits
from cortex_ray.governance._workflows import (
    VERSION_SELECT,
    WorkflowVersion,
    check_inputs,
    run_mode_for,
    version_from_row,
)
from cortex_ray.storage import Conn, Database

__all__ = [
    "Schedule",
    "ScheduleStatus",
    "ScheduleStore",
    "next_due",
    "validate_schedule",
    "workflow_run_of",
]

DEFAULT_MAX_SECONDS = 3600
"""A scheduled run's wall-time cap when its schedule names none (one hour)."""
MAX_SECONDS_LIMIT = 7 * 86400

_NAMESPACE = uuid.UUID("5b1c1d0e-7c59-4a77-9a53-6c6f2a3a7a18")


class ScheduleStatus:
    ACTIVE = "ACTIVE"
    SUSPENDED = "SUSPENDED"
    CANCELLED = "CANCELLED"
    DONE = "DONE"


class Schedule(BaseModel):
    """A recurring (``cron`` or ``interval_s``) or one-off (neither: ``next_run_at``) task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: UUID = Field(default_factory=uuid.uuid4)
    org_id: str
    agent_id: UUID
    name: str = ""
    goal: str = ""
    """The runs' goal; empty for a workflow schedule (its version's instructions)."""
    workflow: str | None = None
    """A workflow schedule's workflow: each run is a run of its version."""
    workflow_version: int | None = None
    """The pinned version (``None``: the latest when the schedule fires)."""
    inputs: dict[str, Any] | None = None
    """A workflow schedule's inputs, checked against the version's schema at every firing."""
    cron: str | None = None
    interval_s: int | None = None
    timezone: str = "UTC"
    next_run_at: datetime | None = None
    max_steps: int = 8
    max_seconds: int | None = DEFAULT_MAX_SECONDS
    """Each run's wall-time cap, from when it is fired (``None``: no cap)."""
    run_mode: RunMode | None = RunMode.EXECUTE
    """The runs' mode; ``None`` only for a workflow schedule: the version's default."""
    status: str = ScheduleStatus.ACTIVE
    created_by: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    fired: int = 0
    last_run_id: UUID | None = None
    last_fired_at: datetime | None = None
    last_error: str | None = None
    """Why the latest firing could not start its run (a workflow schedule whose inputs or
    mode the version refused then); cleared by the next firing that starts one."""
    last_error_at: datetime | None = None


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequestError(f"unknown time zone {name!r}") from None


def next_due(schedule: Schedule, after: datetime) -> datetime | None:
    """The schedule's first due time strictly after ``after`` (``None``: a one-off)."""
    if schedule.interval_s is not None:
        assert schedule.next_run_at is not None
        step = timedelta(seconds=schedule.interval_s)
        due = schedule.next_run_at
        if due > after:
            return due
        missed = int((after - due) / step) + 1
        return due + missed * step
    if schedule.cron is not None:
        local = after.astimezone(_zone(schedule.timezone))
        following: datetime = croniter(schedule.cron, local).get_next(datetime)
        return following.astimezone(UTC)
    return None


def validate_schedule(schedule: Schedule, now: datetime) -> Schedule:
    """Check what a person gave and fill ``next_run_at``.

    Raises:
        InvalidRequestError: A bad cron expression or zone, both cron and interval, a
            one-off without a time (or with one in the past), an empty goal.
    """
    if schedule.workflow is None:
        if not schedule.goal.strip():
            raise InvalidRequestError("the goal is empty")
        if schedule.workflow_version is not None or schedule.inputs is not None:
            raise InvalidRequestError("a version and inputs go with a workflow")
        if schedule.run_mode is None:
            raise InvalidRequestError("a schedule without a workflow needs its run mode")
    elif schedule.goal.strip():
        raise InvalidRequestError(
            "a workflow schedule runs its version's instructions: give a goal or a workflow, "
            "not both"
        )
    if schedule.max_seconds is not None and not 1 <= schedule.max_seconds <= MAX_SECONDS_LIMIT:
        raise InvalidRequestError(f"max_seconds must be between 1 and {MAX_SECONDS_LIMIT}")
    _zone(schedule.timezone)
    if schedule.cron is not None and schedule.interval_s is not None:
        raise InvalidRequestError("a schedule has a cron expression or an interval, not both")
    if schedule.cron is not None:
        if not croniter.is_valid(schedule.cron):
            raise InvalidRequestError(f"invalid cron expression {schedule.cron!r}")
        first = next_due(schedule, now)
        return schedule.model_copy(update={"next_run_at": first})
    if schedule.interval_s is not None:
        if schedule.interval_s < 1:
            raise InvalidRequestError("interval_s must be at least 1")
        return schedule.model_copy(update={"next_run_at": schedule.next_run_at or now})
    if schedule.next_run_at is None:
        raise InvalidRequestError("a one-off schedule needs its time (run_at)")
    if schedule.next_run_at.tzinfo is None:
        raise InvalidRequestError("run_at needs a time zone")
    if schedule.next_run_at < now - timedelta(minutes=1):
        raise InvalidRequestError("run_at is in the past")
    return schedule


def workflow_run_of(
    schedule: Schedule, version: WorkflowVersion, limits: InputLimits
) -> tuple[dict[str, Any], RunMode]:
    """A workflow schedule's inputs and mode as ``version`` accepts them, by the checks a
    workflow run's start makes.

    Raises:
        InvalidRequestError: The inputs fail the version's schema, or the schedule's mode is
            less safe than the version's default.
    """
    return check_inputs(version, schedule.inputs or {}, limits), run_mode_for(
        version, schedule.run_mode
    )


async def _resolve_version(conn: Conn, schedule: Schedule) -> WorkflowVersion | None:
    """A workflow schedule's version now: the pinned one, or the latest published."""
    cur = await conn.execute(
        f"""{VERSION_SELECT}
        WHERE v.org_id = %s AND w.name = %s AND (%s::int IS NULL OR v.version = %s)
        ORDER BY v.version DESC LIMIT 1
        """,
        (schedule.org_id, schedule.workflow, schedule.workflow_version, schedule.workflow_version),
    )
    row = await cur.fetchone()
    return None if row is None else version_from_row(row)


class _Firing(BaseModel):
    """What one due schedule's firing inserts: its run, RUNNING, or FAILED at once."""

    goal: str
    run_mode: RunMode
    version_id: UUID | None = None
    inputs: str | None = None
    status: RunStatus = RunStatus.RUNNING
    reason: str | None = None


async def _firing(conn: Conn, schedule: Schedule, limits: InputLimits) -> _Firing:
    mode = schedule.run_mode or RunMode.EXECUTE
    if schedule.workflow is None:
        return _Firing(goal=schedule.goal, run_mode=mode)
    pinned = "" if schedule.workflow_version is None else f" v{schedule.workflow_version}"
    version = await _resolve_version(conn, schedule)
    if version is None:
        return _Firing(
            goal=f"workflow {schedule.workflow}{pinned}",
            run_mode=mode,
            inputs=json.dumps(schedule.inputs or {}),
            status=RunStatus.FAILED,
            reason=f"schedule {schedule.id}: workflow {schedule.workflow!r}{pinned} has no "
            "such published version",
        )
    try:
        inputs, mode = workflow_run_of(schedule, version, limits)
    except InvalidRequestError as exc:
        return _Firing(
            goal=version.instructions,
            run_mode=schedule.run_mode or version.default_mode,
            version_id=version.id,
            inputs=json.dumps(schedule.inputs or {}),
            status=RunStatus.FAILED,
            reason=f"schedule {schedule.id}: {version.label} refused the schedule's run: {exc}",
        )
    return _Firing(
        goal=version.instructions, run_mode=mode, version_id=version.id, inputs=json.dumps(inputs)
    )


def run_id_for(schedule_id: UUID, due: datetime) -> UUID:
    """The id of the run a schedule fires for a due time: the same in every scheduler."""
    return uuid.uuid5(_NAMESPACE, f"{schedule_id}:{due.astimezone(UTC).isoformat()}")


class ScheduleStore:
    """SQL of ``schedules``; every statement filters by organisation except the sweep for
    due schedules (the scheduler's, across organisations, like the orphaned-run sweep)."""

    def __init__(self, db: Database, limits: InputLimits | None = None) -> None:
        self.db = db
        self.limits = limits or InputLimits()

    async def create(self, schedule: Schedule) -> Schedule:
        s = schedule
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO schedules (org_id, id, agent_id, name, goal, cron, interval_s,
                    timezone, next_run_at, max_steps, max_seconds, run_mode, status,
                    created_by, created_at, workflow, workflow_version, inputs)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                        %s)
                """,
                (
                    s.org_id, s.id, s.agent_id, s.name, s.goal, s.cron, s.interval_s,
                    s.timezone, s.next_run_at, s.max_steps, s.max_seconds,
                    None if s.run_mode is None else s.run_mode.value,
                    s.status, s.created_by, s.created_at, s.workflow, s.workflow_version,
                    None if s.inputs is None else Jsonb(s.inputs),
                ),
            )  # fmt: skip
        return schedule

    async def next_due_at(self) -> datetime | None:
        """When the earliest ACTIVE schedule is due, in any organisation (the scheduler's
        sleep; ``None``: nothing to fire)."""
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT min(next_run_at) AS due FROM schedules WHERE status = 'ACTIVE'"
            )
            row = await cur.fetchone()
        return None if row is None else row["due"]

    async def in_org(self, org_id: str) -> list[Schedule]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM schedules WHERE org_id = %s ORDER BY created_at, id", (org_id,)
            )
            return [Schedule.model_validate(r) for r in await cur.fetchall()]

    async def get(self, org_id: str, schedule_id: UUID) -> Schedule | None:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM schedules WHERE org_id = %s AND id = %s", (org_id, schedule_id)
            )
            row = await cur.fetchone()
        return None if row is None else Schedule.model_validate(row)

    async def set_status(
        self, org_id: str, schedule_id: UUID, status: str, *, next_run_at: Any = None
    ) -> Schedule | None:
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                UPDATE schedules SET status = %s, next_run_at = coalesce(%s, next_run_at)
                WHERE org_id = %s AND id = %s RETURNING *
                """,
                (status, next_run_at, org_id, schedule_id),
            )
            row = await cur.fetchone()
        return None if row is None else Schedule.model_validate(row)

    async def fire_due(self, now: datetime, limit: int = 200) -> tuple[list[tuple[str, UUID]], int]:
        """Fire up to ``limit`` due schedules in one transaction (see the module docstring):
        the (organisation, run id) of each RUNNING run made (a workflow schedule's run its
        version refused is made FAILED, for nobody to drive), and how many due schedules
        were taken (0: none was due). The due rows are locked ``SKIP LOCKED``, so
        schedulers sweeping at once share the work instead of waiting; the derived run ids
        and the compare and set keep it exactly once regardless."""
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM schedules WHERE status = 'ACTIVE' AND next_run_at <= %s
                ORDER BY next_run_at LIMIT %s FOR UPDATE SKIP LOCKED
                """,
                (now, limit),
            )
            due = [Schedule.model_validate(r) for r in await cur.fetchall()]
            if not due:
                return [], 0
            # Plain schedules need no read; a workflow schedule reads its version (one
            # indexed row each, cached nowhere: the latest may have changed).
            firings = [await _firing(conn, s, self.limits) for s in due]
            fired_at = utcnow()  # when the runs are made, not when the sweep began
            nexts = [next_due(s, max(now, s.next_run_at or now)) for s in due]
            run_ids = [run_id_for(s.id, s.next_run_at or now) for s in due]
            failed = [f.status is RunStatus.FAILED for f in firings]
            cur = await conn.execute(
                """
                INSERT INTO task_runs (org_id, id, agent_id, name, goal, status, max_steps,
                                       requested_by, created_at, run_mode, deadline_at,
                                       workflow_version_id, workflow_inputs, reason,
                                       finished_at)
                SELECT o, i, a, n, g, st, m, r, %s, rm,
                       %s::timestamptz + make_interval(secs => cap), wv, wi::jsonb, why,
                       CASE WHEN st = 'FAILED' THEN %s::timestamptz END
                FROM unnest(%s::text[], %s::uuid[], %s::uuid[], %s::text[], %s::text[],
                            %s::int[], %s::text[], %s::text[], %s::int[], %s::text[],
                            %s::uuid[], %s::text[], %s::text[])
                     AS u(o, i, a, n, g, m, r, rm, cap, st, wv, wi, why)
                ON CONFLICT (org_id, id) DO NOTHING
                RETURNING org_id, id, status
                """,
                (
                    fired_at,
                    fired_at,
                    fired_at,
                    [s.org_id for s in due],
                    run_ids,
                    [s.agent_id for s in due],
                    [s.name or f"schedule {s.id}" for s in due],
                    [f.goal for f in firings],
                    [s.max_steps for s in due],
                    [f"schedule:{s.id}" for s in due],
                    [f.run_mode.value for f in firings],
                    [s.max_seconds for s in due],
                    [f.status.value for f in firings],
                    [f.version_id for f in firings],
                    [f.inputs for f in firings],
                    [f.reason for f in firings],
                ),
            )
            made = [
                (r["org_id"], r["id"])
                for r in await cur.fetchall()
                if r["status"] == RunStatus.RUNNING.value
            ]
            await conn.execute(
                """
                UPDATE schedules s SET next_run_at = u.nxt, last_fired_at = %s,
                    last_run_id = u.run, fired = s.fired + 1,
                    status = CASE WHEN u.nxt IS NULL THEN 'DONE' ELSE s.status END,
                    last_error = CASE WHEN u.failed THEN u.why ELSE NULL END,
                    last_error_at = CASE WHEN u.failed THEN %s::timestamptz ELSE NULL END
                FROM unnest(%s::text[], %s::uuid[], %s::timestamptz[], %s::timestamptz[],
                            %s::uuid[], %s::bool[], %s::text[])
                     AS u(o, i, due, nxt, run, failed, why)
                WHERE s.org_id = u.o AND s.id = u.i AND s.next_run_at = u.due
                """,
                (
                    fired_at,
                    fired_at,
                    [s.org_id for s in due],
                    [s.id for s in due],
                    [s.next_run_at for s in due],
                    nexts,
                    run_ids,
                    failed,
                    [f.reason for f in firings],
                ),
            )
        return made, len(due)
