"""Schedules (issue 18, point 6): recurring (cron expression or interval, in a time zone)
and one-off autonomous tasks, stored in PostgreSQL and fired exactly once per due time.

**Exactly once.** Firing a due schedule creates its run, with an id derived from the
schedule and the due time (``uuid5``), and moves ``next_run_at`` on only if it still is
that due time (compare and set), in one transaction. Two schedulers (two API replicas)
firing the same due time both try to create the same run: the second insert conflicts
(waiting for the first to commit) and makes nothing, and its compare and set matches no
row. A scheduler that dies mid-way rolls back: the schedule stays due for the next sweep.

**Missed runs** (the stack was down over several due times): they coalesce into one run,
fired at once, and the schedule moves to its first due time after now. A one-off schedule
missed fires once, late. Each run is capped by the schedule's ``max_steps``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray._types import RunMode, utcnow
from cortex_ray.storage import Database

__all__ = ["Schedule", "ScheduleStatus", "ScheduleStore", "next_due", "validate_schedule"]

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
    goal: str
    cron: str | None = None
    interval_s: int | None = None
    timezone: str = "UTC"
    next_run_at: datetime | None = None
    max_steps: int = 8
    run_mode: RunMode = RunMode.EXECUTE
    status: str = ScheduleStatus.ACTIVE
    created_by: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    fired: int = 0
    last_run_id: UUID | None = None
    last_fired_at: datetime | None = None


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
    if not schedule.goal.strip():
        raise InvalidRequestError("the goal is empty")
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


def run_id_for(schedule_id: UUID, due: datetime) -> UUID:
    """The id of the run a schedule fires for a due time: the same in every scheduler."""
    return uuid.uuid5(_NAMESPACE, f"{schedule_id}:{due.astimezone(UTC).isoformat()}")


class ScheduleStore:
    """SQL of ``schedules``; every statement filters by organisation except the sweep for
    due schedules (the scheduler's, across organisations, like the orphaned-run sweep)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, schedule: Schedule) -> Schedule:
        s = schedule
        async with self.db.transaction() as conn:
            await conn.execute(
                """
                INSERT INTO schedules (org_id, id, agent_id, name, goal, cron, interval_s,
                    timezone, next_run_at, max_steps, run_mode, status, created_by, created_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (
                    s.org_id, s.id, s.agent_id, s.name, s.goal, s.cron, s.interval_s,
                    s.timezone, s.next_run_at, s.max_steps, s.run_mode.value, s.status,
                    s.created_by, s.created_at,
                ),
            )  # fmt: skip
        return schedule

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

    async def due(self, now: datetime, limit: int = 1000) -> list[Schedule]:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT * FROM schedules WHERE status = 'ACTIVE' AND next_run_at <= %s
                ORDER BY next_run_at LIMIT %s
                """,
                (now, limit),
            )
            return [Schedule.model_validate(r) for r in await cur.fetchall()]

    async def fire(self, schedule: Schedule, now: datetime) -> UUID | None:
        """Fire one due schedule (see the module docstring); the new run's id, or ``None``
        when another scheduler made this due time's run."""
        due = schedule.next_run_at
        assert due is not None
        run_id = run_id_for(schedule.id, due)
        following = next_due(schedule, max(now, due))
        async with self.db.transaction() as conn:
            cur = await conn.execute(
                """
                INSERT INTO task_runs (org_id, id, agent_id, name, goal, status, max_steps,
                                       requested_by, created_at, run_mode)
                SELECT %s, %s, %s, %s, %s, 'RUNNING', %s, %s, %s, %s
                FROM schedules s
                WHERE s.org_id = %s AND s.id = %s AND s.status = 'ACTIVE'
                  AND s.next_run_at = %s
                ON CONFLICT (org_id, id) DO NOTHING
                RETURNING id
                """,
                (
                    schedule.org_id, run_id, schedule.agent_id,
                    schedule.name or f"schedule {schedule.id}", schedule.goal,
                    schedule.max_steps, f"schedule:{schedule.id}", now,
                    schedule.run_mode.value, schedule.org_id, schedule.id, due,
                ),
            )  # fmt: skip
            made = await cur.fetchone() is not None
            await conn.execute(
                """
                UPDATE schedules SET next_run_at = %s, last_fired_at = %s,
                    last_run_id = %s, fired = fired + 1,
                    status = CASE WHEN %s::timestamptz IS NULL THEN 'DONE' ELSE status END
                WHERE org_id = %s AND id = %s AND next_run_at = %s AND status = 'ACTIVE'
                """,
                (following, now, run_id, following, schedule.org_id, schedule.id, due),
            )
        return run_id if made else None
