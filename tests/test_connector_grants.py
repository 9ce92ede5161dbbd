"""Connector grants enforced in the one gate (issue 18, point 2): fail closed, every call
audited with its decision, hashes, source ids and grants, sensitive result fields redacted
before anything keeps or shows them, and a denied tool's code never runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from cortex_ray import (
    Agent,
    AgentMode,
    CapabilityTier,
    Grant,
    InvalidRequestError,
    ObservationStatus,
    Principal,
    Settings,
)
from cortex_ray._types import utcnow
from cortex_ray.access import AccessControlService
from cortex_ray.act import InvocationContext, Tool, ToolContext, ToolDispatcher, ToolRegistry
from cortex_ray.act._calls import args_sha256
from cortex_ray.governance import (
    ApprovalPolicy,
    Connector,
    ConnectorGrant,
    ConnectorInstance,
    ConnectorPolicy,
    GovernanceStore,
    check_constraints,
)
from cortex_ray.storage import Database, Store

ran: list[tuple[str, dict[str, Any]]] = []


async def lookup(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    ran.append(("crm_lookup", args))
    return {
        "customer": args["name"],
        "email": "ann@example.com",
        "card": {"number": "4111 1111 1111 1111", "ssn": "078-05-1120"},
        "hits": [{"source_id": "crm:42", "text": "..."}, {"source_id": "crm:43"}],
    }


async def update(ctx: ToolContext, args: dict[str, Any]) -> str:
    ran.append(("crm_update", args))
    return "updated"


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "region": {"type": "string"}},
    "required": ["name"],
    "additionalProperties": False,
}
TOOLS = [
    Tool(
        name="crm_lookup",
        description="Look a customer up.",
        handler=lookup,
        parameters=SCHEMA,
        tier=CapabilityTier.READ,
        connector="crm",
    ),
    Tool(
        name="crm_update",
        description="Change a customer.",
        handler=update,
        parameters=SCHEMA,
        connector="crm",
    ),
    Tool(
        name="ghost",
        description="A tool of no registered connector.",
        handler=update,
        connector="nope",
    ),
]
CRM = Connector(name="crm", description="The CRM.", sensitive_fields=("SSN", "email"))
NAMES = ("crm_lookup", "crm_update", "ghost")


@pytest.fixture
def gov(db: Database) -> GovernanceStore:
    return GovernanceStore(db)


@pytest.fixture
def gate(store: Store, gov: GovernanceStore) -> ToolDispatcher:
    ran.clear()
    policy = ConnectorPolicy(gov, [CRM])
    return ToolDispatcher(
        ToolRegistry(TOOLS), AccessControlService(), store, Settings().tools, governance=policy
    )


def agent_for(org: str, mode: AgentMode = AgentMode.AUTONOMOUS) -> Agent:
    return Agent(org_id=org, name="a", mode=mode, tools=NAMES, grant=Grant(tools=frozenset({"*"})))


async def install(store: Store, gov: GovernanceStore, org: str, **config: Any) -> None:
    await store.ensure_org(org)
    await gov.put_instance(ConnectorInstance(org_id=org, connector="crm", config=config))


async def grant(gov: GovernanceStore, org: str, principal: str, **kw: Any) -> ConnectorGrant:
    return await gov.create_grant(
        ConnectorGrant(org_id=org, principal_id=principal, connector="crm", **kw)
    )


async def call(
    gate: ToolDispatcher,
    agent: Agent,
    tool: str,
    args: dict[str, Any],
    caller: Principal | None = None,
) -> Any:
    ctx = InvocationContext(agent=agent, caller=caller, mode=agent.mode)
    return await gate.invoke(ctx, tool, args)


async def test_fail_closed_and_a_denied_tools_code_never_runs(gate, store, gov, org) -> None:
    agent = agent_for(org)
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"})
    assert obs.status is ObservationStatus.REFUSED
    assert "not installed in this organisation" in obs.summary
    await install(store, gov, org)
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"})
    assert "has no grant of connector 'crm'" in obs.summary
    obs = await call(gate, agent, "ghost", {})
    assert "connector 'nope' is not registered" in obs.summary
    await grant(gov, org, agent.principal().id)  # read tier only
    obs = await call(gate, agent, "crm_update", {"name": "ann"})
    assert obs.status is ObservationStatus.REFUSED
    assert "is write, above grant" in obs.summary
    assert ran == []  # not one denied call reached a handler
    rows = await store.audit_rows(org)
    assert [(r["tool"], r["decision"], r["connector"]) for r in rows] == [
        ("crm_lookup", "denied", "crm"),
        ("crm_lookup", "denied", "crm"),
        ("ghost", "denied", "nope"),
        ("crm_update", "denied", "crm"),
    ]
    assert all(r["result_sha256"] is None for r in rows)


async def test_a_gate_without_a_connector_policy_denies(store, org) -> None:
    bare = ToolDispatcher(ToolRegistry(TOOLS), AccessControlService(), store, Settings().tools)
    ran.clear()
    obs = await call(bare, agent_for(org), "crm_lookup", {"name": "ann"})
    assert obs.status is ObservationStatus.REFUSED and "no connector policy" in obs.summary
    assert ran == []


async def test_allowed_call_is_audited_with_hashes_sources_grant_and_redaction(
    gate, store, gov, org
) -> None:
    agent = agent_for(org)
    await install(store, gov, org, redact_fields=["number"])
    g = await grant(gov, org, agent.principal().id)
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"})
    assert obs.status is ObservationStatus.OK
    # The connector's fields (any case) and the instance's are gone before the model sees it.
    assert obs.output["email"] == "[REDACTED]"
    assert obs.output["card"] == {"number": "[REDACTED]", "ssn": "[REDACTED]"}
    assert "ann@example.com" not in obs.summary and "078-05-1120" not in obs.summary
    row = (await store.audit_rows(org))[-1]
    assert row["decision"] == "allowed" and row["tier"] == "read"
    assert row["input_sha256"] == args_sha256({"name": "ann"})
    assert row["result_sha256"] and len(row["result_sha256"]) == 64
    assert row["source_ids"] == ["crm:42", "crm:43"]
    assert row["grant_ids"] == [g.id]
    assert ran == [("crm_lookup", {"name": "ann"})]


async def test_org_wide_grants_tools_constraints_and_expiry(gate, store, gov, org) -> None:
    agent = agent_for(org)
    await install(store, gov, org)
    await grant(
        gov,
        org,
        "*",
        tools=("crm_update",),
        max_tier=CapabilityTier.WRITE,
        constraints={"region": {"enum": ["eu", "uk"]}},
    )
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"})
    assert "does not cover tool 'crm_lookup'" in obs.summary
    obs = await call(gate, agent, "crm_update", {"name": "ann"})
    assert "argument 'region' is constrained" in obs.summary
    obs = await call(gate, agent, "crm_update", {"name": "ann", "region": "us"})
    assert "argument 'region' not allowed" in obs.summary and "'us' is not one of" in obs.summary
    assert ran == []
    obs = await call(gate, agent, "crm_update", {"name": "ann", "region": "eu"})
    assert obs.status is ObservationStatus.OK and ran == [
        ("crm_update", {"name": "ann", "region": "eu"})
    ]
    # An expired grant allows nothing; a revoked one is not even read.
    other = agent_for(org).model_copy(update={"name": "b"})
    old = await grant(gov, org, other.principal().id, expires_at=utcnow() - timedelta(minutes=1))
    obs = await call(
        gate, other.model_copy(update={"tools": ("crm_lookup",)}), "crm_lookup", {"name": "x"}
    )
    assert f"grant {old.id} expired" in obs.summary
    live = await grant(gov, org, other.principal().id)
    await gov.revoke_grant(org, live.id)
    obs = await call(
        gate, other.model_copy(update={"tools": ("crm_lookup",)}), "crm_lookup", {"name": "x"}
    )
    assert obs.status is ObservationStatus.REFUSED
    assert len(ran) == 1


async def test_a_conversation_needs_the_callers_grant_too(gate, store, gov, org) -> None:
    agent = agent_for(org, AgentMode.INTERACTIVE)
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    await install(store, gov, org)
    await grant(gov, org, agent.principal().id)
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"}, caller=alice)
    assert "alice has no grant of connector 'crm'" in obs.summary
    await grant(gov, org, "alice")
    obs = await call(gate, agent, "crm_lookup", {"name": "ann"}, caller=alice)
    assert obs.status is ObservationStatus.OK


async def test_approval_policy_and_no_cross_organisation_grant(gate, store, gov, org) -> None:
    agent = agent_for(org)
    await install(store, gov, org)
    await grant(
        gov,
        org,
        agent.principal().id,
        max_tier=CapabilityTier.WRITE,
        approval=ApprovalPolicy.WRITES,
    )
    assert (await call(gate, agent, "crm_lookup", {"name": "a"})).status is ObservationStatus.OK
    obs = await call(gate, agent, "crm_update", {"name": "a"})
    assert obs.status is ObservationStatus.REFUSED and obs.summary.startswith(
        "refused: approval required"
    )
    assert (await store.audit_rows(org))[-1]["decision"] == "approval_required"
    assert ran == [("crm_lookup", {"name": "a"})]
    # The same agent id in another organisation holds no grant there.
    elsewhere = f"{org}-x"
    await install(store, gov, elsewhere)
    twin = agent.model_copy(update={"org_id": elsewhere})
    obs = await call(gate, twin, "crm_lookup", {"name": "a"})
    assert "has no grant" in obs.summary
    assert [g.org_id for g in await gov.grants(elsewhere)] == []


def test_constraints_outside_the_subset_are_refused() -> None:
    check_constraints({"region": {"enum": ["eu"]}, "n": {"type": "integer", "maximum": 3}})
    with pytest.raises(InvalidRequestError, match="'format' is not supported"):
        check_constraints({"to": {"format": "email"}})
    with pytest.raises(InvalidRequestError, match="non-empty JSON object"):
        check_constraints({"to": {}})
    with pytest.raises(InvalidRequestError, match="invalid constraint"):
        check_constraints({"to": {"type": "nonsense"}})


async def test_a_catastrophic_constraint_pattern_denies_instead_of_hanging(
    gate, store, gov, org
) -> None:
    with pytest.raises(InvalidRequestError, match="a pattern is at most 1000 characters"):
        check_constraints({"name": {"pattern": "a" * 1001}})
    agent = agent_for(org)
    await install(store, gov, org)
    made = await grant(gov, org, "*", constraints={"name": {"pattern": "^(a|aa)+$"}})
    assert (await call(gate, agent, "crm_lookup", {"name": "aaaa"})).status is ObservationStatus.OK
    obs = await call(gate, agent, "crm_lookup", {"name": "a" * 40 + "!"})
    assert obs.status is ObservationStatus.REFUSED  # fail closed, at once
    assert f"could not be checked against grant {made.id}" in obs.summary
    assert "did not finish within 0.25 s" in obs.summary
    assert ran == [("crm_lookup", {"name": "aaaa"})]


async def test_the_grant_cache_is_dropped_when_grants_change_here(store, gov, org) -> None:
    """With ``grant_cache_s`` a process reuses what it read; a change made through it (the
    use cases call ``invalidate``) counts at once. Expiry is still judged at each call."""
    policy = ConnectorPolicy(gov, [CRM], cache_s=3600)
    gate = ToolDispatcher(
        ToolRegistry(TOOLS), AccessControlService(), store, Settings().tools, governance=policy
    )
    agent = agent_for(org)
    await install(store, gov, org)
    g = await grant(gov, org, agent.principal().id)
    assert (await call(gate, agent, "crm_lookup", {"name": "a"})).status is ObservationStatus.OK
    await gov.revoke_grant(org, g.id)  # behind the policy's back: the cached grant stands
    assert (await call(gate, agent, "crm_lookup", {"name": "a"})).status is ObservationStatus.OK
    policy.invalidate(org)
    obs = await call(gate, agent, "crm_lookup", {"name": "a"})
    assert obs.status is ObservationStatus.REFUSED and "has no grant" in obs.summary
