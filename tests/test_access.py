"""AccessControlService: autonomous → agent grant; interactive → agent ∩ caller;
no policy → deny."""

from __future__ import annotations

import pytest

from cortex_ray import ActionType, Agent, AgentMode, Grant, Principal, PrincipalKind
from cortex_ray.access import AccessControlService

pytestmark = pytest.mark.unit

ACCESS = AccessControlService()
TOOLS = ("memory_search", "remember_fact", "current_time", "reply")


def make_agent(grant: Grant | None, mode: AgentMode = AgentMode.AUTONOMOUS) -> Agent:
    return Agent(org_id="acme", name="a", mode=mode, tools=TOOLS, grant=grant)


def user(grant: Grant | None, org: str = "acme", admin: bool = False) -> Principal:
    return Principal(id="u1", org_id=org, kind=PrincipalKind.USER, grant=grant, is_admin=admin)


def test_autonomous_uses_the_agents_own_grant() -> None:
    agent = make_agent(Grant(tools=frozenset({"current_time"})))
    assert ACCESS.decide(agent, None, "current_time", ActionType.GROUNDING).allowed
    denied = ACCESS.decide(agent, None, "remember_fact", ActionType.LEARNING)
    assert not denied.allowed and "not granted" in denied.reason


def test_autonomous_ignores_the_caller_even_an_admin() -> None:
    agent = make_agent(Grant(tools=frozenset({"current_time"})))
    admin = user(Grant(tools=frozenset({"*"})), admin=True)
    assert not ACCESS.decide(agent, admin, "remember_fact", ActionType.LEARNING).allowed


def test_autonomous_runs_as_a_non_admin_agent_principal() -> None:
    agent = make_agent(Grant(tools=frozenset({"*"})))
    principal = ACCESS.principal_for(agent, user(None, admin=True), AgentMode.AUTONOMOUS)
    assert principal.kind is PrincipalKind.AGENT
    assert not principal.is_admin
    assert principal.id == f"agent:{agent.id}"


@pytest.mark.parametrize("grant", [None])
def test_no_policy_denies(grant: Grant | None) -> None:
    agent = make_agent(grant)
    decision = ACCESS.decide(agent, None, "current_time", ActionType.GROUNDING)
    assert not decision.allowed and "no access policy" in decision.reason


def test_interactive_is_the_intersection() -> None:
    agent = make_agent(
        Grant(tools=frozenset({"current_time", "memory_search"})), AgentMode.INTERACTIVE
    )
    caller = user(Grant(tools=frozenset({"memory_search", "remember_fact"})))
    allowed = {
        t
        for t, kind in [
            ("current_time", ActionType.GROUNDING),
            ("memory_search", ActionType.RETRIEVAL),
            ("remember_fact", ActionType.LEARNING),
        ]
        if ACCESS.decide(agent, caller, t, kind).allowed
    }
    # The agent could read the clock, but this caller may not make it; the caller could
    # remember facts, but the agent may not.
    assert allowed == {"memory_search"}


def test_interactive_caller_without_policy_is_denied() -> None:
    agent = make_agent(Grant(tools=frozenset({"*"})), AgentMode.INTERACTIVE)
    assert not ACCESS.decide(agent, user(None), "current_time", ActionType.GROUNDING).allowed
    assert not ACCESS.decide(agent, None, "current_time", ActionType.GROUNDING).allowed


def test_grant_by_action_type() -> None:
    agent = make_agent(Grant(action_types=frozenset({ActionType.RETRIEVAL})))
    assert ACCESS.decide(agent, None, "memory_search", ActionType.RETRIEVAL).allowed
    assert not ACCESS.decide(agent, None, "current_time", ActionType.GROUNDING).allowed


def test_caller_from_another_organisation_is_denied() -> None:
    agent = make_agent(Grant(tools=frozenset({"*"})), AgentMode.INTERACTIVE)
    stranger = user(Grant(tools=frozenset({"*"})), org="other")
    decision = ACCESS.decide(agent, stranger, "current_time", ActionType.GROUNDING)
    assert not decision.allowed and "another organisation" in decision.reason


def test_tool_outside_the_agents_tool_set_is_denied_even_with_wildcard() -> None:
    agent = make_agent(Grant(tools=frozenset({"*"})))
    assert not ACCESS.decide(agent, None, "delete_everything", ActionType.GROUNDING).allowed


def test_another_agent_cannot_drive_this_agent_interactively() -> None:
    agent = make_agent(Grant(tools=frozenset({"*"})), AgentMode.INTERACTIVE)
    other = Principal(
        id="agent:x", org_id="acme", kind=PrincipalKind.AGENT, grant=Grant(tools=frozenset({"*"}))
    )
    assert not ACCESS.decide(agent, other, "current_time", ActionType.GROUNDING).allowed


# dialogue: the reply is part of every interactive agent's action space -------------------


def chat_agent(tools: tuple[str, ...], grant: Grant | None) -> Agent:
    return Agent(org_id="acme", name="d-chat", mode=AgentMode.INTERACTIVE, tools=tools, grant=grant)


@pytest.mark.parametrize(
    ("agent_grant", "caller_grant"),
    [
        (Grant(tools=frozenset({"current_time"})), Grant(tools=frozenset({"current_time"}))),
        (None, Grant(tools=frozenset({"*"}))),  # no policy: no tool, but it still answers
        (Grant(tools=frozenset({"*"})), None),  # a key without a grant: answered too
    ],
)
def test_an_interactive_agent_always_replies_to_its_caller(
    agent_grant: Grant | None, caller_grant: Grant | None
) -> None:
    agent = chat_agent(("current_time",), agent_grant)
    caller = user(caller_grant)
    decision = ACCESS.decide(agent, caller, "reply", ActionType.GROUNDING, conversation=True)
    assert decision.allowed and "dialogue" in decision.reason
    # Outside a session's turn (a direct call) the reply reaches nobody: an ordinary tool.
    assert not ACCESS.decide(agent, caller, "reply", ActionType.GROUNDING).allowed
    assert ACCESS.action_names(agent, AgentMode.INTERACTIVE) == ("current_time", "reply")
    assert ACCESS.action_names(chat_agent(TOOLS, None)) == TOOLS  # listed once
    # The grants still decide every tool: the caller's lacks memory_search here.
    assert not ACCESS.decide(agent, caller, "memory_search", ActionType.RETRIEVAL).allowed


def test_the_reply_is_never_on_another_organisations_or_agents_behalf() -> None:
    agent = chat_agent(("current_time",), Grant(tools=frozenset({"*"})))
    everything = Grant(tools=frozenset({"*"}))
    stranger = user(everything, org="other")
    other_agent = Principal(id="agent:x", org_id="acme", kind=PrincipalKind.AGENT, grant=everything)
    for who, why in (
        (stranger, "another organisation"),
        (other_agent, "another agent"),
        (None, "needs the caller"),
    ):
        denied = ACCESS.decide(agent, who, "reply", ActionType.GROUNDING, conversation=True)
        assert not denied.allowed and why in denied.reason


def test_an_autonomous_agent_replies_only_with_reply_in_its_tool_set() -> None:
    # A run has no person to reply to (its finish message is its dialogue): there `reply` is
    # an ordinary tool, in the tool set and the grant or denied.
    worker = make_agent(Grant(tools=frozenset({"*"})))
    worker = worker.model_copy(update={"tools": ("current_time",)})
    denied = ACCESS.decide(worker, None, "reply", ActionType.GROUNDING, conversation=True)
    assert not denied.allowed
    assert ACCESS.action_names(worker) == ("current_time",)
    # An interactive call on an autonomous agent's behalf is no conversation either.
    person = user(Grant(tools=frozenset({"*"})))
    direct = ACCESS.decide(
        worker, person, "reply", ActionType.GROUNDING, mode=AgentMode.INTERACTIVE
    )
    assert not direct.allowed


def test_a_refusal_names_the_tool_and_the_agent_with_single_quotes() -> None:
    agent = chat_agent(("current_time",), Grant(tools=frozenset({"*"})))
    person = user(Grant(tools=frozenset({"*"})))
    denied = ACCESS.decide(agent, person, "remember_fact", ActionType.LEARNING)
    assert denied.reason == "tool 'remember_fact' is not in the tool set of agent 'd-chat'"
    assert "''" not in denied.reason
