"""Scheduler precision (issue 18, point 9): 1,000 schedules due in the same second, fired
THROUGH the API's real loop (``RunSupervisor``: its scheduler sleeps until the earliest
schedule is due, at most ``schedule_poll_s``), side by side with the baseline, the same
supervisor with only its periodic sweep (``supervise_interval_s``, 15 s: how schedules
fired before the scheduler had its own loop).

Each run's fire delay is its creation time (when the scheduler made it) minus its due time.
``--schedulers 2`` runs two runtimes, each with its supervisor and in-process executor, on
one database (as two API replicas would): every due schedule must make exactly one run. The
schedules are written straight to the store, as another process would, so nothing wakes the
loops early: they find them by their own polling. The baseline's supervisors start at a
random phase of their sweep (seeded, printed), so its delay is one draw of what an
arbitrary due time sees: uniform between 0 and 15 s.

Printed per mode: the delay's p50, p95 and max, runs made (exactly once or not); then the
ratio of the baseline's p95 to the loop's, and whether the loop's p95 ≤ 1 s.

Run: ``.venv/bin/python bench/scheduler_precision.py [--schedules 1000] [--schedulers 2]``
(~1.5 min).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cortex_ray import AgentMode, Grant, InProcessExecutor, RunSupervisor, Runtime, Settings
from cortex_ray.governance import Schedule
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database

SWEEP_S = 15.0


async def measure(
    db: Database,
    settings: Settings,
    count: int,
    schedulers: int,
    *,
    loop: bool,
    phase: float,
) -> tuple[list[float], int]:
    """Fire ``count`` schedules due at one second through ``schedulers`` supervisors (with
    the scheduler loop, or sweeping only); the delays (s) and the runs made."""
    runtimes = [
        await Runtime.open(
            settings, model=None, embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(), db=db,
        )
        for _ in range(schedulers)
    ]  # fmt: skip
    executors = [InProcessExecutor(rt) for rt in runtimes]
    supervisors = [
        RunSupervisor(rt, ex, scheduler=loop) for rt, ex in zip(runtimes, executors, strict=True)
    ]
    try:
        org = f"bench-{uuid.uuid4().hex[:8]}"
        rt = runtimes[0]
        await rt.store.ensure_org(org)
        agent = await rt.create_agent(
            org, "nightly", mode=AgentMode.AUTONOMOUS, tools=["current_time"],
            grant=Grant(tools=frozenset({"current_time"})),
        )  # fmt: skip
        lead = 8.0 if loop else SWEEP_S + 8.0  # time to write the schedules (and the phase)
        due = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        if loop:
            for s in supervisors:
                await s.start()  # running before the schedules exist, as in the API
        store = rt.governance.schedules
        for i in range(count):
            await store.create(
                Schedule(org_id=org, agent_id=agent.id, goal=f"g{i}", interval_s=3600,
                         next_run_at=due, created_by="bench")
            )  # fmt: skip
        assert datetime.now(UTC) < due - timedelta(seconds=1), "writing took too long"
        if not loop:
            # The sweeping supervisors start `phase` s before the due time: their sweeps
            # fall at due - phase, due - phase + 15 s, ...
            start_at = due - timedelta(seconds=phase)
            await asyncio.sleep((start_at - datetime.now(UTC)).total_seconds())
            for s in supervisors:
                await s.start()
        deadline = time.monotonic() + lead + SWEEP_S + 60
        created: list[datetime] = []
        while time.monotonic() < deadline:
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT created_at FROM task_runs WHERE org_id = %s", (org,)
                )
                created = [r["created_at"] for r in await cur.fetchall()]
            if len(created) >= count:
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # anything fired twice would show now
        async with db.connection() as conn:
            cur = await conn.execute("SELECT created_at FROM task_runs WHERE org_id = %s", (org,))
            created = [r["created_at"] for r in await cur.fetchall()]
        return sorted((c - due).total_seconds() for c in created), len(created)
    finally:
        for s in supervisors:
            await s.aclose()
        for ex in executors:
            await ex.aclose()
        for r in runtimes:
            await r.close(close_db=False)


def _q(delays: list[float], q: float) -> float:
    return delays[min(len(delays) - 1, int(q * len(delays)))]


async def main(count: int, schedulers: int, seed: int) -> int:
    data = Path(tempfile.mkdtemp(prefix="cortex-ray-sched-bench-", dir="/tmp"))
    settings = Settings(data_dir=data, embedding_backend="hash")
    db = await Database.open(settings.storage)
    phase = random.Random(seed).uniform(0.0, SWEEP_S)
    try:
        print(f"scheduler precision: {count} schedules due at the same second, "
              f"{schedulers} scheduler(s) on one database")  # fmt: skip
        results = {}
        for name, loop in (("loop (ours)", True), (f"sweep every {SWEEP_S:g} s", False)):
            delays, made = await measure(db, settings, count, schedulers, loop=loop, phase=phase)
            results[name] = delays
            extra = "" if loop else f"; sweep phase {phase:.2f} s before due (seed {seed})"
            print(f"  {name:<20} runs {made} (exactly once: {made == count}); fire delay "
                  f"p50 {_q(delays, 0.5):.3f} s  p95 {_q(delays, 0.95):.3f} s  "
                  f"max {delays[-1]:.3f} s{extra}")  # fmt: skip
        ours, base = (results[k] for k in results)
        p95 = _q(ours, 0.95)
        ratio = _q(base, 0.95) / max(p95, 1e-3)
        print(f"  ratio p95 sweep/loop {ratio:.1f}x; loop p95 ≤ 1 s: "
              f"{'met' if p95 <= 1 else 'missed'}")  # fmt: skip
        return 0
    finally:
        await db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=18)
    ns = parser.parse_args()
    sys.exit(asyncio.run(main(ns.schedules, ns.schedulers, ns.seed)))
