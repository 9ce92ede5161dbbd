"""Run modes (issue 18, point 4), on the real cycle with a scripted planner: a dry run
validates and decides every call but runs only READ tools, a shadow run records its WRITE
calls as proposals that nothing executes; the report lists what would have happened, a
person labels shadow runs and the acceptance report counts the labels."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentMode,
    ConflictError,
    Grant,
    InvalidRequestError,
    ObservationStatus,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.governance import RunLabel
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database
from tests.test_connector_grants import CRM, TOOLS, ran

STEP = re.compile(r"Step (\d+) of (\d+)\.")
PLAN: list[dict[str, Any]] = [
    {"tool": "crm_lookup", "args": {"name": "ann"}, "rationale": "read first"},
    {"tool": "crm_update", "args": {"name": "ann", "region": "eu"}, "rationale": "then change"},
    {"finish": True, "message": "done", "rationale": "all done"},
]


def plan(request: ChatRequest) -> str:
    text = "\n".join(m.content or "" for m in request.messages)
    match = STEP.search(text)
    assert match is not None, text
    return json.dumps({"candidates": [PLAN[int(match.group(1)) - 1]]})


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash", "candidates": 1}),
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        tools=TOOLS,
        connectors=[CRM],
    )
    yield rt
    await rt.close(close_db=False)


async def setup(runtime: Runtime, org: str) -> str:
    await runtime.store.ensure_org(org)
    agent = await runtime.create_agent(
        org, "clerk", mode=AgentMode.AUTONOMOUS, tools=["crm_lookup", "crm_update"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    await runtime.governance.install_connector(org, "crm")
    from cortex_ray.governance import GrantRequest

    await runtime.governance.create_grant(
        org, GrantRequest(principal_id="*", connector="crm", max_tier="write")
    )
    return agent.name


@pytest.mark.parametrize(
    ("mode", "status", "decision"),
    [
        (RunMode.DRY_RUN, ObservationStatus.SIMULATED, "simulated"),
        (RunMode.SHADOW, ObservationStatus.PROPOSED, "proposed"),
    ],
)
async def test_write_calls_never_run_outside_execute(
    runtime: Runtime, org: str, mode: RunMode, status: ObservationStatus, decision: str
) -> None:
    ran.clear()
    agent = await setup(runtime, org)
    run = await runtime.run_autonomous(org, agent, "update ann", max_steps=4, run_mode=mode)
    assert run.status is RunStatus.COMPLETED and run.run_mode is mode
    assert [s.observation.status for s in run.steps if s.observation] == [
        ObservationStatus.OK,
        status,
    ]
    assert ran == [("crm_lookup", {"name": "ann"})]  # the write's code never ran
    report = await runtime.governance.run_report(org, run.id)
    assert [c.tool for c in report.executed] == ["crm_lookup"]
    listed = report.simulated if mode is RunMode.DRY_RUN else report.proposed
    assert [(c.step_index, c.tool, c.tier, c.decision, c.args) for c in listed] == [
        (1, "crm_update", "write", decision, {"name": "ann", "region": "eu"})
    ]
    rows = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert {r["run_mode"] for r in rows} == {mode.value}
    # Read back, the run keeps its mode.
    assert (await runtime.get_run(org, run.id)).run_mode is mode


async def test_a_dry_run_still_decides_every_call(runtime: Runtime, org: str) -> None:
    """A call the grant does not allow is refused in a dry run too, not simulated."""
    ran.clear()
    agent = await setup(runtime, org)
    grants = await runtime.governance.list_grants(org)
    await runtime.governance.revoke_grant(org, grants[0].id)
    from cortex_ray.governance import GrantRequest

    await runtime.governance.create_grant(
        org, GrantRequest(principal_id="*", connector="crm", max_tier="read")
    )
    run = await runtime.run_autonomous(org, agent, "x", max_steps=4, run_mode=RunMode.DRY_RUN)
    report = await runtime.governance.run_report(org, run.id)
    assert [(c.tool, c.decision) for c in report.refused] == [("crm_update", "denied")]
    assert report.simulated == ()


async def test_execute_runs_the_write(runtime: Runtime, org: str) -> None:
    ran.clear()
    agent = await setup(runtime, org)
    run = await runtime.run_autonomous(org, agent, "update ann", max_steps=4)
    assert run.run_mode is RunMode.EXECUTE
    assert [t for t, _ in ran] == ["crm_lookup", "crm_update"]


async def test_labels_and_the_acceptance_report(runtime: Runtime, org: str) -> None:
    agent = await setup(runtime, org)
    shadows = [
        await runtime.run_autonomous(org, agent, f"g{i}", max_steps=4, run_mode=RunMode.SHADOW)
        for i in range(3)
    ]
    executed = await runtime.run_autonomous(org, agent, "g", max_steps=4)
    alice = Principal(id="alice", org_id=org)
    robot = Principal(id="agent:x", org_id=org, kind="AGENT")
    await runtime.governance.label_run(org, shadows[0].id, RunLabel.ACCEPTED, principal=alice)
    await runtime.governance.label_run(org, shadows[1].id, RunLabel.REJECTED, principal=alice)
    record = await runtime.governance.label_run(
        org, shadows[1].id, RunLabel.MIXED, note="half right", principal=alice
    )  # a later label replaces the earlier
    assert record.label is RunLabel.MIXED and record.labelled_by == "alice"
    with pytest.raises(InvalidRequestError, match="not shadow"):
        await runtime.governance.label_run(org, executed.id, RunLabel.ACCEPTED, principal=alice)
    with pytest.raises(AccessDeniedError, match="only a person"):
        await runtime.governance.label_run(org, shadows[2].id, RunLabel.ACCEPTED, principal=robot)
    outsider = Principal(id="eve", org_id=f"{org}-x", is_admin=True)
    with pytest.raises(AccessDeniedError):
        await runtime.governance.label_run(
            org, shadows[2].id, RunLabel.ACCEPTED, principal=outsider
        )
    [row] = await runtime.governance.shadow_report(org)
    assert (row.agent_name, row.runs, row.labelled, row.accepted, row.rejected, row.mixed) == (
        "clerk", 3, 2, 1, 0, 1,
    )  # fmt: skip
    assert row.proposals == 3 and row.acceptance_rate == 0.5
    report = await runtime.governance.run_report(org, shadows[1].id)
    assert report.label is not None and report.label.note == "half right"
    assert await runtime.governance.shadow_report(f"{org}-x", principal=outsider) == []


async def test_a_running_shadow_run_cannot_be_labelled(runtime: Runtime, org: str) -> None:
    agent = await setup(runtime, org)
    run = await runtime.start_run(org, agent, "g", run_mode=RunMode.SHADOW)
    with pytest.raises(ConflictError, match="has not ended"):
        await runtime.governance.label_run(org, run.id, RunLabel.ACCEPTED)


async def test_run_modes_over_http(runtime: Runtime, org: str) -> None:
    import asyncio

    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    agent = await setup(runtime, org)
    admin = await runtime.create_api_key(org, "root", admin=True, grant=["*"])
    other = await runtime.create_api_key(f"{org}-x", "eve", admin=True, grant=["*"])
    h = {"Authorization": f"Bearer {admin.key}"}
    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    base = f"/api/orgs/{org}"
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            task = {"agentId": agent, "payload": {"goal": "update ann", "maxSteps": 4}}
            r = await http.post(f"{base}/tasks", headers=h, json={**task, "runMode": "yolo"})
            assert r.status_code == 422 and "runMode" in r.text
            r = await http.post(f"{base}/tasks", headers=h, json={**task, "runMode": "shadow"})
            assert r.status_code == 202, r.text
            task_id = r.json()["id"]
            for _ in range(400):  # the executor drives it in this event loop
                if await runtime.store.run_status(org, uuid_of(task_id)) is not RunStatus.RUNNING:
                    break
                await asyncio.sleep(0.05)
            body = (await http.get(f"{base}/tasks/{task_id}", headers=h)).json()
            assert body["status"] == "COMPLETED" and body["runMode"] == "shadow"
            report = (await http.get(f"{base}/tasks/{task_id}/report", headers=h)).json()
            assert [c["tool"] for c in report["proposed"]] == ["crm_update"]
            assert report["runMode"] == "shadow" and report["label"] is None
            r = await http.post(f"{base}/tasks/{task_id}/label", headers=h, json={"label": "meh"})
            assert r.status_code == 422
            r = await http.post(
                f"{base}/tasks/{task_id}/label", headers=h, json={"label": "accepted"}
            )
            assert r.status_code == 200 and r.json()["labelledBy"] == "root"
            acceptance = (await http.get(f"{base}/shadow/acceptance", headers=h)).json()
            assert acceptance["agents"][0]["acceptanceRate"] == 1.0
            intruder = {"Authorization": f"Bearer {other.key}"}
            for method, path in [
                ("GET", f"/tasks/{task_id}/report"),
                ("POST", f"/tasks/{task_id}/label"),
                ("GET", "/shadow/acceptance"),
            ]:
                r = await http.request(
                    method, base + path, headers=intruder, json={"label": "rejected"}
                )
                assert r.status_code == 404, (path, r.text)
            other_base = f"/api/orgs/{org}-x"
            r = await http.get(f"{other_base}/tasks/{task_id}/report", headers=intruder)
            assert r.status_code == 404
            r = await http.post(
                f"{other_base}/tasks/{task_id}/label", headers=intruder, json={"label": "rejected"}
            )
            assert r.status_code == 404
        labelled = await runtime.governance.run_report(org, uuid_of(task_id))
        assert labelled.label is not None and labelled.label.label is RunLabel.ACCEPTED
    finally:
        await executor.aclose()


def uuid_of(text: str) -> Any:
    import uuid

    return uuid.UUID(text)
