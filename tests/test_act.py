"""The one invocation gate: validation, access, hooks, bounds, timeout, cancellation, audit."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from cortex_ray import (
    ActionType,
    Agent,
    AgentMode,
    Grant,
    Observation,
    ObservationStatus,
    Principal,
    Settings,
)
from cortex_ray.access import AccessControlService
from cortex_ray.act import (
    ActionClassifier,
    InvocationContext,
    Tool,
    ToolContext,
    ToolDispatcher,
    ToolRegistry,
    builtin_tools,
)
from cortex_ray.storage import Store

calls: list[str] = []


async def echo(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    calls.append("echo")
    return {"echo": args["text"], "key": ctx.idempotency_key}


async def slow(ctx: ToolContext, args: dict[str, Any]) -> str:
    await asyncio.sleep(10)
    return "late"


async def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise RuntimeError("disk on fire")


async def big(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "x" * 100_000


ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 50}},
    "required": ["text"],
    "additionalProperties": False,
}
TOOLS = [
    Tool(name="echo", description="echo", handler=echo, parameters=ECHO_SCHEMA),
    Tool(name="slow", description="slow", handler=slow, timeout_s=0.05),
    Tool(name="slow_uncapped", description="slow", handler=slow),
    Tool(name="boom", description="boom", handler=boom),
    Tool(name="big", description="big", handler=big, action_type=ActionType.RETRIEVAL),
]
NAMES = ("echo", "slow", "slow_uncapped", "boom", "big", "current_time")


class Veto:
    async def before(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> str | None:
        return "no shouting" if str(args.get("text", "")).isupper() else None

    async def after(self, ctx: ToolContext, tool: Tool, observation: Observation) -> Observation:
        return observation.model_copy(
            update={"summary": observation.summary.replace("secret", "***")}
        )


@pytest.fixture
def dispatcher(store: Store) -> ToolDispatcher:
    registry = ToolRegistry([*builtin_tools(), *TOOLS])
    settings = Settings(tool_output_chars=200, tool_timeout_s=5)
    return ToolDispatcher(registry, AccessControlService(), store, settings.tools, hooks=[Veto()])


ALL = Grant(tools=frozenset({"*"}))


def ctx_for(org: str, grant: Grant | None = ALL, **kw: Any) -> InvocationContext:
    agent = Agent(org_id=org, name="a", mode=AgentMode.AUTONOMOUS, tools=NAMES, grant=grant)
    return InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS, **kw)


async def test_ok_call_is_audited_with_its_category(dispatcher, store, org, caplog) -> None:
    import uuid

    run_id = uuid.uuid4()
    with caplog.at_level(logging.INFO, logger="cortex_ray.act"):
        obs = await dispatcher.invoke(
            ctx_for(org, run_id=run_id, step_index=3), "echo", {"text": "secret hi"}
        )
    assert obs.status is ObservationStatus.OK
    assert obs.output["echo"] == "secret hi"
    assert obs.output["key"] == f"{run_id}:3"  # the idempotency key reaches the tool
    assert "***" in obs.summary  # the after-hook rewrote the summary
    assert obs.action_type is ActionType.GROUNDING
    rows = await store.audit_rows(org)
    assert [(r["tool"], r["status"], r["action_type"]) for r in rows] == [
        ("echo", "OK", "GROUNDING")
    ]
    assert rows[0]["principal_id"].startswith("agent:")
    assert rows[0]["idempotency_key"] == f"{run_id}:3"
    line = next(r for r in caplog.records if "dispatch tool=echo" in r.getMessage())
    assert "category=GROUNDING" in line.getMessage()
    assert line.action_type == "GROUNDING"  # type: ignore[attr-defined]


async def test_the_audit_log_keeps_no_credential_the_tool_received(dispatcher, store, org) -> None:
    """The tool gets the value it was called with; the audit row gets it scrubbed (the one
    scrubber of cortex_ray.observability)."""
    token = "ghp_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8"
    obs = await dispatcher.invoke(ctx_for(org), "echo", {"text": f"use {token}"})
    assert obs.status is ObservationStatus.OK and obs.output["echo"] == f"use {token}"
    row = (await store.audit_rows(org))[0]
    assert row["args"] == {"text": "use [REDACTED]"}
    obs = await dispatcher.invoke(ctx_for(org), "echo", {"text": "x", "password": "hunter2"})
    assert obs.status is ObservationStatus.REFUSED  # not in the schema, refused ...
    row = (await store.audit_rows(org))[-1]  # oldest first
    assert row["args"] == {"text": "x", "password": "[REDACTED]"}  # ... and still scrubbed


@pytest.mark.parametrize(
    ("tool", "args", "reason"),
    [
        ("nope", {}, "unknown tool 'nope'"),
        ("echo", {}, "invalid arguments: arguments: 'text' is a required property"),
        ("echo", {"text": 5}, "invalid arguments: text: 5 is not of type 'string'"),
        ("echo", {"text": "hi", "x": 1}, "invalid arguments"),
        ("echo", {"text": "HI"}, "hook: no shouting"),
    ],
)
async def test_refusals_are_recorded_never_raised(
    dispatcher, store, org, tool, args, reason
) -> None:
    calls.clear()
    obs = await dispatcher.invoke(ctx_for(org), tool, args)
    assert obs.status is ObservationStatus.REFUSED
    assert reason in obs.summary
    assert calls == []  # never executed
    rows = await store.audit_rows(org)
    assert rows[0]["status"] == "REFUSED" and reason in rows[0]["reason"]


async def test_access_denied_is_a_refusal(dispatcher, org) -> None:
    calls.clear()
    obs = await dispatcher.invoke(ctx_for(org, grant=None), "echo", {"text": "hi"})
    assert obs.status is ObservationStatus.REFUSED and "access denied" in obs.summary
    assert calls == []


async def test_timeout_error_and_output_bound(dispatcher, org) -> None:
    ctx = ctx_for(org)
    timed_out = await dispatcher.invoke(ctx, "slow", {})
    assert timed_out.status is ObservationStatus.TIMEOUT and "0.05s" in timed_out.summary
    failed = await dispatcher.invoke(ctx, "boom", {})
    assert failed.status is ObservationStatus.ERROR and "disk on fire" in failed.summary
    bounded = await dispatcher.invoke(ctx, "big", {})
    assert bounded.status is ObservationStatus.OK and bounded.truncated
    assert len(bounded.summary) == 200 and bounded.action_type is ActionType.RETRIEVAL


async def test_cancellation_is_audited_and_propagates(dispatcher, store, org) -> None:
    task = asyncio.create_task(dispatcher.invoke(ctx_for(org), "slow_uncapped", {}))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rows = await store.audit_rows(org)
    assert [(r["tool"], r["status"]) for r in rows] == [("slow_uncapped", "CANCELLED")]


def test_classifier_by_name_override_and_default() -> None:
    classifier = ActionClassifier({"echo": ActionType.RETRIEVAL})
    assert classifier.classify("memory_search") is ActionType.RETRIEVAL
    assert classifier.classify("remember_fact") is ActionType.LEARNING
    assert classifier.classify("current_time") is ActionType.GROUNDING  # the clock is the world
    assert classifier.classify("reply") is ActionType.GROUNDING  # dialogue is grounding
    assert classifier.classify("echo") is ActionType.RETRIEVAL
    assert classifier.classify("anything_else") is ActionType.GROUNDING
    override = Tool(
        name="memory_search", description="", handler=echo, action_type=ActionType.LEARNING
    )
    assert classifier.classify(override) is ActionType.LEARNING
    assert ActionType.REASONING not in {classifier.classify(t) for t in builtin_tools()}


def test_interactive_caller_sees_only_the_intersection(dispatcher) -> None:
    agent = Agent(
        org_id="acme",
        name="a",
        tools=NAMES,
        grant=Grant(tools=frozenset({"echo", "current_time", "big"})),
    )
    caller = Principal(id="u", org_id="acme", grant=Grant(tools=frozenset({"echo", "boom"})))
    names = [s.name for s in dispatcher.action_space(agent, caller, AgentMode.INTERACTIVE)]
    # The intersection, and the reply: dialogue needs neither the tool set nor a grant.
    assert names == ["echo", "reply"]
    autonomous = [s.name for s in dispatcher.action_space(agent, None, AgentMode.AUTONOMOUS)]
    assert autonomous == ["big", "current_time", "echo"]  # grouped: RETRIEVAL before GROUNDING
