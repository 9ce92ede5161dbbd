"""The workflow ledger (issue 18, point 5) on the real cycle, gate and PostgreSQL, with a
scripted planner: immutable versions, inputs checked against the version's schema, the gate
refusing a tool outside the allow-list before any grant is read (its code never runs), the
version's approval gates and required evidence, the ledger as one timeline, large payloads
stored once, acceptance per workflow, and the HTTP routes (error shapes, nothing across
organisations)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cortex_ray import (
    AccessDeniedError,
    AgentMode,
    CapabilityTier,
    ConflictError,
    Grant,
    InvalidRequestError,
    NotFoundError,
    ObservationStatus,
    Principal,
    RunMode,
    RunStatus,
    Runtime,
    Settings,
)
from cortex_ray.act import InvocationContext, Tool, ToolContext
from cortex_ray.governance import (
    GrantRequest,
    RequiredEvidence,
    RiskLevel,
    RunLabel,
    WorkflowVersionSpec,
)
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from cortex_ray.storage import Database
from tests.test_connector_grants import CRM, TOOLS, ran

STEP = re.compile(r"Step (\d+) of (\d+)\.")
PLAN_NAME = re.compile(r'"plan": "(\w+)"')
BIG = {
    "rows": [{"id": i, "text": "lorem ipsum " * 8} for i in range(60)],  # ~8 KB
    "hits": [{"source_id": "kb:7", "version": 3, "text": "..."}],
}


def _call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"tool": tool, "args": args, "rationale": f"call {tool}"}


FINISH = {"finish": True, "message": "done", "rationale": "all done"}
PLANS: dict[str, list[dict[str, Any]]] = {
    "lookup": [_call("crm_lookup", {"name": "ann"}), FINISH],
    "update": [
        _call("crm_lookup", {"name": "ann"}),
        _call("crm_update", {"name": "ann", "region": "eu"}),
        FINISH,
    ],
    "big": [*(_call("big_report", {"page": i}) for i in range(4)), FINISH],
    "bigwipe": [
        _call("big_report", {"page": 0, "note": "x" * 3000}),
        _call("wipe", {"note": "y" * 3000}),
        FINISH,
    ],
}


def plan(request: ChatRequest) -> str:
    text = "\n".join(m.content or "" for m in request.messages)
    step, name = STEP.search(text), PLAN_NAME.search(text)
    assert step is not None and name is not None, text
    return json.dumps({"candidates": [PLANS[name.group(1)][int(step.group(1)) - 1]]})


async def wipe(ctx: ToolContext, args: dict[str, Any]) -> str:
    ran.append(("wipe", args))
    return "wiped"


async def big_report(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    ran.append(("big_report", args))
    return BIG


OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}
EXTRA_TOOLS = [
    Tool(name="wipe", description="Wipe everything.", handler=wipe, parameters=OBJECT),
    Tool(
        name="big_report",
        description="A large report.",
        handler=big_report,
        parameters=OBJECT,
        tier=CapabilityTier.READ,
    ),
]
SCHEMA = {
    "type": "object",
    "properties": {
        "plan": {"type": "string"},
        "customer": {"type": "object", "properties": {"name": {"type": "string"}},
                     "required": ["name"]},
    },
    "required": ["plan", "customer"],
}  # fmt: skip


def inputs(name: str) -> dict[str, Any]:
    return {"plan": name, "customer": {"name": "ann"}}


def spec(**kw: Any) -> WorkflowVersionSpec:
    base: dict[str, Any] = {
        "instructions": "Look the customer up and report.",
        "input_schema": SCHEMA,
        "tools": ("crm_lookup",),
    }
    return WorkflowVersionSpec(**{**base, **kw})


@pytest.fixture
async def runtime(db: Database, settings: Settings) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(
        settings.model_copy(
            update={"embedding_backend": "hash", "candidates": 1, "payload_inline_bytes": 2048}
        ),
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        db=db,
        tools=[*TOOLS, *EXTRA_TOOLS],
        connectors=[CRM],
    )
    yield rt
    await rt.close(close_db=False)


async def setup(runtime: Runtime, org: str, *, grant: bool = True) -> str:
    ran.clear()
    await runtime.store.ensure_org(org)
    agent = await runtime.create_agent(
        org, "clerk", mode=AgentMode.AUTONOMOUS,
        tools=["crm_lookup", "crm_update", "wipe", "big_report"],
        grant=Grant(tools=frozenset({"*"})),
    )  # fmt: skip
    if grant:
        await runtime.governance.install_connector(org, "crm")
        await runtime.governance.create_grant(
            org, GrantRequest(principal_id="*", connector="crm", max_tier="write")
        )
    return agent.name


async def run_to_end(runtime: Runtime, org: str, name: str, data: dict[str, Any], **kw: Any) -> Any:
    run = await runtime.workflows.start_run(org, name, "clerk", data, max_steps=6, **kw)
    return await runtime.drive_run(org, run.id)


async def test_versions_are_immutable_and_checked(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    wf = runtime.workflows
    made = await wf.create(org, "triage", description="Look customers up")
    with pytest.raises(ConflictError, match="already exists"):
        await wf.create(org, "triage")
    with pytest.raises(InvalidRequestError, match="name"):
        await wf.create(org, "Bad Name")
    with pytest.raises(NotFoundError, match="no published version"):
        await wf.start_run(org, "triage", "clerk", inputs("lookup"))
    bad = [
        (spec(input_schema={"type": "object", "properties": {"a": {"type": 5}}}),
         "input_schema is not a valid JSON schema: properties/a/type"),
        (spec(input_schema={"type": "string"}), "must describe an object"),
        (spec(tools=("crm_lookup", "nope")), "unknown tools: nope"),
        (spec(connectors=("mail",)), "no connector registered as mail"),
        (spec(approval_tools=("wipe",)), "not allowed by this version"),
    ]  # fmt: skip
    for wrong, why in bad:
        with pytest.raises(InvalidRequestError, match=re.escape(why)):
            await wf.publish(org, "triage", wrong)
    v1, fresh = await wf.publish(org, "triage", spec())
    assert fresh and v1.version == 1 and v1.workflow_id == made.id
    again, fresh = await wf.publish(org, "triage", spec(), version=1)
    assert not fresh and again.id == v1.id  # the same spec again: nothing changes
    with pytest.raises(ConflictError, match="immutable"):
        await wf.publish(org, "triage", spec(tools=("crm_lookup", "wipe")), version=1)
    with pytest.raises(InvalidRequestError, match="the next version is 2"):
        await wf.publish(org, "triage", spec(), version=5)
    v2, _ = await wf.publish(org, "triage", spec(default_mode=RunMode.SHADOW))
    assert v2.version == 2 and (await wf.version(org, "triage")).id == v2.id
    assert [v.version for v in (await wf.get(org, "triage"))[1]] == [1, 2]
    # The record refuses an edit too, whoever asks.
    with pytest.raises(Exception, match="immutable"):
        async with runtime.db.transaction() as conn:
            await conn.execute(
                "UPDATE workflow_versions SET tools = '{wipe}' WHERE org_id = %s AND id = %s",
                (org, v1.id),
            )
    assert (await wf.version(org, "triage", 1)).tools == ("crm_lookup",)
    # Defining is an admin's.
    with pytest.raises(AccessDeniedError, match="only an admin"):
        await wf.publish(org, "triage", spec(), principal=Principal(id="bob", org_id=org))


async def test_inputs_and_mode_are_checked_when_a_run_starts(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    wf = runtime.workflows
    await wf.create(org, "triage")
    await wf.publish(org, "triage", spec(default_mode=RunMode.SHADOW))
    for data, why in [
        ({"plan": "lookup"}, "inputs: (root): 'customer' is a required property"),
        ({"plan": "lookup", "customer": {"name": 7}}, "inputs: customer/name: 7 is not of type"),
    ]:
        with pytest.raises(InvalidRequestError, match=re.escape(why)):
            await wf.start_run(org, "triage", "clerk", data)
    with pytest.raises(InvalidRequestError, match="only choose a safer mode"):
        await wf.start_run(org, "triage", "clerk", inputs("lookup"), run_mode=RunMode.EXECUTE)
    run = await wf.start_run(org, "triage", "clerk", inputs("lookup"))
    assert run.run_mode is RunMode.SHADOW  # the version's default
    dry = await wf.start_run(org, "triage", "clerk", inputs("lookup"), run_mode=RunMode.DRY_RUN)
    assert dry.run_mode is RunMode.DRY_RUN
    stored = await runtime.get_run(org, run.id)
    assert stored.workflow_version_id is not None and stored.workflow_inputs == inputs("lookup")
    assert 'Workflow inputs (JSON): {"customer": {"name": "ann"}' in stored.objective()
    [submitted] = [
        r for r in await runtime.store.audit_rows(org, run_id=run.id) if r["tool"] == "tasks.submit"
    ]
    assert submitted["workflow_id"] is not None and submitted["args"]["version"] == 1
    with pytest.raises(NotFoundError):
        await wf.start_run(org, "triage", "clerk", inputs("lookup"), version=9)


async def test_the_gate_refuses_a_tool_outside_the_allow_list_before_any_grant(
    runtime: Runtime, org: str
) -> None:
    """No connector is installed and nothing is granted: were grants read first, the
    refusal would say so. The refused tools' code never runs."""
    await setup(runtime, org, grant=False)
    await runtime.workflows.create(org, "triage")
    version, _ = await runtime.workflows.publish(org, "triage", spec(tools=("big_report",)))
    agent = await runtime.store.get_agent(org, "clerk")
    ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS, workflow=version)
    for tool, args, why in [
        ("wipe", {}, "workflow triage v1 does not allow 'wipe'"),
        ("crm_update", {"name": "ann"}, "does not allow 'crm_update' (connector 'crm')"),
    ]:
        obs = await runtime.dispatcher.invoke(ctx, tool, args)
        assert obs.status is ObservationStatus.REFUSED and why in obs.summary, obs.summary
    assert ran == []
    rows = await runtime.store.audit_rows(org, gate_only=True)
    assert [(r["tool"], r["decision"], r["workflow_id"]) for r in rows] == [
        ("wipe", "refused", version.workflow_id),
        ("crm_update", "refused", version.workflow_id),
    ]
    # Without the workflow the grant check answers (and still denies: fail closed).
    obs = await runtime.dispatcher.invoke(
        InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS),
        "crm_update",
        {"name": "ann"},
    )
    assert "not installed" in obs.summary and ran == []
    # The allowed tool runs; the same large arguments three times are stored once.
    big_args = {"blob": "x" * 5000}
    for _ in range(3):
        obs = await runtime.dispatcher.invoke(ctx, "big_report", big_args)
        assert obs.status is ObservationStatus.OK
    rows = [r for r in await runtime.store.audit_rows(org, gate_only=True) if r["status"] == "OK"]
    refs = {r["args_ref"] for r in rows}
    assert len(refs) == 1 and None not in refs
    size = len(json.dumps(big_args))
    assert all(r["args"] == {"$payload": r["args_ref"], "bytes": size} for r in rows)
    assert await payload_rows(runtime, org) == 2  # the arguments once, the result once
    assert await runtime.workflows.payload(org, rows[0]["args_ref"]) == big_args  # an admin
    bob = Principal(id="bob", org_id=org)
    with pytest.raises(NotFoundError, match="no payload"):  # a direct call's: not a member's
        await runtime.workflows.payload(org, rows[0]["args_ref"], principal=bob)
    with pytest.raises(NotFoundError):
        await runtime.workflows.payload(f"{org}-x", rows[0]["args_ref"])


async def payload_rows(runtime: Runtime, org: str) -> int:
    async with runtime.db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM payloads WHERE org_id = %s", (org,))
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_workflow_run_and_its_ledger(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "triage")
    required = RequiredEvidence(min_sources=2, sources=("crm:42",))
    await runtime.workflows.publish(org, "triage", spec(required_evidence=required))
    run = await run_to_end(runtime, org, "triage", inputs("lookup"))
    assert run.status is RunStatus.COMPLETED, run.reason
    ledger = await runtime.workflows.ledger(org, run.id, workflow="triage")
    assert (ledger.workflow, ledger.version, ledger.run_mode, ledger.requested_by) == (
        "triage", 1, RunMode.EXECUTE, "operator",
    )  # fmt: skip
    assert ledger.inputs == inputs("lookup")
    assert [(e.seq, e.kind, e.step_index, e.tool, e.outcome) for e in ledger.events] == [
        (0, "started", None, None, "execute"),
        (1, "decided", 0, "crm_lookup", "ACT"),
        (2, "call", 0, "crm_lookup", "allowed"),
        (3, "decided", 1, None, "FINISH"),
        (4, "finished", None, None, "COMPLETED"),
        (5, "evidence", None, None, "satisfied"),
    ]
    proposed, executed = ledger.events[1], ledger.events[2]
    assert proposed.data["args_sha256"] == executed.data["input_sha256"]
    assert executed.data["source_ids"] == ["crm:42", "crm:43"]
    assert ledger.evidence is not None and ledger.evidence.sources == ("crm:42", "crm:43")
    with pytest.raises(NotFoundError):
        await runtime.workflows.ledger(org, run.id, workflow="other")
    listed = await runtime.workflows.runs(org, "triage")
    assert [(r["id"], r["version"]) for r in listed] == [(run.id, 1)]


async def test_a_run_without_the_required_evidence_fails_saying_so(
    runtime: Runtime, org: str
) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "triage")
    required = RequiredEvidence(min_sources=3, sources=("crm:42", "kb:7"))
    await runtime.workflows.publish(org, "triage", spec(required_evidence=required))
    run = await run_to_end(runtime, org, "triage", inputs("lookup"))
    assert run.status is RunStatus.FAILED
    assert run.reason == (
        "required evidence missing: needs at least 3 cited sources, found 2; never cited kb:7"
    )
    assert run.result == "done"  # the answer is kept beside the finding
    ledger = await runtime.workflows.ledger(org, run.id)
    assert [(e.kind, e.outcome) for e in ledger.events[-2:]] == [
        ("finished", "FAILED"),
        ("evidence", "missing"),
    ]


async def test_the_versions_approval_gate_pauses_the_run(runtime: Runtime, org: str) -> None:
    """The grant needs no approval; the workflow does, through the same requests."""
    await setup(runtime, org)
    await runtime.store.put_principal(Principal(id="root", org_id=org, is_admin=True))
    await runtime.workflows.create(org, "fix")
    await runtime.workflows.publish(
        org, "fix", spec(tools=("crm_lookup", "crm_update"), approval_tools=("crm_update",))
    )
    run = await run_to_end(runtime, org, "fix", inputs("update"))
    assert run.status is RunStatus.AWAITING_APPROVAL
    assert ran == [("crm_lookup", {"name": "ann"})]
    [request] = await runtime.governance.list_approvals(org)
    assert "workflow fix v1 gates 'crm_update' behind approval" in request.reason
    await runtime.governance.decide_approval(
        org, request.id, approve=True, principal=Principal(id="root", org_id=org, is_admin=True)
    )
    final = await runtime.drive_run(org, run.id)
    assert final.status is RunStatus.COMPLETED
    assert [t for t, _ in ran] == ["crm_lookup", "crm_update"]
    ledger = await runtime.workflows.ledger(org, run.id)
    step1 = [(e.kind, e.outcome) for e in ledger.events if e.step_index == 1]
    assert step1 == [
        ("decided", "ACT"),
        ("call", "approval_required"),
        ("approval_requested", "PENDING"),
        ("approval_decided", "APPROVED"),
        ("call", "allowed"),
    ]


async def test_critical_risk_needs_approval_for_writes(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "fix")
    version, _ = await runtime.workflows.publish(
        org, "fix", spec(tools=("crm_lookup", "crm_update"), risk=RiskLevel.CRITICAL)
    )
    assert version.needs_approval("crm_lookup", CapabilityTier.READ) is None
    run = await run_to_end(runtime, org, "fix", inputs("update"))
    assert run.status is RunStatus.AWAITING_APPROVAL
    [request] = await runtime.governance.list_approvals(org)
    assert "critical risk: write calls need approval" in request.reason


async def test_a_large_result_is_stored_once_across_events(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "report")
    await runtime.workflows.publish(org, "report", spec(tools=("big_report",)))
    run = await run_to_end(runtime, org, "report", inputs("big"))
    assert run.status is RunStatus.COMPLETED, run.reason
    ledger = await runtime.workflows.ledger(org, run.id, payloads=True)
    calls = [e for e in ledger.events if e.kind == "call"]
    assert len(calls) == 4
    refs = {e.data["result_ref"] for e in calls}
    assert len(refs) == 1 and None not in refs  # four events, one payload
    [ref] = refs
    assert all(e.payloads == (ref,) for e in calls)
    assert ledger.payloads == {ref: BIG}
    # Evidence with the version each source was cited at.
    assert calls[0].data["source_ids"] == ["kb:7"] and calls[0].data["source_versions"] == [
        "kb:7@3"
    ]
    assert ledger.evidence is not None and ledger.evidence.versions == ("kb:7@3",)
    bob = Principal(id="bob", org_id=org)  # a member reads a run's payloads, as its report
    assert await runtime.workflows.payload(org, ref, principal=bob) == BIG
    assert await payload_rows(runtime, org) == 1
    async with runtime.db.connection() as conn:
        cur = await conn.execute(
            "SELECT bytes FROM payloads WHERE org_id = %s AND sha256 = %s", (org, ref)
        )
        row = await cur.fetchone()
    assert row is not None and row["bytes"] > 2048


async def test_the_ledger_is_read_a_page_at_a_time(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "report")
    await runtime.workflows.publish(org, "report", spec(tools=("big_report",)))
    run = await run_to_end(runtime, org, "report", inputs("big"))
    assert run.status is RunStatus.COMPLETED, run.reason
    whole = await runtime.workflows.ledger(org, run.id)
    assert len(whole.events) == 11 and whole.next_after is None  # 5 decided, 4 calls
    pages, after = [], None
    while True:
        page = await runtime.workflows.ledger(org, run.id, limit=4, after=after, payloads=True)
        pages.append(page)
        if page.next_after is None:
            break
        after = page.next_after
    assert [len(p.events) for p in pages] == [4, 4, 3]
    assert [e for p in pages for e in p.events] == list(whole.events)  # same seq, same order
    for p in pages:  # each page carries the payloads its own events reference, and no other
        assert set(p.payloads) == {ref for e in p.events for ref in e.payloads}
    assert all(len(p.payloads) == 1 for p in pages)  # one stored result, in every page
    assert pages[0].payloads == whole.payloads or not whole.payloads
    with pytest.raises(InvalidRequestError, match="not a ledger cursor"):
        await runtime.workflows.ledger(org, run.id, after="3; DROP TABLE")
    with pytest.raises(InvalidRequestError, match="limit"):
        await runtime.workflows.ledger(org, run.id, limit=0)
    last = await runtime.workflows.ledger(org, run.id, after="9.0.0.0")
    assert last.events == () and last.next_after is None  # past the end: an empty last page


async def test_an_approval_keeps_large_fields_as_payloads(runtime: Runtime, org: str) -> None:
    """An approval request's arguments, decision and evidence over the threshold are
    payloads referenced from the row: read back whole by people who may see the request,
    listed by its ledger event, and no ledger event carries a copy."""
    await setup(runtime, org)
    await runtime.store.put_principal(Principal(id="root", org_id=org, is_admin=True))
    await runtime.workflows.create(org, "purge")
    await runtime.workflows.publish(
        org, "purge", spec(tools=("big_report", "wipe"), approval_tools=("wipe",))
    )
    run = await run_to_end(runtime, org, "purge", inputs("bigwipe"))
    assert run.status is RunStatus.AWAITING_APPROVAL, run.reason
    async with runtime.db.connection() as conn:
        cur = await conn.execute(
            "SELECT args, decision, evidence, args_ref, decision_ref, evidence_ref "
            "FROM approvals WHERE org_id = %s AND run_id = %s",
            (org, run.id),
        )
        [row] = await cur.fetchall()
    refs = (row["args_ref"], row["decision_ref"], row["evidence_ref"])
    assert all(refs) and len(set(refs)) == 3
    for field, ref in zip(("args", "decision", "evidence"), refs, strict=True):
        assert row[field]["$payload"] == ref and row[field]["bytes"] > 2048  # no copy kept
    bob = Principal(id="bob", org_id=org)  # a member: reads requests, whole
    [request] = await runtime.governance.list_approvals(org, principal=bob)
    assert request.args == {"note": "y" * 3000} and request.payloads == refs
    assert request.evidence[0]["tool"] == "big_report"
    assert request.evidence[0]["args"] == {"page": 0, "note": "x" * 3000}
    assert request.decision["action"]["args"] == {"note": "y" * 3000}
    assert (await runtime.governance.get_approval(org, request.id, principal=bob)) == request
    for ref in refs:
        assert await runtime.workflows.payload(org, ref, principal=bob) is not None
    # Approved, the run replays the decision read back whole and carries the call out.
    await runtime.governance.decide_approval(
        org, request.id, approve=True, principal=Principal(id="root", org_id=org, is_admin=True)
    )
    final = await runtime.drive_run(org, run.id)
    assert final.status is RunStatus.COMPLETED, final.reason
    assert ("wipe", {"note": "y" * 3000}) in ran
    ledger = await runtime.workflows.ledger(org, run.id, payloads=True)
    [asked] = [e for e in ledger.events if e.kind == "approval_requested"]
    assert asked.payloads == refs and set(refs) <= set(ledger.payloads)
    assert ledger.payloads[row["args_ref"]] == {"note": "y" * 3000}
    for event in ledger.events:
        assert len(json.dumps(event.model_dump(mode="json"))) < 2048, event.kind


CATASTROPHIC = "^(a|aa)+$"
"""Exponential backtracking on "aaa…a!", with Python's re and with the regex engine alike
(the ways to split 40 a's into a's and aa's: ~1.6e8). The classic ``^(a+)+$`` is not one for
regex, which recognises it."""


async def test_a_catastrophic_input_pattern_is_bounded(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    await runtime.workflows.create(org, "slow")
    too_long = {"type": "object", "properties": {"a": {"type": "string", "pattern": "a" * 1001}}}
    with pytest.raises(InvalidRequestError, match="a pattern is at most 1000 characters"):
        await runtime.workflows.publish(org, "slow", spec(input_schema=too_long))
    broken = {"type": "object", "patternProperties": {"(": {"type": "string"}}}
    with pytest.raises(InvalidRequestError, match="is not a 'regex'"):
        await runtime.workflows.publish(org, "slow", spec(input_schema=broken))
    schema = {
        "type": "object",
        "properties": {"plan": {"type": "string"}, "code": {"type": "string",
                                                            "pattern": CATASTROPHIC}},
        "required": ["plan", "code"],
    }  # fmt: skip
    await runtime.workflows.publish(org, "slow", spec(input_schema=schema))  # short: published
    ok = await runtime.workflows.start_run(org, "slow", "clerk", {"plan": "lookup", "code": "aaa"})
    assert ok.workflow_inputs == {"plan": "lookup", "code": "aaa"}
    with pytest.raises(InvalidRequestError, match="does not match"):
        await runtime.workflows.start_run(org, "slow", "clerk", {"plan": "lookup", "code": "b"})
    evil = {"plan": "lookup", "code": "a" * 40 + "!"}
    with pytest.raises(InvalidRequestError, match=r"did not finish within 0\.25 s"):
        await runtime.workflows.start_run(org, "slow", "clerk", evil)
    # A schedule firing it is a recorded refusal too, never a hung scheduler.
    schedule = await runtime.governance.create_schedule(
        org, "clerk", workflow="slow", inputs={"plan": "lookup", "code": "aa"}, interval_s=60
    )
    async with runtime.db.transaction() as conn:
        await conn.execute(
            "UPDATE schedules SET inputs = %s, next_run_at = now() WHERE id = %s",
            (json.dumps(evil), schedule.id),
        )
    assert [r for o, r in await runtime.governance.fire_due_schedules() if o == org] == []
    [fired] = await runtime.governance.list_schedules(org)
    assert fired.last_error is not None and "did not finish within" in fired.last_error
    # Inputs over the size cap are refused before any pattern sees them.
    with pytest.raises(InvalidRequestError, match="inputs: at most 65536 bytes"):
        await runtime.workflows.start_run(org, "slow", "clerk", {"plan": "x" * 70_000})


async def test_acceptance_per_workflow(runtime: Runtime, org: str) -> None:
    await setup(runtime, org)
    alice = Principal(id="alice", org_id=org)
    for name in ("fix", "other"):
        await runtime.workflows.create(org, name)
        await runtime.workflows.publish(
            org, name, spec(tools=("crm_lookup", "crm_update"), default_mode=RunMode.SHADOW)
        )
    runs = [await run_to_end(runtime, org, "fix", inputs("update")) for _ in range(2)]
    assert ran == [("crm_lookup", {"name": "ann"})] * 2  # proposals never execute
    await run_to_end(runtime, org, "other", inputs("update"))
    await runtime.governance.label_run(org, runs[0].id, RunLabel.ACCEPTED, principal=alice)
    await runtime.governance.label_run(org, runs[1].id, RunLabel.REJECTED, principal=alice)
    rows = await runtime.workflows.acceptance(org)
    assert [(r.workflow, r.version, r.runs, r.labelled, r.proposals) for r in rows] == [
        ("fix", 1, 2, 2, 2),
        ("other", 1, 1, 0, 1),
    ]
    assert rows[0].acceptance_rate == 0.5 and rows[1].acceptance_rate is None
    [only] = await runtime.workflows.acceptance(org, name="other")
    assert only.workflow == "other"
    ledger = await runtime.workflows.ledger(org, runs[0].id)
    assert ledger.events[-1].kind == "labelled" and ledger.events[-1].outcome == "accepted"
    assert [e.outcome for e in ledger.events if e.kind == "call"] == ["allowed", "proposed"]


async def test_workflows_over_http(runtime: Runtime, org: str) -> None:
    import httpx2

    from cortex_ray import InProcessExecutor
    from serve import create_app

    await setup(runtime, org)
    admin = await runtime.create_api_key(org, "root", admin=True, grant=["*"])
    member = await runtime.create_api_key(org, "bob", admin=False, grant=["*"])
    other = await runtime.create_api_key(f"{org}-x", "eve", admin=True, grant=["*"])
    h = {"Authorization": f"Bearer {admin.key}"}
    hm = {"Authorization": f"Bearer {member.key}"}
    intruder = {"Authorization": f"Bearer {other.key}"}
    executor = InProcessExecutor(runtime)
    transport = httpx2.ASGITransport(app=create_app(runtime, executor))
    base = f"/api/orgs/{org}/workflows"
    version = {
        "instructions": "Look the customer up.",
        "inputSchema": SCHEMA,
        "tools": ["crm_lookup"],
        "requiredEvidence": {"minSources": 1},
        "risk": "medium",
    }

    def error(r: Any, status: int) -> str:
        assert r.status_code == status, (r.status_code, r.text)
        return str(r.json()["error"]["message"])

    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://api") as http:
            assert "only an admin" in error(
                await http.post(base, headers=hm, json={"name": "triage"}), 403
            )
            r = await http.post(base, headers=h, json={"name": "triage", "description": "d"})
            assert r.status_code == 201, r.text
            assert "already exists" in error(
                await http.post(base, headers=h, json={"name": "triage"}), 409
            )
            assert error(await http.post(base, headers=h, json={"name": "Bad Name"}), 422)
            bad = {**version, "inputSchema": {"type": "object", "required": "plan"}}
            assert "input_schema is not a valid JSON schema: required" in error(
                await http.post(f"{base}/triage/versions", headers=h, json=bad), 422
            )
            r = await http.post(f"{base}/triage/versions", headers=h, json=version)
            assert r.status_code == 201 and r.json()["version"] == 1, r.text
            r = await http.put(f"{base}/triage/versions/1", headers=h, json=version)
            assert r.status_code == 200  # the same spec again
            changed = {**version, "tools": ["crm_lookup", "wipe"]}
            assert "immutable" in error(
                await http.put(f"{base}/triage/versions/1", headers=h, json=changed), 409
            )
            listed = (await http.get(base, headers=hm)).json()["workflows"]
            assert [(w["name"], w["latestVersion"]) for w in listed] == [("triage", 1)]
            shown = (await http.get(f"{base}/triage", headers=hm)).json()
            assert shown["versions"][0]["risk"] == "medium"
            run = {"agentId": "clerk", "inputs": {"plan": "lookup"}}
            assert "inputs: (root): 'customer' is a required property" in error(
                await http.post(f"{base}/triage/runs", headers=hm, json=run), 422
            )
            run["inputs"] = inputs("lookup")
            r = await http.post(f"{base}/triage/runs", headers=hm, json=run)
            assert r.status_code == 202, r.text
            run_id = r.json()["id"]
            assert r.headers["Location"] == f"{base}/triage/runs/{run_id}"
            for _ in range(400):  # the executor drives it in this event loop
                if await runtime.store.run_status(org, uuid.UUID(run_id)) is not RunStatus.RUNNING:
                    break
                await asyncio.sleep(0.05)
            ledger = (await http.get(f"{base}/triage/runs/{run_id}", headers=hm)).json()
            assert ledger["status"] == "COMPLETED" and ledger["version"] == 1
            assert [e["kind"] for e in ledger["events"]][-2:] == ["finished", "evidence"]
            assert ledger["evidence"]["satisfied"] is True
            assert ledger["nextAfter"] is None
            # A page at a time: the cursor of each page reads the next.
            url, paged, after = f"{base}/triage/runs/{run_id}", [], None
            while True:
                params: dict[str, Any] = {"limit": 2} | ({"after": after} if after else {})
                page = (await http.get(url, headers=hm, params=params)).json()
                paged.extend(page["events"])
                if (after := page["nextAfter"]) is None:
                    break
            assert paged == ledger["events"] and len(paged) > 2
            for bad in ({"limit": 0}, {"limit": 1001}, {"after": "x.1"}):
                assert error(await http.get(url, headers=hm, params=bad), 422)
            runs = (await http.get(f"{base}/triage/runs", headers=hm)).json()["runs"]
            assert [x["id"] for x in runs] == [run_id]
            r = await http.get(f"/api/orgs/{org}/shadow/acceptance/workflows", headers=hm)
            assert r.status_code == 200 and r.json() == {"workflows": []}
            r = await http.get(f"/api/orgs/{org}/payloads/{'0' * 64}", headers=hm)
            assert "no payload" in error(r, 404)
            assert error(await http.get(f"/api/orgs/{org}/payloads/nothex", headers=hm), 422)
            # Another organisation sees and runs nothing here, and learns nothing.
            for method, path, body in [
                ("GET", "", None),
                ("POST", "", {"name": "mine"}),
                ("GET", "/triage", None),
                ("POST", "/triage/versions", version),
                ("PUT", "/triage/versions/1", version),
                ("POST", "/triage/runs", run),
                ("GET", "/triage/runs", None),
                ("GET", f"/triage/runs/{run_id}", None),
            ]:
                r = await http.request(method, base + path, headers=intruder, json=body)
                assert "not found" in error(r, 404), (method, path)
            mine = f"/api/orgs/{org}-x/workflows"
            assert error(await http.get(f"{mine}/triage", headers=intruder), 404)
            assert error(await http.get(f"{mine}/triage/runs/{run_id}", headers=intruder), 404)
            assert (await http.get(mine, headers=intruder)).json() == {"workflows": []}
        assert [r.workflow for r in await runtime.workflows.acceptance(org)] == []
        assert (await runtime.workflows.list_workflows(f"{org}-x")) == []
    finally:
        await executor.aclose()
