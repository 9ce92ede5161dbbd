"""Approvals in interactive turns (issue 18, point 3): a turn whose tool call needs approval
records a request tied to its session, turn and round, streams ``approval_required``, waits
for the decision (made by another principal, through the use case or the HTTP API) and
continues: approved, the call goes through the gate again and runs once; rejected or
expired, the agent observes the refusal and replies. A turn recovered after its driver went
away finds its round's request again instead of asking twice.

The real cycle, the real gate and connector policy, the embedded PostgreSQL; a scripted
chat model that calls ``crm_update`` once, then replies with what it observed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentMode,
    ConflictError,
    Grant,
    Principal,
    Runtime,
    Settings,
    TurnEvent,
    TurnEventKind,
)
from cortex_ray.governance import Approval, ApprovalPolicy, ApprovalStatus, GrantRequest
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, ChatResponse, HashEmbedder, ScriptedModelClient, ToolCall
from cortex_ray.storage import Database
from tests.test_connector_grants import CRM, TOOLS, ran

ADMIN = "root"
CALLER = "bob"
decided: list[str] = []  # each tool-call decision the model made


def chat(request: ChatRequest) -> str | ChatResponse:
    """Calls crm_update in the first round; then replies saying what the call observed."""
    props = (request.response_schema or {}).get("properties", {})
    if "importance" in props:
        return json.dumps({"importance": 5})
    if "facts" in props:
        return json.dumps({"facts": []})
    users = [m.content or "" for m in request.messages if m.role == "user"]
    text = "\n".join(m.content or "" for m in request.messages)
    if request.tools and not (users and users[-1].startswith("Progress so far")):
        decided.append("crm_update")
        args = json.dumps({"name": "ann", "region": "eu"})
        return ChatResponse(tool_calls=(ToolCall(id="c1", name="crm_update", arguments=args),))
    if "not today" in text or "approval expired" in text:
        return "the change was refused"
    return "updated ann"


async def open_runtime(db: Database, settings: Settings, **changes: Any) -> Runtime:
    return await Runtime.open(
        settings.model_copy(
            update={"embedding_backend": "hash", "approval_poll_s": 0.05, **changes}
        ),
        model=ScriptedModelClient(responder=chat),
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


def caller(org: str) -> Principal:
    return Principal(id=CALLER, org_id=org, grant=Grant(tools=frozenset({"*"})))


def admin(org: str) -> Principal:
    return Principal(id=ADMIN, org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))


async def world(runtime: Runtime, org: str) -> Any:
    """An INTERACTIVE clerk whose crm writes need approval, and a session of bob's."""
    ran.clear()
    decided.clear()
    await runtime.store.ensure_org(org)
    await runtime.store.put_principal(admin(org))
    await runtime.create_agent(
        org, "clerk", mode=AgentMode.INTERACTIVE, tools=["crm_lookup", "crm_update", "reply"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    await runtime.governance.install_connector(org, "crm")
    await runtime.governance.create_grant(
        org,
        GrantRequest(
            principal_id="*", connector="crm", max_tier="write", approval=ApprovalPolicy.WRITES
        ),
    )
    return await runtime.open_session(org, "clerk", caller(org))


async def pending(runtime: Runtime, org: str) -> Approval:
    """The one pending request, once the turn has made it."""
    for _ in range(400):
        found = await runtime.governance.list_approvals(org, status=ApprovalStatus.PENDING)
        if found:
            [request] = found
            return request
        await asyncio.sleep(0.02)
    raise AssertionError("no approval request was made")


@pytest.mark.parametrize("how", ["approved", "rejected"])
async def test_a_turn_waits_for_the_decision_then_continues(
    runtime: Runtime, org: str, how: str
) -> None:
    session = await world(runtime, org)
    events: list[TurnEvent] = []
    turn = asyncio.ensure_future(
        runtime.run_turn(session, caller(org), "move ann to eu", on_event=events.append)
    )
    request = await pending(runtime, org)
    assert (request.session_id, request.step_index) == (session.id, 0)
    assert request.run_id is None and request.turn_id is not None
    assert (request.tool, request.args, request.requested_by) == (
        "crm_update", {"name": "ann", "region": "eu"}, CALLER,
    )  # fmt: skip
    await asyncio.sleep(0.2)
    assert not turn.done() and ran == []  # waiting: the write has not run
    asked = [e for e in events if e.kind is TurnEventKind.APPROVAL_REQUIRED]
    assert [(e.approval_id, e.tool, e.expires_at) for e in asked] == [
        (request.id, "crm_update", request.expires_at)
    ]
    assert asked[0].approvers == ()  # any admin person
    # The person in the conversation may not decide it; an admin, another principal, may.
    with pytest.raises(AccessDeniedError, match="only an admin"):
        await runtime.governance.decide_approval(
            org, request.id, approve=True, principal=caller(org)
        )
    await runtime.governance.decide_approval(
        org, request.id, approve=how == "approved", note="not today", principal=admin(org)
    )
    result = await asyncio.wait_for(turn, 30)
    kinds = [e.kind for e in events]
    assert kinds == [
        TurnEventKind.TOOL_CALL,
        TurnEventKind.APPROVAL_REQUIRED,
        TurnEventKind.OBSERVATION,
        TurnEventKind.REPLY,
    ]
    observed = events[2].observation
    assert observed is not None
    if how == "approved":
        assert ran == [("crm_update", {"name": "ann", "region": "eu"})]  # once
        assert observed.status.value == "OK" and result.reply == "updated ann"
    else:
        assert ran == []
        assert observed.status.value == "REFUSED" and "not today" in observed.summary
        assert result.reply == "the change was refused"
    assert decided == ["crm_update"]  # the model decided the call once
    rows = await runtime.store.audit_rows(org, gate_only=True)
    gate = [(r["tool"], r["decision"]) for r in rows if r["tool"] == "crm_update"]
    assert gate == [
        ("crm_update", "approval_required"),
        ("crm_update", "allowed" if how == "approved" else "rejected"),
    ]
    with pytest.raises(ConflictError, match="already"):
        await runtime.governance.decide_approval(
            org, request.id, approve=True, principal=admin(org)
        )


async def test_an_expired_request_is_a_refusal(db: Database, settings: Settings, org: str) -> None:
    runtime = await open_runtime(db, settings, approval_ttl_s=0.3)
    try:
        session = await world(runtime, org)
        result = await asyncio.wait_for(
            runtime.run_turn(session, caller(org), "move ann to eu"), 30
        )
        assert ran == [] and result.reply == "the change was refused"
        [request] = await runtime.governance.list_approvals(org)
        assert request.status is ApprovalStatus.EXPIRED
        assert "approval expired" in result.observations[0].summary
    finally:
        await runtime.close(close_db=False)


async def test_a_recovered_turn_finds_its_request_again(runtime: Runtime, org: str) -> None:
    session = await world(runtime, org)
    first = asyncio.ensure_future(runtime.run_turn(session, caller(org), "move ann to eu"))
    request = await pending(runtime, org)
    first.cancel()  # the driver goes away while the turn waits (its lease released)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert request.turn_id is not None
    events: list[TurnEvent] = []
    again = asyncio.ensure_future(
        runtime.recover_turn(org, session.id, request.turn_id, on_event=events.append)
    )
    for _ in range(400):
        if any(e.kind is TurnEventKind.APPROVAL_REQUIRED for e in events):
            break
        await asyncio.sleep(0.02)
    [asked] = [e for e in events if e.kind is TurnEventKind.APPROVAL_REQUIRED]
    assert asked.approval_id == request.id  # the same request, not a second one
    await runtime.governance.decide_approval(org, request.id, approve=True, principal=admin(org))
    result = await asyncio.wait_for(again, 30)
    assert result.reply == "updated ann"
    assert ran == [("crm_update", {"name": "ann", "region": "eu"})]
    assert decided == ["crm_update"]  # the recovered turn carried out the recorded call
    assert [a.id for a in await runtime.governance.list_approvals(org)] == [request.id]


async def test_a_turn_streams_approval_required_over_http(runtime: Runtime, org: str) -> None:
    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    session = await world(runtime, org)
    member = await runtime.create_api_key(org, CALLER, admin=False, grant=["*"])
    root = await runtime.create_api_key(org, ADMIN, admin=True, grant=["*"])
    m, a = ({"Authorization": f"Bearer {k.key}"} for k in (member, root))
    executor = InProcessExecutor(runtime)
    base = f"/api/orgs/{org}"
    try:
        transport = httpx2.ASGITransport(app=create_app(runtime, executor))
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:

            async def approve_when_asked() -> dict[str, Any]:
                # Another principal (an admin) decides through the approval routes.
                for _ in range(400):
                    r = await http.get(f"{base}/approvals", headers=a, params={"status": "PENDING"})
                    if found := r.json()["approvals"]:
                        [request] = found
                        url = f"{base}/approvals/{request['id']}/decision"
                        mine = await http.post(url, headers=m, json={"approve": True})
                        assert mine.status_code == 403
                        r = await http.post(url, headers=a, json={"approve": True})
                        assert r.status_code == 200, r.text
                        return dict(r.json())
                    await asyncio.sleep(0.02)
                raise AssertionError("no approval request was made")

            async def converse() -> list[tuple[str, Any]]:
                url = f"{base}/sessions/{session.id}/messages"
                body = {"message": "move ann to eu"}
                async with http.stream("POST", url, headers=m, json=body) as r:
                    assert r.status_code == 200
                    return [(e.event, e.json()) async for e in httpx2.EventSource(r)]

            events, decided_body = await asyncio.wait_for(
                asyncio.gather(converse(), approve_when_asked()), 60
            )
        names = [name for name, _ in events]
        assert names == [
            "started", "tool_call", "approval_required", "observation", "reply", "done",
        ]  # fmt: skip
        asked = events[2][1]
        assert asked["approvalId"] == decided_body["id"] and asked["tool"] == "crm_update"
        assert asked["args"] == {"name": "ann", "region": "eu"} and asked["approvers"] == []
        assert asked["expiresAt"] and "requires approval" in asked["reason"]
        assert decided_body["runId"] is None and decided_body["sessionId"] == str(session.id)
        assert events[3][1]["status"] == "OK" and events[4][1]["message"] == "updated ann"
        assert ran == [("crm_update", {"name": "ann", "region": "eu"})]
    finally:
        await executor.aclose()


async def test_the_migration_goes_both_ways(
    scratch_database: Callable[[str], AbstractAsyncContextManager[str]],
) -> None:
    """0019 up: a turn's request fits; one with a turn but no session, or with neither a run
    nor a turn, does not; down: turn requests go; up again."""
    import psycopg

    from cortex_ray.storage._database import _alembic

    turn_row = (
        "INSERT INTO approvals (org_id, id, session_id, turn_id, step_index, tool, args, tier, "
        "requested_by, expires_at) VALUES ('o', gen_random_uuid(), gen_random_uuid(), "
        "gen_random_uuid(), 0, 't', '{}', 'write', 'bob', now())"
    )
    async with scratch_database("turn_approvals_migration") as dsn:
        await asyncio.to_thread(_alembic, dsn, "upgrade", "0019")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(turn_row)
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(turn_row.replace("gen_random_uuid(), 0,", "NULL, 0,"))
            with pytest.raises(psycopg.errors.CheckViolation):  # neither a run nor a turn
                await conn.execute(
                    "INSERT INTO approvals (org_id, id, step_index, tool, args, tier, "
                    "requested_by, expires_at) VALUES ('o', gen_random_uuid(), 0, 't', '{}', "
                    "'write', 'bob', now())"
                )
        await asyncio.to_thread(_alembic, dsn, "downgrade", "0018")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            left = await (await conn.execute("SELECT count(*) FROM approvals")).fetchone()
            assert left == (0,)
        await asyncio.to_thread(_alembic, dsn, "upgrade", "0019")
