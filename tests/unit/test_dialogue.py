"""Dialogue is part of every interactive agent's action space (issue 30, point 3): an agent
created on the fakes with ``tools=["current_time"]`` answers a caller whose grant lacks
``reply``, through the real PERCEIVE → DECIDE → ACT pieces of a turn (the assembler, the
interactive driver, the invocation gate); the turn's LEARN is PostgreSQL's
(tests/test_api.py drives the whole turn over HTTP)."""

from __future__ import annotations

from typing import Any, cast
from uuid import UUID

import pytest
from fakes import FakeStore, FakeTransaction

from cortex_ray import Settings
from cortex_ray._types import (
    ActionType,
    AgentMode,
    DecisionKind,
    Grant,
    MemorySnapshot,
    ObservationStatus,
    Principal,
    PrincipalKind,
    Turn,
)
from cortex_ray.access import AccessControlService
from cortex_ray.act import InvocationContext, ToolDispatcher, ToolRegistry, builtin_tools
from cortex_ray.decide import InteractiveDriver
from cortex_ray.models import ChatRequest, ChatResponse, ScriptedModelClient, ToolCall
from cortex_ray.perceive import PromptComposer, WorkingMemoryAssembler
from cortex_ray.runtime import AccessGate
from cortex_ray.runtime._agents import AgentUseCases

ADMIN = Principal(id="root", org_id="acme", is_admin=True)
# What a key created with `--grant current_time` gives: no `reply` in it.
BOB = Principal(id="bob", org_id="acme", grant=Grant(tools=frozenset({"current_time"})))


WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class NoMemory:
    """Long-term memory with nothing in it (the snapshot is PostgreSQL's)."""

    async def snapshot(self, *, query: str, **_: Any) -> MemorySnapshot:
        return MemorySnapshot(query=query)


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry(builtin_tools())


@pytest.fixture
def dispatcher(registry: ToolRegistry, fake_store: FakeStore, settings: Settings) -> ToolDispatcher:
    # The gate writes no row itself (the turn's LEARN does, with the audit it returns).
    return ToolDispatcher(registry, AccessControlService(), cast(Any, fake_store), settings.tools)


def clock_then_reply(request: ChatRequest) -> ChatResponse | str:
    """The chat model: read the clock, then answer with what it said."""
    text = "\n".join(m.content or "" for m in request.messages)
    if request.tools and '"utc"' not in text:
        return ChatResponse(tool_calls=(ToolCall(id="c1", name="current_time", arguments="{}"),))
    weekday = next((d for d in WEEKDAYS if d in text), None)
    return f"It is {weekday}." if weekday else "I cannot tell."


async def test_an_agent_created_with_only_current_time_answers(
    gate: AccessGate[FakeTransaction],
    fake_store: FakeStore,
    registry: ToolRegistry,
    dispatcher: ToolDispatcher,
) -> None:
    agents = AgentUseCases(gate, fake_store, registry)
    chat = await agents.create_agent("acme", "d-chat", tools=["current_time"], principal=ADMIN)
    assert chat.tools == ("current_time",) and chat.mode is AgentMode.INTERACTIVE
    assert chat.grant == Grant(tools=frozenset({"current_time"}))  # no `reply` stored

    space = dispatcher.action_space(chat, BOB, AgentMode.INTERACTIVE)
    assert [(s.name, s.action_type) for s in space] == [
        ("current_time", ActionType.GROUNDING),
        ("reply", ActionType.GROUNDING),
    ]

    model = ScriptedModelClient(responder=clock_then_reply)
    driver = InteractiveDriver(model, PromptComposer())
    perceive = WorkingMemoryAssembler(cast(Any, NoMemory()), dispatcher, recall_k=4)
    ctx = InvocationContext(
        agent=chat, caller=BOB, mode=AgentMode.INTERACTIVE, session_id=UUID(int=7)
    )
    conversation = [Turn(role="user", content="What time is it?")]
    observations = []
    for _ in range(3):  # the turn's rounds: tool calls, then the reply
        wm = await perceive.assemble(
            agent=chat,
            mode=AgentMode.INTERACTIVE,
            objective="What time is it?",
            caller=BOB,
            observations=observations,
            conversation=conversation,
        )
        decision = await driver.decide(wm)
        if decision.kind is not DecisionKind.ACT:
            break
        assert decision.action is not None
        dispatch = await dispatcher.execute(ctx, decision.action.tool, decision.action.args)
        assert dispatch.observation.status is ObservationStatus.OK, dispatch.observation.summary
        observations.append(dispatch.observation)
        conversation.append(Turn(role="tool", content=dispatch.observation.summary))
    assert decision.kind is DecisionKind.REPLY and decision.message
    assert decision.message == f"It is {observations[0].output['weekday']}."  # the clock's

    answered = await dispatcher.execute(ctx, "reply", {"message": decision.message})
    assert answered.observation.status is ObservationStatus.OK, answered.observation.summary
    audit = answered.audit
    assert (audit.tool, audit.decision, audit.principal_id, audit.action_type) == (
        "reply", "allowed", "bob", ActionType.GROUNDING
    )  # fmt: skip
    # The chat model was offered current_time as a tool; the reply is its answer itself.
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["current_time"]


async def test_the_gate_still_refuses_what_is_not_dialogue(
    gate: AccessGate[FakeTransaction],
    fake_store: FakeStore,
    registry: ToolRegistry,
    dispatcher: ToolDispatcher,
) -> None:
    agents = AgentUseCases(gate, fake_store, registry)
    chat = await agents.create_agent("acme", "d-chat", tools=["current_time"], principal=ADMIN)
    ctx = InvocationContext(agent=chat, caller=BOB, mode=AgentMode.INTERACTIVE)
    refused = await dispatcher.execute(ctx, "remember_fact", {"subject": "a", "fact": "b"})
    assert refused.observation.summary == (
        "refused: access denied: tool 'remember_fact' is not in the tool set of agent 'd-chat'"
    )
    # A direct call (no session) of `reply` reaches nobody: decided like any tool.
    direct = await dispatcher.execute(ctx, "reply", {"message": "hi"})
    assert direct.observation.summary == (
        "refused: access denied: tool 'reply' is not in the tool set of agent 'd-chat'"
    )
    # In a session the reply's schema is checked like any call's; another agent may not
    # speak for it.
    ctx = InvocationContext(
        agent=chat, caller=BOB, mode=AgentMode.INTERACTIVE, session_id=UUID(int=7)
    )
    empty = await dispatcher.execute(ctx, "reply", {"message": ""})
    assert empty.observation.summary.startswith("refused: invalid arguments")
    other = Principal(id="agent:x", org_id="acme", kind=PrincipalKind.AGENT, grant=BOB.grant)
    ctx = InvocationContext(
        agent=chat, caller=other, mode=AgentMode.INTERACTIVE, session_id=UUID(int=7)
    )
    denied = await dispatcher.execute(ctx, "reply", {"message": "hi"})
    assert denied.observation.status is ObservationStatus.REFUSED
    assert denied.audit.decision == "denied"
    # Made autonomous, the agent has no person to answer: no reply in its action space.
    worker = chat.model_copy(update={"mode": AgentMode.AUTONOMOUS})
    assert [s.name for s in dispatcher.action_space(worker, None, AgentMode.AUTONOMOUS)] == [
        "current_time"
    ]
