"""Approvals that survive anything (issue 18, point 3), on the real cycle with a scripted
planner: a call whose grant requires approval pauses the run (AWAITING_APPROVAL, a row,
no driver); approved, the run continues from that call without deciding again, the policy
evaluated again; rejected or expired, the agent observes it and decides on; a new runtime
on the same database (the whole stack restarted) carries on from the row."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentMode,
    ConflictError,
    Grant,
    ObservationStatus,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.governance import ApprovalPolicy, ApprovalStatus, GrantRequest
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database
from tests.test_connector_grants import CRM, TOOLS, ran

STEP = re.compile(r"Step (\d+) of (\d+)\.")
decided_at: Counter[int] = Counter()  # how many times each step was decided


def plan(request: ChatRequest) -> str:
    """Step 1 reads, step 2 writes, then it finishes (saying what it saw)."""
    text = "\n".join(m.content or "" for m in request.messages)
    match = STEP.search(text)
    assert match is not None, text
    step = int(match.group(1))
    decided_at[step] += 1
    if step == 1:
        action: dict[str, Any] = {"tool": "crm_lookup", "args": {"name": "ann"}, "rationale": "r"}
    elif step == 2:
        action = {"tool": "crm_update", "args": {"name": "ann", "region": "eu"}, "rationale": "w"}
    else:
        said = "rejected" if "approval rejected" in text or "approval expired" in text else "ok"
        action = {"finish": True, "message": said, "rationale": "done"}
    return json.dumps({"candidates": [action]})


async def open_runtime(db: Database, settings: Settings, **changes: Any) -> Runtime:
    return await Runtime.open(
        settings.model_copy(update={"embedding_backend": "hash", "candidates": 1, **changes}),
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        tools=TOOLS,
        connectors=[CRM],
    )


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await open_runtime(db, settings)
    yield rt
    await rt.close(close_db=False)


ADMIN = "root"


async def paused_run(runtime: Runtime, org: str) -> Any:
    ran.clear()
    decided_at.clear()
    await runtime.store.ensure_org(org)
    await runtime.store.put_principal(Principal(id=ADMIN, org_id=org, is_admin=True))
    await runtime.create_agent(
        org, "clerk", mode=AgentMode.AUTONOMOUS, tools=["crm_lookup", "crm_update"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    await runtime.governance.install_connector(org, "crm")
    await runtime.governance.create_grant(
        org,
        GrantRequest(
            principal_id="*", connector="crm", max_tier="write", approval=ApprovalPolicy.WRITES
        ),
    )
    run = await runtime.run_autonomous(
        org, "clerk", "update ann", max_steps=5, principal=Principal(id="bob", org_id=org)
    )
    return run


async def test_a_call_needing_approval_pauses_the_run_on_a_row(runtime: Runtime, org: str) -> None:
    run = await paused_run(runtime, org)
    assert run.status is RunStatus.AWAITING_APPROVAL
    assert ran == [("crm_lookup", {"name": "ann"})]  # the write did not run
    stored = await runtime.get_run(org, run.id)
    assert stored.status is RunStatus.AWAITING_APPROVAL and len(stored.steps) == 1
    [request] = await runtime.governance.list_approvals(org, status=ApprovalStatus.PENDING)
    assert (request.run_id, request.step_index, request.tool, request.tier) == (
        run.id, 1, "crm_update", "write",
    )  # fmt: skip
    assert request.args == {"name": "ann", "region": "eu"}
    assert request.decision["candidates"][0]["tool"] == "crm_update"  # what chose it
    assert request.evidence[0]["tool"] == "crm_lookup"  # what it had seen
    assert request.requested_by == "bob"
    # No driver holds it: the lease is free, and a sweep for orphans does not pick it up.
    holder = await runtime.run_lease(org, run.id)
    assert holder.owner is None
    assert run.id not in {o.run_id for o in await runtime.orphaned_runs()}
    # Driving it now changes nothing: it waits for a person.
    again = await runtime.drive_run(org, run.id)
    assert again.status is RunStatus.AWAITING_APPROVAL and decided_at[2] == 1
    rows = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
    assert [(r["tool"], r["decision"]) for r in rows] == [
        ("crm_lookup", "allowed"),
        ("crm_update", "approval_required"),
    ]


async def test_approved_the_run_continues_from_the_call_after_a_restart(
    runtime: Runtime, db: Database, settings: Settings, org: str
) -> None:
    run = await paused_run(runtime, org)
    [request] = await runtime.governance.list_approvals(org)
    await runtime.close(close_db=False)  # the whole stack goes away; the row stays
    fresh = await open_runtime(db, settings)
    try:
        admin = Principal(id=ADMIN, org_id=org, is_admin=True)
        decided = await fresh.governance.decide_approval(
            org, request.id, approve=True, note="fine", principal=admin
        )
        assert decided.status is ApprovalStatus.APPROVED and decided.decided_by == ADMIN
        assert (await fresh.store.run_status(org, run.id)) is RunStatus.RUNNING
        final = await fresh.drive_run(org, run.id)
        assert final.status is RunStatus.COMPLETED and final.result == "ok"
        assert decided_at[2] == 1  # step 2 was not decided again
        assert [t for t, _ in ran] == ["crm_lookup", "crm_update"]  # the write ran once
        steps = (await fresh.get_run(org, run.id)).steps
        assert steps[1].observation is not None
        assert steps[1].observation.status is ObservationStatus.OK
        with pytest.raises(ConflictError, match="already APPROVED"):
            await fresh.governance.decide_approval(org, request.id, approve=False, principal=admin)
    finally:
        await fresh.close(close_db=False)


async def test_the_policy_is_evaluated_again_on_approval(runtime: Runtime, org: str) -> None:
    run = await paused_run(runtime, org)
    [request] = await runtime.governance.list_approvals(org)
    [grant] = await runtime.governance.list_grants(org)
    await runtime.governance.revoke_grant(org, grant.id)  # revoked while it waited
    await runtime.governance.decide_approval(org, request.id, approve=True)
    final = await runtime.drive_run(org, run.id)
    assert [t for t, _ in ran] == ["crm_lookup"]  # denied now: never ran
    step = final.steps[1]
    assert step.observation is not None and "has no grant" in step.observation.summary


@pytest.mark.parametrize("how", ["rejected", "expired"])
async def test_a_rejection_or_expiry_is_observed_and_the_agent_decides_on(
    db: Database, settings: Settings, org: str, how: str
) -> None:
    ttl = {"approval_ttl_s": 0.001} if how == "expired" else {}
    runtime = await open_runtime(db, settings, **ttl)
    try:
        run = await paused_run(runtime, org)
        [request] = await runtime.governance.list_approvals(org)
        if how == "rejected":
            await runtime.governance.decide_approval(
                org, request.id, approve=False, note="not today"
            )
        else:
            expired = await runtime.governance.expire_approvals()
            assert request.id in {a.id for a in expired}
        final = await runtime.drive_run(org, run.id)
        assert final.status is RunStatus.COMPLETED and final.result == "rejected"
        assert [t for t, _ in ran] == ["crm_lookup"]
        observed = final.steps[1].observation
        assert observed is not None and observed.status is ObservationStatus.REFUSED
        assert ("not today" if how == "rejected" else "approval expired") in observed.summary
        rows = await runtime.store.audit_rows(org, run_id=run.id, gate_only=True)
        assert [(r["tool"], r["decision"]) for r in rows] == [
            ("crm_lookup", "allowed"),
            ("crm_update", "approval_required"),
            ("crm_update", "rejected"),
        ]
    finally:
        await runtime.close(close_db=False)


async def test_who_may_decide(db: Database, settings: Settings, org: str) -> None:
    runtime = await open_runtime(db, settings, approval_excludes_requester=True)
    try:
        await paused_run(runtime, org)
        [request] = await runtime.governance.list_approvals(org)
        member = Principal(id="carol", org_id=org)
        robot = Principal(id="agent:x", org_id=org, kind="AGENT", is_admin=True)
        bob = Principal(id="bob", org_id=org, is_admin=True)  # the run's requester
        outsider = Principal(id="eve", org_id=f"{org}-x", is_admin=True)
        for who, why in [
            (member, "only an admin"),
            (robot, "only a person"),
            (bob, "requester may not approve"),
            (outsider, "another organisation"),
        ]:
            with pytest.raises(AccessDeniedError, match=why):
                await runtime.governance.decide_approval(
                    org, request.id, approve=True, principal=who
                )
        assert (await runtime.governance.get_approval(org, request.id)).status is (
            ApprovalStatus.PENDING
        )
        assert await runtime.governance.list_approvals(f"{org}-x", principal=outsider) == []
    finally:
        await runtime.close(close_db=False)


async def test_shadow_runs_never_ask_for_approval(runtime: Runtime, org: str) -> None:
    await paused_run(runtime, org)
    ran.clear()
    run = await runtime.run_autonomous(org, "clerk", "x", max_steps=5, run_mode=RunMode.SHADOW)
    assert run.status is RunStatus.COMPLETED
    assert ran == [("crm_lookup", {"name": "ann"})]
    assert await runtime.governance.list_approvals(org, run_id=run.id) == []


async def test_approvals_over_http(runtime: Runtime, org: str) -> None:
    import asyncio

    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    await paused_run(runtime, org)  # the agent, connector and grant; one run paused already
    ran.clear()
    decided_at.clear()
    admin = await runtime.create_api_key(org, ADMIN, admin=True, grant=["*"])
    member = await runtime.create_api_key(org, "bob", admin=False, grant=["*"])
    intruder = await runtime.create_api_key(f"{org}-x", "eve", admin=True, grant=["*"])
    a, m, x = ({"Authorization": f"Bearer {k.key}"} for k in (admin, member, intruder))
    executor = InProcessExecutor(runtime)
    base = f"/api/orgs/{org}"

    async def settled(task_id: str) -> dict[str, Any]:
        for _ in range(400):  # driven by the executor in this event loop
            body = (await http.get(f"{base}/tasks/{task_id}", headers=a)).json()
            if body["status"] != "RUNNING":
                return dict(body)
            await asyncio.sleep(0.05)
        raise AssertionError("the run never left RUNNING")

    try:
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            task = {"agentId": "clerk", "payload": {"goal": "update ann", "maxSteps": 5}}
            r = await http.post(f"{base}/tasks", headers=m, json=task)
            task_id = r.json()["id"]
            assert (await settled(task_id))["status"] == "AWAITING_APPROVAL"
            r = await http.get(f"{base}/approvals", headers=m, params={"runId": task_id})
            [request] = r.json()["approvals"]
            assert request["status"] == "PENDING" and request["tool"] == "crm_update"
            assert request["decision"]["candidates"][0]["args"] == {"name": "ann", "region": "eu"}
            url = f"{base}/approvals/{request['id']}"
            assert (await http.get(url, headers=m)).json()["id"] == request["id"]
            r = await http.post(f"{url}/decision", headers=m, json={"approve": True})
            assert r.status_code == 403 and "only an admin" in r.json()["error"]["message"]
            r = await http.post(f"{url}/decision", headers=a, json={"approve": "maybe"})
            assert r.status_code == 422
            for method, path in [("GET", url), ("POST", f"{url}/decision")]:
                r = await http.request(method, path, headers=x, json={"approve": True})
                assert r.status_code == 404
            r = await http.get(f"/api/orgs/{org}-x/approvals/{request['id']}", headers=x)
            assert r.status_code == 404
            r = await http.post(f"{url}/decision", headers=a, json={"approve": True, "note": "ok"})
            assert r.status_code == 200 and r.json()["decidedBy"] == ADMIN
            done = await settled(task_id)
            assert done["status"] == "COMPLETED" and done["result"] == "ok"
            assert [t for t, _ in ran] == ["crm_lookup", "crm_update"] and decided_at[2] == 1
            r = await http.post(f"{url}/decision", headers=a, json={"approve": False})
            assert r.status_code == 409 and "already APPROVED" in r.json()["error"]["message"]
    finally:
        await executor.aclose()


async def test_cancelling_a_run_awaiting_approval_cancels_its_request(
    runtime: Runtime, org: str
) -> None:
    run = await paused_run(runtime, org)
    [request] = await runtime.governance.list_approvals(org)
    bob = Principal(id="bob", org_id=org, is_admin=True)
    cancelled = await runtime.cancel_run(org, run.id, principal=bob, reason="not needed")
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.reason == "cancelled by bob: not needed"
    gone = await runtime.governance.get_approval(org, request.id)
    assert gone.status is ApprovalStatus.CANCELLED and "not needed" in gone.note
    # Nobody can decide it any more, and the run stays ended: the write never runs.
    with pytest.raises(ConflictError, match="already CANCELLED"):
        await runtime.governance.decide_approval(org, request.id, approve=True)
    assert (await runtime.drive_run(org, run.id)).status is RunStatus.CANCELLED
    assert ran == [("crm_lookup", {"name": "ann"})]
    again = await runtime.cancel_run(org, run.id, principal=bob)
    assert again.reason == "cancelled by bob: not needed"  # nothing changed
