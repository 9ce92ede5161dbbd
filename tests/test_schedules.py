"""Schedules (issue 18, point 6): stored in PostgreSQL, fired once per due time even by two
schedulers at once, missed runs coalesced into one, suspended, resumed and cancelled by
their creator or an admin, nothing across organisations."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentMode,
    ConflictError,
    Grant,
    InvalidRequestError,
    Principal,
    RunMode,
    Runtime,
    Settings,
)
from cortex_ray.governance import ScheduleStatus, WorkflowVersionSpec
from cortex_ray.governance._schedules import next_due, run_id_for
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database


async def open_runtime(db: Database, settings: Settings) -> Runtime:
    return await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash"}),
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await open_runtime(db, settings)
    yield rt
    await rt.close(close_db=False)


async def agent(runtime: Runtime, org: str) -> str:
    await runtime.store.ensure_org(org)
    made = await runtime.create_agent(
        org, "nightly", mode=AgentMode.AUTONOMOUS, tools=["current_time"],
        grant=Grant(tools=frozenset({"current_time"})),
    )  # fmt: skip
    return made.name


async def test_two_schedulers_fire_each_due_time_exactly_once(
    db: Database, settings: Settings, org: str
) -> None:
    first, second = await open_runtime(db, settings), await open_runtime(db, settings)
    try:
        name = await agent(first, org)
        start = datetime.now(UTC) - timedelta(seconds=1)
        made = await first.governance.create_schedule(
            org, name, "check the clock", interval_s=60, run_at=start, max_steps=2
        )
        assert made.next_run_at == start
        fired = await asyncio.gather(
            *(rt.governance.fire_due_schedules() for rt in (first, second, first, second))
        )
        runs = [r for batch in fired for r in batch if r[0] == org]
        assert runs == [(org, run_id_for(made.id, start))]  # one run, by one of them
        [after] = await first.governance.list_schedules(org)
        assert after.fired == 1 and after.next_run_at == start + timedelta(seconds=60)
        run = await first.get_run(org, runs[0][1])
        assert run.max_steps == 2 and run.requested_by == f"schedule:{made.id}"
        # Not due again until the next minute: another sweep makes nothing.
        assert [r for r in await second.governance.fire_due_schedules() if r[0] == org] == []
    finally:
        await first.close(close_db=False)
        await second.close(close_db=False)


async def test_missed_runs_coalesce_into_one(runtime: Runtime, org: str) -> None:
    name = await agent(runtime, org)
    long_ago = datetime.now(UTC) - timedelta(minutes=10, seconds=30)
    made = await runtime.governance.create_schedule(
        org, name, "g", interval_s=60, run_at=long_ago, run_mode=RunMode.SHADOW
    )
    fired = [r for r in await runtime.governance.fire_due_schedules() if r[0] == org]
    assert len(fired) == 1
    [after] = await runtime.governance.list_schedules(org)
    assert after.next_run_at is not None and after.next_run_at > datetime.now(UTC)
    assert (after.next_run_at - long_ago).total_seconds() % 60 == 0  # on the grid
    assert (await runtime.get_run(org, fired[0][1])).run_mode is RunMode.SHADOW
    assert made.id == after.id


async def test_a_one_off_fires_once_and_is_done(runtime: Runtime, org: str) -> None:
    name = await agent(runtime, org)
    at = datetime.now(UTC) + timedelta(milliseconds=1)
    await runtime.governance.create_schedule(org, name, "g", run_at=at)
    await asyncio.sleep(0.01)
    assert len([r for r in await runtime.governance.fire_due_schedules() if r[0] == org]) == 1
    [done] = await runtime.governance.list_schedules(org)
    assert done.status == ScheduleStatus.DONE and done.next_run_at is None
    assert [r for r in await runtime.governance.fire_due_schedules() if r[0] == org] == []


def test_cron_in_a_time_zone() -> None:
    from cortex_ray.governance import Schedule

    s = Schedule(
        org_id="o", agent_id=uuid.uuid4(), goal="g", cron="0 9 * * *", timezone="Europe/Paris"
    )
    winter = next_due(s, datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    assert winter == datetime(2026, 12, 3, 8, 0, tzinfo=UTC)  # 09:00 CET
    summer = next_due(s, datetime(2026, 7, 1, 12, 0, tzinfo=UTC))
    assert summer == datetime(2026, 7, 2, 7, 0, tzinfo=UTC)  # 09:00 CEST


async def test_bad_schedules_are_refused_with_the_reason(runtime: Runtime, org: str) -> None:
    name = await agent(runtime, org)
    g = runtime.governance
    for kwargs, why in [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * * * *", "interval_s": 5}, "not both"),
        ({"cron": "* * * * *", "timezone": "Mars/Base"}, "unknown time zone"),
        ({}, "needs its time"),
        ({"run_at": datetime.now(UTC) - timedelta(hours=1)}, "in the past"),
        ({"interval_s": 60, "max_steps": 0}, "max_steps"),
    ]:
        with pytest.raises(InvalidRequestError, match=why):
            await g.create_schedule(org, name, "g", **kwargs)
    await runtime.create_agent(org, "chatty")
    with pytest.raises(InvalidRequestError, match="not AUTONOMOUS"):
        await g.create_schedule(org, "chatty", "g", interval_s=60)
    assert await g.list_schedules(org) == []


async def test_suspend_resume_cancel_and_who_may(runtime: Runtime, org: str) -> None:
    name = await agent(runtime, org)
    bob = Principal(id="bob", org_id=org)
    carol = Principal(id="carol", org_id=org)
    outsider = Principal(id="eve", org_id=f"{org}-x", is_admin=True)
    made = await runtime.governance.create_schedule(
        org, name, "g", cron="*/5 * * * *", principal=bob
    )
    g = runtime.governance
    with pytest.raises(AccessDeniedError, match="creator or an admin"):
        await g.change_schedule(org, made.id, "suspend", principal=carol)
    with pytest.raises(AccessDeniedError):
        await g.change_schedule(org, made.id, "suspend", principal=outsider)
    assert (await g.change_schedule(org, made.id, "suspend", principal=bob)).status == "SUSPENDED"
    # A suspended schedule does not fire, even when due.
    async with runtime.db.transaction() as conn:
        await conn.execute(
            "UPDATE schedules SET next_run_at = now() - interval '1 minute' WHERE id = %s",
            (made.id,),
        )
    assert [r for r in await g.fire_due_schedules() if r[0] == org] == []
    assert (await g.change_schedule(org, made.id, "resume")).status == "ACTIVE"
    assert len([r for r in await g.fire_due_schedules() if r[0] == org]) == 1
    with pytest.raises(ConflictError, match="not SUSPENDED"):
        await g.change_schedule(org, made.id, "resume")
    assert (await g.change_schedule(org, made.id, "cancel")).status == "CANCELLED"
    with pytest.raises(ConflictError, match="CANCELLED"):
        await g.change_schedule(org, made.id, "suspend")
    with pytest.raises(InvalidRequestError):
        await g.change_schedule(org, made.id, "explode")
    assert await g.list_schedules(f"{org}-x", principal=outsider) == []


async def test_schedules_over_http(runtime: Runtime, org: str) -> None:
    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    name = await agent(runtime, org)
    keys = [
        await runtime.create_api_key(o, who, admin=False, grant=["*"])
        for o, who in ((org, "bob"), (org, "carol"), (f"{org}-x", "eve"))
    ]
    bob, carol, eve = ({"Authorization": f"Bearer {k.key}"} for k in keys)
    executor = InProcessExecutor(runtime)
    base = f"/api/orgs/{org}"
    try:
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            body = {"agentId": name, "goal": "check", "cron": "0 * * * *", "timezone": "UTC"}
            for bad, status, why in [
                ({**body, "cron": "nope"}, 422, "invalid cron expression"),
                ({**body, "runMode": "yolo"}, 422, "runMode"),
                ({**body, "agentId": "ghost"}, 404, "ghost"),
                ({**body, "maxSteps": 0}, 422, "maxSteps"),
            ]:
                r = await http.post(f"{base}/schedules", headers=bob, json=bad)
                assert r.status_code == status and why in r.text, r.text
            r = await http.post(f"{base}/schedules", headers=bob, json=body)
            assert r.status_code == 201, r.text
            made = r.json()
            assert made["createdBy"] == "bob" and made["nextRunAt"]
            listed = (await http.get(f"{base}/schedules", headers=carol)).json()["schedules"]
            assert [s["id"] for s in listed] == [made["id"]]
            url = f"{base}/schedules/{made['id']}"
            r = await http.post(f"{url}/suspend", headers=carol)
            assert r.status_code == 403
            assert (await http.post(f"{url}/suspend", headers=bob)).json()["status"] == "SUSPENDED"
            assert (await http.post(f"{url}/explode", headers=bob)).status_code in (404, 422)
            assert (await http.post(f"{url}/cancel", headers=bob)).json()["status"] == "CANCELLED"
            r = await http.post(f"{url}/resume", headers=bob)
            assert r.status_code == 409
            for method, path in [
                ("GET", "/schedules"),
                ("POST", f"/schedules/{made['id']}/cancel"),
            ]:
                r = await http.request(method, base + path, headers=eve)
                assert r.status_code == 404
            r = await http.post(f"/api/orgs/{org}-x/schedules/{made['id']}/cancel", headers=eve)
            assert r.status_code == 404
    finally:
        await executor.aclose()


async def test_the_scheduler_loop_fires_on_time_without_the_sweep(
    db: Database, settings: Settings, org: str
) -> None:
    """Two supervisors whose sweeps and polls are an hour apart: only the scheduler loop's
    sleep until the earliest due time (woken when a schedule is made) can fire the
    one-off in time, and it fires once, its run driven to its end."""
    from cortex_ray import InProcessExecutor, RunStatus, RunSupervisor

    slow = settings.runs.model_copy(
        update={"supervise_interval_s": 3600.0, "schedule_poll_s": 3600.0}
    )
    runtimes = [await open_runtime(db, settings) for _ in range(2)]
    executors = [InProcessExecutor(rt) for rt in runtimes]
    supervisors = [RunSupervisor(rt, ex, slow) for rt, ex in zip(runtimes, executors, strict=True)]
    try:
        name = await agent(runtimes[0], org)
        for s in supervisors:
            await s.start()
        await asyncio.sleep(0.2)  # both loops asleep (for an hour) before the schedule exists
        made = await runtimes[0].governance.create_schedule(
            org, name, "check the clock", run_at=datetime.now(UTC) + timedelta(seconds=0.5)
        )
        for _ in range(600):
            [now] = await runtimes[0].governance.list_schedules(org)
            if now.status == ScheduleStatus.DONE:
                break
            await asyncio.sleep(0.05)
        assert now.status == ScheduleStatus.DONE and now.fired == 1
        run_id = run_id_for(made.id, made.next_run_at or datetime.now(UTC))
        for _ in range(600):
            run = await runtimes[0].get_run(org, run_id)
            if run.status is not RunStatus.RUNNING:
                break
            await asyncio.sleep(0.05)
        assert run.status is RunStatus.COMPLETED or run.reason  # driven to its end
        assert [r.id for r in await runtimes[0].list_runs(org)] == [run_id]  # exactly once
    finally:
        for s in supervisors:
            await s.aclose()
        for ex in executors:
            await ex.aclose()
        for rt in runtimes:
            await rt.close(close_db=False)


async def test_a_scheduled_run_past_its_time_cap_ends_failed(runtime: Runtime, org: str) -> None:
    from cortex_ray import RunStatus

    name = await agent(runtime, org)
    with pytest.raises(InvalidRequestError, match="max_seconds must be between 1 and"):
        await runtime.governance.create_schedule(org, name, "g", interval_s=60, max_seconds=0)
    made = await runtime.governance.create_schedule(
        org, name, "check the clock", interval_s=3600, max_seconds=1
    )
    assert made.max_seconds == 1
    [(_, run_id)] = [r for r in await runtime.governance.fire_due_schedules() if r[0] == org]
    fired = await runtime.get_run(org, run_id)
    assert fired.deadline_at is not None and fired.status is RunStatus.RUNNING
    assert 0 < (fired.deadline_at - fired.created_at).total_seconds() <= 1.0
    await asyncio.sleep(1.1)  # the run is not driven before its deadline has passed
    final = await runtime.drive_run(org, run_id)
    assert final.status is RunStatus.FAILED and final.steps == ()
    assert final.reason is not None and final.reason.startswith("time cap reached")
    # A schedule with no cap makes runs without a deadline.
    uncapped = await runtime.governance.create_schedule(
        org, name, "g", interval_s=3600, max_seconds=None, run_at=datetime.now(UTC)
    )
    [(_, free)] = [r for r in await runtime.governance.fire_due_schedules() if r[0] == org]
    assert free == run_id_for(uncapped.id, uncapped.next_run_at or datetime.now(UTC))
    assert (await runtime.get_run(org, free)).deadline_at is None


# --- workflow schedules -------------------------------------------------------------------

TRIAGE_SCHEMA = {
    "type": "object",
    "properties": {"customer": {"type": "string"}},
    "required": ["customer"],
}


def triage(**kw: object) -> WorkflowVersionSpec:
    base: dict[str, object] = {
        "instructions": "Read the clock for the customer.",
        "input_schema": TRIAGE_SCHEMA,
        "tools": ("current_time",),
    }
    return WorkflowVersionSpec.model_validate({**base, **kw})


async def test_a_workflow_schedule_starts_runs_of_its_version_checked_at_every_firing(
    runtime: Runtime, org: str
) -> None:
    from cortex_ray import NotFoundError, RunStatus

    name = await agent(runtime, org)
    g, w = runtime.governance, runtime.workflows
    await w.create(org, "triage")
    v1, _ = await w.publish(org, "triage", triage())
    # Refused when made: what every firing would refuse.
    for kwargs, error, why in [
        ({"inputs": {"customer": 7}}, InvalidRequestError, "inputs: customer: 7 is not of type"),
        ({"inputs": {}}, InvalidRequestError, "'customer' is a required property"),
        ({"inputs": {"customer": "ann"}, "workflow_version": 9}, NotFoundError, "no version 9"),
        ({"inputs": {"customer": "ann"}, "goal": "also this"}, InvalidRequestError, "not both"),
    ]:
        with pytest.raises(error, match=why):
            await g.create_schedule(
                org,
                name,
                workflow="triage",
                interval_s=3600,
                **kwargs,  # type: ignore[arg-type]
            )
    with pytest.raises(NotFoundError, match="no published version"):
        await g.create_schedule(org, name, workflow="ghost", inputs={}, interval_s=3600)
    with pytest.raises(InvalidRequestError, match="inputs go with a workflow"):
        await g.create_schedule(org, name, "g", inputs={"a": 1}, interval_s=3600)

    latest = await g.create_schedule(
        org, name, workflow="triage", inputs={"customer": "ann"}, interval_s=3600
    )
    pinned = await g.create_schedule(
        org, name, workflow="triage", workflow_version=1, inputs={"customer": "bo"},
        interval_s=3600, run_mode=RunMode.DRY_RUN,
    )  # fmt: skip
    assert latest.goal == "" and latest.run_mode is None and pinned.workflow_version == 1
    fired = dict((r, o) for o, r in await g.fire_due_schedules() if o == org)
    runs = {run.id: run for run in [await runtime.get_run(org, r) for r in fired]}
    assert len(runs) == 2
    for run in runs.values():
        assert run.status is RunStatus.RUNNING and run.workflow_version_id == v1.id
        assert run.goal == "Read the clock for the customer."
        assert run.requested_by in (f"schedule:{latest.id}", f"schedule:{pinned.id}")
    by_schedule = {r.requested_by: r for r in runs.values()}
    assert by_schedule[f"schedule:{latest.id}"].workflow_inputs == {"customer": "ann"}
    assert by_schedule[f"schedule:{latest.id}"].run_mode is RunMode.EXECUTE  # v1's default
    assert by_schedule[f"schedule:{pinned.id}"].run_mode is RunMode.DRY_RUN

    # v2 needs a priority: the schedule on the latest version cannot bypass it; its
    # firing records a FAILED run and the finding, and the loop and the schedule go on.
    v2_schema = {**TRIAGE_SCHEMA, "required": ["customer", "priority"]}
    v2, _ = await w.publish(org, "triage", triage(input_schema=v2_schema))
    async with runtime.db.transaction() as conn:
        await conn.execute(
            "UPDATE schedules SET next_run_at = now() - interval '1 second' WHERE org_id = %s",
            (org,),
        )
    made = [r for o, r in await g.fire_due_schedules() if o == org]
    assert len(made) == 1  # only the pinned one's run is handed to an executor
    assert (await runtime.get_run(org, made[0])).workflow_version_id == v1.id
    schedules = {s.id: s for s in await g.list_schedules(org)}
    broken = schedules[latest.id]
    assert broken.status == ScheduleStatus.ACTIVE and broken.fired == 2
    assert broken.last_error is not None and "triage v2" in broken.last_error
    assert "'priority' is a required property" in broken.last_error
    assert schedules[pinned.id].last_error is None
    failed = await runtime.get_run(org, broken.last_run_id)  # type: ignore[arg-type]
    assert failed.status is RunStatus.FAILED and failed.finished_at is not None
    assert failed.workflow_version_id == v2.id and failed.reason == broken.last_error
    assert (await runtime.drive_run(org, failed.id)).status is RunStatus.FAILED  # not driven
    ledger = await w.ledger(org, failed.id, workflow="triage")
    assert ledger.status == "FAILED" and [e.kind for e in ledger.events] == [
        "started",
        "finished",
    ]

    # v3 runs shadow by default: the schedule's execute (v1's default then) is refused too.
    await w.publish(org, "triage", triage(default_mode=RunMode.SHADOW))
    with pytest.raises(InvalidRequestError, match="only choose a safer mode"):
        await g.create_schedule(
            org, name, workflow="triage", inputs={"customer": "ann"}, interval_s=60,
            run_mode=RunMode.EXECUTE,
        )  # fmt: skip
    async with runtime.db.transaction() as conn:
        await conn.execute(
            "UPDATE schedules SET next_run_at = now() - interval '1 second' WHERE id = %s",
            (latest.id,),
        )
    assert [r for o, r in await g.fire_due_schedules() if o == org] != []  # v3: valid again
    [again] = [s for s in await g.list_schedules(org) if s.id == latest.id]
    assert again.last_error is None  # cleared by a firing that started its run
    assert (await runtime.get_run(org, again.last_run_id)).run_mode is RunMode.SHADOW  # type: ignore[arg-type]


async def test_workflow_schedules_over_http(runtime: Runtime, org: str) -> None:
    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    name = await agent(runtime, org)
    await runtime.workflows.create(org, "triage")
    await runtime.workflows.publish(org, "triage", triage())
    key = await runtime.create_api_key(org, "bob", admin=False, grant=["*"])
    bob = {"Authorization": f"Bearer {key.key}"}
    executor = InProcessExecutor(runtime)
    base = f"/api/orgs/{org}/schedules"
    try:
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            body = {"agentId": name, "workflow": "triage", "inputs": {"customer": "ann"},
                    "intervalS": 3600}  # fmt: skip
            for bad, status, why in [
                ({**body, "inputs": {"customer": 7}}, 422, "inputs: customer: 7 is not of type"),
                ({**body, "goal": "and this"}, 422, "a goal or a workflow"),
                ({"agentId": name, "intervalS": 60}, 422, "a goal or a workflow"),
                ({**body, "workflow": "ghost"}, 404, "ghost"),
                ({**body, "version": 4}, 404, "no version 4"),
                ({**body, "workflow": "Bad Name"}, 422, "workflow"),
            ]:
                r = await http.post(base, headers=bob, json=bad)
                assert r.status_code == status and why in r.text, (bad, r.text)
            r = await http.post(base, headers=bob, json=body)
            assert r.status_code == 201, r.text
            made = r.json()
            assert made["workflow"] == "triage" and made["workflowVersion"] is None
            assert made["inputs"] == {"customer": "ann"} and made["goal"] == ""
            assert made["runMode"] is None and made["lastError"] is None
            [listed] = (await http.get(base, headers=bob)).json()["schedules"]
            assert listed["id"] == made["id"] and listed["workflow"] == "triage"
    finally:
        await executor.aclose()
