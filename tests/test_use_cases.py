"""The core is the one door: every use case decides access and leaves an audit row.

Each ``UseCase`` is called here as a principal without the right to it: the core refuses it
(``AccessDeniedError``) and the audit log gets a REFUSED row with the use case's name and
action category. Then the same refusals through HTTP (the in-process ASGI app), where the
route only parses and calls: the status is 403 and the audit row is the core's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx2
import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentChanges,
    AgentMode,
    Grant,
    InProcessExecutor,
    Principal,
    PrincipalKind,
    Runtime,
    Settings,
)
from cortex_ray._types import DecisionKind, MemorySnapshot, RunStatus, WorkingMemory
from cortex_ray.access import UseCase
from cortex_ray.evals import Cassette, EvalCase, EvalSuite, RecordedStep, SameDecisions
from cortex_ray.governance import GrantRequest, RunLabel
from cortex_ray.graph import Triple
from cortex_ray.mcp import McpServerConfig, McpTransport
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder
from cortex_ray.storage import Database

EVERYTHING = Grant(tools=frozenset({"*"}))


@pytest.fixture
async def runtime(settings: Settings, db: Database) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings,
        model=None,
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
    )
    yield rt
    await rt.close()


@dataclass
class World:
    """One organisation with an admin, a member without rights, an outsider (an admin of
    another organisation), agents, a run, a session of someone else, a proposal, a key."""

    org: str
    admin: Principal
    member: Principal
    outsider: Principal
    helper: UUID  # INTERACTIVE
    worker: UUID  # AUTONOMOUS
    run_id: UUID
    session_id: UUID  # belongs to carol, not to the member
    proposal_id: UUID
    key_id: UUID


@pytest.fixture
async def world(runtime: Runtime, org: str) -> World:
    admin = Principal(id="root", org_id=org, is_admin=True, grant=EVERYTHING)
    await runtime.store.put_principal(admin)
    member = Principal(id="ada", org_id=org, grant=Grant(tools=frozenset({"current_time"})))
    outsider = Principal(id="eve", org_id=f"{org}-other", is_admin=True, grant=EVERYTHING)
    carol = Principal(id="carol", org_id=org, grant=EVERYTHING)
    helper = await runtime.create_agent(org, "helper", principal=admin)
    worker = await runtime.create_agent(
        org, "worker", mode=AgentMode.AUTONOMOUS, tools=["current_time", "knowledge_search"]
    )
    run = await runtime.start_run(org, worker.id, "read the clock", principal=admin)
    session = await runtime.open_session(org, helper.id, carol)
    proposal = await runtime.memory.propose_edit(
        org_id=org,
        agent_id=helper.id,
        field="persona",
        value="You are terse.",
        rationale="shorter answers",
        proposed_by=helper.principal(),
    )
    created = await runtime.create_api_key(org, "svc", kind=PrincipalKind.SERVICE)
    return World(
        org, admin, member, outsider, helper.id, worker.id, run.id, session.id, proposal.id,
        created.key_id,
    )  # fmt: skip


Call = Callable[[Runtime, World], Awaitable[Any]]


def tiny_suite() -> EvalSuite:
    """A valid one-case suite (a run that finished at its first step)."""
    wm = WorkingMemory(
        mode=AgentMode.AUTONOMOUS,
        agent_name="worker",
        persona="",
        objective="read the clock",
        snapshot=MemorySnapshot(query="read the clock"),
    )
    step = RecordedStep(step_index=0, wm=wm, decision=DecisionKind.FINISH, message="done")
    cassette = Cassette(
        objective="read the clock", max_steps=2, status=RunStatus.COMPLETED, steps=(step,)
    )
    case = EvalCase(name="tiny", cassette=cassette, checks=(SameDecisions(),))
    return EvalSuite(name="tiny", cases=(case,))


# Each use case, called by someone without the right: (who, call).
REFUSALS: dict[UseCase, tuple[str, Call]] = {
    UseCase.AGENTS_LIST: ("outsider", lambda r, w: r.list_agents(w.org, principal=w.outsider)),
    UseCase.AGENTS_GET: (
        "outsider",
        lambda r, w: r.get_agent(w.org, w.helper, principal=w.outsider),
    ),
    UseCase.AGENTS_CREATE: (
        "member",
        lambda r, w: r.create_agent(w.org, "sneaky", principal=w.member),
    ),
    UseCase.AGENTS_UPDATE: (
        "member",
        lambda r, w: r.update_agent(
            w.org, w.helper, AgentChanges(persona="pwned"), principal=w.member
        ),
    ),
    UseCase.TASKS_SUBMIT: (
        "outsider",
        lambda r, w: r.start_run(w.org, w.worker, "do it", principal=w.outsider),
    ),
    UseCase.TASKS_RESUME: (
        "outsider",
        lambda r, w: r.resume_run(w.org, w.run_id, principal=w.outsider),
    ),
    UseCase.TASKS_CANCEL: (
        "member",  # not the person the run acts for, nor an admin
        lambda r, w: r.cancel_run(w.org, w.run_id, principal=w.member),
    ),
    UseCase.TASKS_LIST: ("outsider", lambda r, w: r.list_runs(w.org, principal=w.outsider)),
    UseCase.TASKS_GET: ("outsider", lambda r, w: r.get_run(w.org, w.run_id, principal=w.outsider)),
    UseCase.SESSIONS_OPEN: ("outsider", lambda r, w: r.open_session(w.org, w.helper, w.outsider)),
    UseCase.SESSIONS_READ: (
        "member",
        lambda r, w: r.conversation(w.org, w.session_id, principal=w.member),
    ),
    UseCase.SESSIONS_MESSAGE: (
        "member",
        lambda r, w: r.authorize_turn(w.org, w.session_id, w.member),
    ),
    UseCase.SESSIONS_END: (
        "member",
        lambda r, w: r.authorize_end_session(w.org, w.session_id, principal=w.member),
    ),
    UseCase.TOOLS_LIST: ("outsider", lambda r, w: r.list_tools(w.org, principal=w.outsider)),
    UseCase.MEMORY_SEARCH: (
        "member",
        lambda r, w: r.search_memory(w.org, w.helper, "anything", principal=w.member),
    ),
    UseCase.KNOWLEDGE_SEARCH: (
        "member",
        lambda r, w: r.search_knowledge(w.org, "install", principal=w.member),
    ),
    UseCase.API_KEYS_CREATE: (
        "member",
        lambda r, w: r.create_api_key(w.org, "ada", admin=True, principal=w.member),
    ),
    UseCase.API_KEYS_REVOKE: (
        "member",
        lambda r, w: r.revoke_api_key(w.org, w.key_id, principal=w.member),
    ),
    UseCase.PROPOSALS_LIST: (
        "outsider",
        lambda r, w: r.list_proposals(w.org, w.helper, principal=w.outsider),
    ),
    UseCase.PROPOSALS_DECIDE: (
        "member",
        lambda r, w: r.decide_proposal(w.org, w.proposal_id, approve=True, principal=w.member),
    ),
    UseCase.EVALS_READ: ("outsider", lambda r, w: r.list_eval_suites(w.org, principal=w.outsider)),
    UseCase.EVALS_WRITE: (
        "outsider",
        lambda r, w: r.save_eval_suite(w.org, tiny_suite(), principal=w.outsider),
    ),
    UseCase.EVALS_RUN: (
        "outsider",
        lambda r, w: r.run_eval_suite(w.org, "tiny", principal=w.outsider),
    ),
    # governance (issue 18): the tenant's administration
    UseCase.CONNECTORS_LIST: (
        "outsider",
        lambda r, w: r.governance.list_connectors(w.org, principal=w.outsider),
    ),
    UseCase.CONNECTORS_INSTALL: (
        "member",
        lambda r, w: r.governance.install_connector(w.org, "crm", principal=w.member),
    ),
    UseCase.CONNECTORS_CHECK: (
        "member",
        lambda r, w: r.governance.check_connector(w.org, "crm", principal=w.member),
    ),
    UseCase.GRANTS_LIST: (
        "member",
        lambda r, w: r.governance.list_grants(w.org, principal=w.member),
    ),
    UseCase.GRANTS_CREATE: (
        "member",
        lambda r, w: r.governance.create_grant(
            w.org, GrantRequest(principal_id="ada", connector="crm"), principal=w.member
        ),
    ),
    UseCase.GRANTS_REVOKE: (
        "member",
        lambda r, w: r.governance.revoke_grant(w.org, uuid.uuid4(), principal=w.member),
    ),
    UseCase.AUDIT_READ: ("member", lambda r, w: r.governance.audit(w.org, principal=w.member)),
    # MCP servers as connectors (issue 31): admins only
    UseCase.MCP_LIST: ("member", lambda r, w: r.connectors.list_mcp(w.org, principal=w.member)),
    UseCase.MCP_REGISTER: (
        "member",
        lambda r, w: r.connectors.register_mcp(
            w.org,
            "crm",
            McpServerConfig(transport=McpTransport.HTTP, url="https://mcp.example.com/"),
            principal=w.member,
        ),
    ),
    UseCase.MCP_REFRESH: (
        "member",
        lambda r, w: r.connectors.refresh_mcp(w.org, "crm", principal=w.member),
    ),
    UseCase.MCP_APPROVE: (
        "member",
        lambda r, w: r.connectors.approve_mcp_tool(w.org, "crm", "x", principal=w.member),
    ),
    UseCase.MCP_CONFIGURE: (
        "member",
        lambda r, w: r.connectors.set_mcp_tier(w.org, "crm", "x", None, principal=w.member),
    ),
    UseCase.MCP_REMOVE: (
        "member",
        lambda r, w: r.connectors.remove_mcp(w.org, "crm", principal=w.member),
    ),
    UseCase.MCP_OWN_CREDENTIAL: (
        "outsider",
        lambda r, w: r.connectors.set_own_credential(
            w.org, "crm", "crm_token", "x", principal=w.outsider
        ),
    ),
    UseCase.APPROVALS_LIST: (
        "outsider",
        lambda r, w: r.governance.list_approvals(w.org, principal=w.outsider),
    ),
    UseCase.APPROVALS_DECIDE: (
        "outsider",
        lambda r, w: r.governance.decide_approval(
            w.org, uuid.uuid4(), approve=True, principal=w.outsider
        ),
    ),
    UseCase.SECRETS_LIST: (
        "member",
        lambda r, w: r.governance.list_secrets(w.org, principal=w.member),
    ),
    UseCase.SECRETS_PUT: (
        "member",
        lambda r, w: r.governance.put_secret(w.org, "k", "v", principal=w.member),
    ),
    UseCase.SECRETS_DELETE: (
        "member",
        lambda r, w: r.governance.delete_secret(w.org, "k", principal=w.member),
    ),
    UseCase.SCHEDULES_LIST: (
        "outsider",
        lambda r, w: r.governance.list_schedules(w.org, principal=w.outsider),
    ),
    UseCase.SCHEDULES_CREATE: (
        "outsider",
        lambda r, w: r.governance.create_schedule(
            w.org, w.worker, "g", interval_s=60, principal=w.outsider
        ),
    ),
    UseCase.SCHEDULES_CHANGE: (
        "outsider",
        lambda r, w: r.governance.change_schedule(
            w.org, uuid.uuid4(), "cancel", principal=w.outsider
        ),
    ),
    UseCase.TASKS_LABEL: (
        "outsider",
        lambda r, w: r.governance.label_run(
            w.org, w.run_id, RunLabel.ACCEPTED, principal=w.outsider
        ),
    ),
    # workflows (tests/test_workflows.py)
    UseCase.WORKFLOWS_LIST: (
        "outsider",
        lambda r, w: r.workflows.list_workflows(w.org, principal=w.outsider),
    ),
    UseCase.WORKFLOWS_DEFINE: (
        "member",
        lambda r, w: r.workflows.create(w.org, "triage", principal=w.member),
    ),
    # the context graph and source health (tests/test_graph_search.py, test_source_health.py)
    UseCase.GRAPH_SEARCH: (
        "member",
        lambda r, w: r.search_graph(w.org, terms=["x"], principal=w.member),
    ),
    UseCase.GRAPH_SUBMIT: (
        "member",
        lambda r, w: r.submit_triples(
            w.org,
            [Triple(subject_type="a", subject="b", predicate="c", object_type="d", object="e")],
            principal=w.member,
        ),
    ),
    UseCase.COLLECTION_READERS: (
        "member",
        lambda r, w: r.set_collection_readers(w.org, "docs", [], principal=w.member),
    ),
    UseCase.SOURCES_POLICY: (
        "member",
        lambda r, w: r.set_freshness_policy(w.org, "docs", 60, principal=w.member),
    ),
    UseCase.SOURCES_CHECK: (
        "member",
        lambda r, w: r.check_source_health(w.org, "docs", principal=w.member),
    ),
    UseCase.SOURCES_HEALTH: (
        "outsider",
        lambda r, w: r.source_health(w.org, "docs", principal=w.outsider),
    ),
}


def test_every_use_case_has_a_refusal_case() -> None:
    assert set(REFUSALS) == set(UseCase)


@pytest.mark.parametrize("use_case", list(REFUSALS), ids=lambda u: u.label)
async def test_a_use_case_without_the_right_is_refused_and_audited(
    runtime: Runtime, world: World, use_case: UseCase
) -> None:
    who, call = REFUSALS[use_case]
    principal: Principal = getattr(world, who)
    before = await runtime.store.audit_rows(world.org)
    agent_before = await runtime.store.get_agent(world.org, world.helper)
    with pytest.raises(AccessDeniedError):
        await call(runtime, world)
    rows = (await runtime.store.audit_rows(world.org))[len(before) :]
    assert [(r["tool"], r["status"], r["action_type"], r["principal_id"]) for r in rows] == [
        (use_case.label, "REFUSED", use_case.category.value, principal.id)
    ]
    assert rows[0]["reason"]
    # Nothing changed: the agent, its proposal, the key, the run.
    assert await runtime.store.get_agent(world.org, world.helper) == agent_before
    _, proposals = await runtime.list_proposals(world.org, world.helper)
    assert [p.status.value for p in proposals] == ["PENDING"]
    assert (await runtime.store.run_status(world.org, world.run_id)).value == "RUNNING"


async def test_allowed_writes_are_audited_with_their_category(
    runtime: Runtime, world: World
) -> None:
    rows = await runtime.store.audit_rows(world.org)
    labels = [(r["tool"], r["status"], r["action_type"], r["principal_id"]) for r in rows]
    assert ("agents.create", "OK", "LEARNING", "root") in labels
    assert ("agents.create", "OK", "LEARNING", "operator") in labels  # no principal given
    assert ("tasks.submit", "OK", "GROUNDING", "root") in labels
    assert ("sessions.open", "OK", "GROUNDING", "carol") in labels
    assert ("api_keys.create", "OK", "GROUNDING", "operator") in labels
    submitted = next(r for r in rows if r["tool"] == "tasks.submit")
    assert submitted["run_id"] == world.run_id
    # Metadata reads are not audited when allowed (a long poll would write a row a poll).
    await runtime.get_run(world.org, world.run_id, principal=world.admin)
    assert len(await runtime.store.audit_rows(world.org)) == len(rows)


async def test_an_admin_approves_a_proposal_through_the_core(
    runtime: Runtime, world: World
) -> None:
    decided = await runtime.decide_proposal(
        world.org, world.proposal_id, approve=True, principal=world.admin
    )
    assert decided.status.value == "APPROVED" and decided.decided_by == "root"
    agent = await runtime.get_agent(world.org, world.helper, principal=world.member)
    assert agent.persona == "You are terse."


# --- the same refusals through HTTP -------------------------------------------------------


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[httpx2.AsyncClient]:
    from serve import create_app

    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    async with httpx2.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    await executor.aclose()


async def _key(runtime: Runtime, principal: Principal) -> dict[str, str]:
    created = await runtime.create_api_key(
        principal.org_id,
        principal.id,
        admin=principal.is_admin,
        grant=sorted(principal.grant.tools) if principal.grant else None,
    )
    return {"Authorization": f"Bearer {created.key}"}


async def test_http_refusals_are_the_cores(
    runtime: Runtime, world: World, http: httpx2.AsyncClient
) -> None:
    member = await _key(runtime, world.member)
    base = f"/api/orgs/{world.org}"
    requests: list[tuple[UseCase, str, str, dict[str, Any] | None]] = [
        (UseCase.AGENTS_CREATE, "POST", "/agents", {"name": "sneaky"}),
        (UseCase.AGENTS_UPDATE, "PATCH", f"/agents/{world.helper}", {"persona": "pwned"}),
        (UseCase.MEMORY_SEARCH, "GET", f"/agents/{world.helper}/memory?query=x", None),
        (UseCase.MEMORY_SEARCH, "GET", f"/agents/{world.helper}/memory/facts", None),
        (UseCase.KNOWLEDGE_SEARCH, "GET", "/knowledge/search?query=install", None),
        (UseCase.SESSIONS_READ, "GET", f"/sessions/{world.session_id}", None),
        (UseCase.SESSIONS_READ, "GET", f"/sessions/{world.session_id}/messages", None),
        (UseCase.SESSIONS_MESSAGE, "POST", f"/sessions/{world.session_id}/messages",
         {"message": "hi"}),
        (UseCase.SESSIONS_END, "POST", f"/sessions/{world.session_id}/end", None),
        (UseCase.TASKS_CANCEL, "POST", f"/tasks/{world.run_id}/cancel", None),
        (UseCase.PROPOSALS_DECIDE, "POST", f"/proposals/{world.proposal_id}/decision",
         {"approve": True}),
    ]  # fmt: skip
    for use_case, method, path, body in requests:
        before = len(await runtime.store.audit_rows(world.org))
        r = await http.request(method, base + path, headers=member, json=body)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert r.json()["error"]["message"]
        rows = (await runtime.store.audit_rows(world.org))[before:]
        assert [(x["tool"], x["status"], x["principal_id"]) for x in rows] == [
            (use_case.label, "REFUSED", "ada")
        ], path
    # A tool call the member may not make: the gate refuses it (an observation) and audits.
    r = await http.post(
        f"{base}/tools/memory_search",
        headers=member,
        json={"agentId": str(world.helper), "args": {"query": "x"}},
    )
    assert r.status_code == 200 and r.json()["status"] == "REFUSED"
    gate = await runtime.store.audit_rows(world.org, gate_only=True)
    assert (gate[-1]["tool"], gate[-1]["status"]) == ("memory_search", "REFUSED")
    # An unknown tool is a 404, decided in the core.
    r = await http.post(f"{base}/tools/no_such_tool", headers=member, json={"agentId": "helper"})
    assert r.status_code == 404


async def test_http_allowed_calls_reach_the_core_as_the_caller(
    runtime: Runtime, world: World, http: httpx2.AsyncClient
) -> None:
    admin = await _key(runtime, world.admin)
    base = f"/api/orgs/{world.org}"
    r = await http.get(f"{base}/agents/{world.helper}/proposals", headers=admin)
    assert r.status_code == 200 and [p["status"] for p in r.json()["proposals"]] == ["PENDING"]
    r = await http.post(
        f"{base}/proposals/{world.proposal_id}/decision", headers=admin, json={"approve": False}
    )
    assert r.status_code == 200 and r.json()["status"] == "REJECTED", r.text
    r = await http.post(f"{base}/agents", headers=admin, json={"name": f"a-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201
    rows = await runtime.store.audit_rows(world.org)
    assert [(x["tool"], x["status"], x["principal_id"]) for x in rows[-2:]] == [
        ("proposals.decide", "OK", "root"),
        ("agents.create", "OK", "root"),
    ]
