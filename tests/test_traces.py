"""One trace per run, kept locally when no collector is set: the span tree of a real run on
PostgreSQL (scripted model as the test double), GenAI names and attributes, the access
decision on tool spans, content capture off by default and scrubbed when on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cortex_ray import AgentMode, Grant, ObservationStatus, RunStatus
from cortex_ray.act import InvocationContext
from cortex_ray.models import ChatRequest, ScriptedModelClient
from cortex_ray.observability import (
    RunTrace,
    TraceSpan,
    activate_provider,
    deactivate_provider,
    tracer,
    waterfall,
)

SECRET = "ghp_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8"


def plan(steps: list[dict[str, Any]]) -> Callable[[ChatRequest], str]:
    state = {"step": -1}

    def respond(request: ChatRequest) -> str:
        assert request.schema_name == "proposals", request.schema_name
        state["step"] += 1
        return json.dumps({"candidates": [steps[min(state["step"], len(steps) - 1)]]})

    return respond


def by_name(trace: RunTrace, prefix: str) -> list[TraceSpan]:
    return [s for s in trace.spans if s.name.startswith(prefix)]


def parent(trace: RunTrace, span: TraceSpan) -> TraceSpan:
    return next(s for s in trace.spans if s.span_id == span.parent_span_id)


async def test_a_run_is_one_connected_tree_of_genai_spans(scripted_runtime, org: str) -> None:
    model = ScriptedModelClient(
        responder=plan(
            [
                {"tool": "current_time", "args": {}, "rationale": "need the time"},
                {"finish": True, "message": "It is late.", "rationale": "done"},
            ]
        )
    )
    runtime = await scripted_runtime(model)
    assert runtime.tracing is not None and runtime.tracing.sinks == ("local",)
    agent = await runtime.create_agent(org, "clock", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "what time is it", max_steps=4)
    assert run.status is RunStatus.COMPLETED

    trace = await runtime.run_trace(org, run.id)
    assert len(trace.trace_ids) == 1 and trace.spans
    # Submitted outside any span: a span of the submission is the root, so that a collector
    # sees a tree with no missing parent; every attempt hangs under it.
    (submitted,) = [s for s in trace.spans if s.depth == 0]
    assert submitted.name == "submit_task clock" and run.trace_parent is not None
    assert submitted.attributes["cortex.run_id"] == str(run.id)
    assert run.trace_parent.split("-")[2] == submitted.span_id
    (root,) = [s for s in trace.spans if s.depth == 1]
    assert root.name == "invoke_agent clock" and root.status != "ERROR"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.id"] == str(agent.id)
    assert root.attributes["cortex.run_id"] == str(run.id)
    assert root.attributes["cortex.status"] == "COMPLETED"
    ids = {s.span_id for s in trace.spans}
    assert all(s.parent_span_id in ids for s in trace.spans if s is not submitted)  # connected

    steps = by_name(trace, "step ")
    assert [s.name for s in steps] == ["step 0", "step 1"]
    assert all(parent(trace, s) == root for s in steps)
    phases = [s.name for s in trace.spans if s.parent_span_id == steps[0].span_id]
    assert phases == ["perceive", "decide", "execute_tool current_time", "learn"]
    (tool,) = by_name(trace, "execute_tool")
    assert tool.attributes["gen_ai.tool.name"] == "current_time"
    assert tool.attributes["cortex.action_type"] == "GROUNDING"
    assert tool.attributes["cortex.access"] == "allowed"
    chats = by_name(trace, "chat ")
    assert len(chats) == 2  # one proposal call per step (K=1)
    for chat in chats:
        assert parent(trace, parent(trace, chat)).name == "decide"  # decide > propose > chat
        assert chat.kind == "CLIENT" and chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == model.name
        assert "gen_ai.input.messages" not in chat.attributes  # capture is off by default
    assert by_name(trace, "embeddings ")  # the memory read of PERCEIVE, the writes of LEARN

    lines = waterfall(trace)
    assert len(lines) == len(trace.spans)
    assert lines[0].startswith("submit_task clock") and "execute_tool current_time" in "".join(
        lines
    )
    assert any("[GROUNDING, allowed]" in line for line in lines)


async def test_a_failed_run_and_a_denied_tool_are_errors_in_the_trace(
    scripted_runtime, org: str
) -> None:
    # The planner offers only granted tools, so a model naming another fails the run ...
    model = ScriptedModelClient(
        responder=plan([{"tool": "remember_fact", "args": {"subject": "s", "fact": "f"}}])
    )
    runtime = await scripted_runtime(model)
    agent = await runtime.create_agent(
        org,
        "denied",
        mode=AgentMode.AUTONOMOUS,
        tools=["remember_fact", "current_time"],
        grant=Grant(tools=frozenset({"current_time"})),
    )
    run = await runtime.run_autonomous(org, agent.id, "remember something", max_steps=2)
    assert run.status is RunStatus.FAILED
    trace = await runtime.run_trace(org, run.id)
    (root,) = by_name(trace, "invoke_agent denied")
    assert root.status == "ERROR" and root.attributes["cortex.status"] == "FAILED"
    assert root.status_message and "remember" not in root.name
    # ... and the gate itself, asked for it anyway, denies it: the span says so.
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    activate_provider(provider)
    try:
        ctx = InvocationContext(agent=agent, caller=None, mode=AgentMode.AUTONOMOUS)
        obs = await runtime.dispatcher.invoke(ctx, "remember_fact", {"subject": "s", "fact": "f"})
        await runtime.dispatcher.invoke(ctx, "no_such_tool", {})
    finally:
        deactivate_provider(provider)
    assert obs.status is ObservationStatus.REFUSED
    denied, unknown = exporter.get_finished_spans()
    assert denied.name == "execute_tool remember_fact"
    assert denied.attributes["cortex.access"] == "denied"
    assert denied.status.status_code.name == "ERROR"
    assert unknown.attributes["cortex.access"] == "refused"  # not the grant: the tool is unknown


async def test_content_is_captured_only_when_asked_and_then_scrubbed(
    scripted_runtime, org: str
) -> None:
    model = ScriptedModelClient(
        responder=plan(
            [
                {
                    "tool": "remember_fact",
                    "args": {"subject": "deploy key", "fact": f"the token is {SECRET}"},
                },
                {"finish": True, "message": "kept", "rationale": "done"},
            ]
        )
    )
    runtime = await scripted_runtime(model, capture_content=True, max_content_chars=256)
    agent = await runtime.create_agent(
        org, "keeper", mode=AgentMode.AUTONOMOUS, tools=["remember_fact"]
    )
    run = await runtime.run_autonomous(org, agent.id, f"remember that {SECRET}", max_steps=3)
    assert run.status is RunStatus.COMPLETED
    trace = await runtime.run_trace(org, run.id)
    (tool,) = by_name(trace, "execute_tool remember_fact")
    args = tool.attributes["gen_ai.tool.call.arguments"]
    assert "[REDACTED]" in args and SECRET not in args and "deploy key" in args
    chat = by_name(trace, "chat ")[0]
    sent = chat.attributes["gen_ai.input.messages"]
    assert SECRET not in sent and len(sent) <= 256 + 64  # bounded (JSON of bounded messages)
    everything = json.dumps([s.attributes for s in trace.spans])
    assert SECRET not in everything


async def test_an_unknown_run_has_no_trace(scripted_runtime, org: str) -> None:
    from uuid import uuid4

    from cortex_ray import NotFoundError

    runtime = await scripted_runtime(None)
    with pytest.raises(NotFoundError):
        await runtime.run_trace(org, uuid4())


async def test_a_resumed_run_continues_its_trace_and_links_the_crashed_attempt(
    scripted_runtime, org: str
) -> None:
    model = ScriptedModelClient(
        responder=plan(
            [
                {"tool": "current_time", "args": {}, "rationale": "need the time"},
                {"finish": True, "message": "It is late.", "rationale": "done"},
            ]
        )
    )
    runtime = await scripted_runtime(model)
    agent = await runtime.create_agent(org, "phoenix", mode=AgentMode.AUTONOMOUS)
    run = await runtime.start_run(org, agent.id, "what time is it", max_steps=4)
    assert run.trace_parent is not None  # the submission's span stands for the run

    def crash(step: Any) -> None:
        raise RuntimeError("process died")

    with pytest.raises(RuntimeError):
        await runtime.drive_run(org, run.id, on_step=crash)
    assert (await runtime.drive_run(org, run.id)).status is RunStatus.COMPLETED

    trace = await runtime.run_trace(org, run.id)
    assert trace.trace_ids == [run.trace_parent.split("-")[1]]  # one trace, the run's
    first, second = by_name(trace, "invoke_agent phoenix")
    assert first.status == "ERROR" and second.attributes["cortex.status"] == "COMPLETED"
    assert second.attributes["cortex.resumed_at_step"] == 1
    (link,) = second.links
    assert link["span_id"] == first.span_id and link["trace_id"] == first.trace_id
    assert [s.name for s in by_name(trace, "step ")] == ["step 0", "step 1"]  # not redone


async def test_a_run_started_inside_a_callers_span_joins_its_trace(
    scripted_runtime, org: str
) -> None:
    model = ScriptedModelClient(
        responder=plan([{"finish": True, "message": "done", "rationale": "nothing to do"}])
    )
    runtime = await scripted_runtime(model)
    agent = await runtime.create_agent(org, "joiner", mode=AgentMode.AUTONOMOUS)
    with tracer.start_as_current_span("caller") as caller:
        run = await runtime.start_run(org, agent.id, "nothing", max_steps=2)
    ctx = caller.get_span_context()
    assert (
        run.trace_parent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    )
    await runtime.drive_run(org, run.id)
    trace = await runtime.run_trace(org, run.id)
    names = {s.name: s for s in trace.spans}
    assert names["invoke_agent joiner"].parent_span_id == format(ctx.span_id, "016x")
    assert names["caller"].depth == 0 and names["invoke_agent joiner"].depth == 1


async def test_the_local_store_keeps_a_batch_sent_twice_once(db, store, org: str) -> None:
    """A batch goes in with one COPY; one sent again (a lost reply) must not fail or
    duplicate: it falls back to inserts that skip what is kept."""
    import asyncio
    from datetime import timedelta

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cortex_ray.observability import PostgresSpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    test_tracer = provider.get_tracer("test")
    with (
        test_tracer.start_as_current_span("outer", attributes={"cortex.org_id": org}),
        test_tracer.start_as_current_span("inner", attributes={"n": (1, 2)}),
    ):
        pass
    spans = memory.get_finished_spans()
    exporter = PostgresSpanExporter(db.dsn, retention=timedelta(days=7))
    try:
        for _ in range(2):
            assert (await asyncio.to_thread(exporter.export, spans)).name == "SUCCESS"
    finally:
        exporter.shutdown()
    rows = await store.spans_of_trace(org, format(spans[0].context.trace_id, "032x"))
    assert sorted(r["name"] for r in rows) == ["inner", "outer"]
    inner = next(r for r in rows if r["name"] == "inner")
    assert inner["attributes"] == {"n": [1, 2]} and inner["links"] == []


# --- a real OTLP receiver ---------------------------------------------------------------------


def _phoenix() -> str | None:
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / ".venv" / "tools" / "phoenix" / "bin"
    return str(shipped / "phoenix") if (shipped / "phoenix").exists() else None


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Arize Phoenix (an OTLP collector with a UI that reads GenAI spans), in its own venv
    (./dev setup), on free ports; its base URL."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    binary = _phoenix()
    if binary is None:
        pytest.skip("no Phoenix: ./dev setup installs arize-phoenix into .venv/tools/phoenix")

    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    home = tmp_path_factory.mktemp("phoenix")
    port = free()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(home),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free()),
    }
    log = (home / "log").open("w")
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((home / "log").read_text()[-3000:]) from None
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


async def test_a_runs_spans_reach_a_real_otlp_collector(
    phoenix: str, scripted_runtime, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the standard OTLP variables set, a run's spans go to Phoenix over OTLP/HTTP (and
    are not kept locally); Phoenix reads them back as one trace and recognises the GenAI
    operations: the agent invocation, the model calls and the tool call."""
    import asyncio
    import uuid

    import httpx2

    project = f"cortex-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{phoenix}/v1/traces")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")
    model = ScriptedModelClient(
        responder=plan(
            [
                {"tool": "current_time", "args": {}, "rationale": "need the time"},
                {"finish": True, "message": "It is late.", "rationale": "done"},
            ]
        )
    )
    runtime = await scripted_runtime(model)
    assert runtime.tracing is not None and runtime.tracing.sinks == ("otlp",)
    agent = await runtime.create_agent(org, "exported", mode=AgentMode.AUTONOMOUS)
    run = await runtime.run_autonomous(org, agent.id, "what time is it", max_steps=4)
    assert run.status is RunStatus.COMPLETED
    assert (await runtime.run_trace(org, run.id)).spans == []  # sent away, not kept here
    assert runtime.tracing.flush()

    spans: list[dict[str, Any]] = []
    for _ in range(40):  # Phoenix writes what it received in the background
        url = f"{phoenix}/v1/projects/{project}/spans?limit=200"
        async with httpx2.AsyncClient(timeout=5) as client:
            r = await client.get(url)
        # 404 until the project's first span is written
        spans = r.json()["data"] if r.status_code == 200 else []
        if any(s["name"] == "invoke_agent exported" for s in spans):
            break
        await asyncio.sleep(0.25)
    names = {s["name"] for s in spans}
    for name in ["invoke_agent exported", "step 0", "perceive", "decide", "learn"]:
        assert name in names, names
    assert {s["context"]["trace_id"] for s in spans} == {spans[0]["context"]["trace_id"]}
    ids = {s["context"]["span_id"] for s in spans}
    (root,) = [s for s in spans if s["parent_id"] is None]
    assert root["name"] == "submit_task exported"  # the submission, in the caller's process
    assert all(s["parent_id"] in ids for s in spans if s is not root)  # one connected tree
    (invocation,) = [s for s in spans if s["name"] == "invoke_agent exported"]
    assert invocation["parent_id"] == root["context"]["span_id"]
    kinds = {s["name"]: s["span_kind"] for s in spans}
    assert kinds["invoke_agent exported"] == "AGENT"
    assert kinds[f"chat {model.name}"] == "LLM"
    assert kinds["execute_tool current_time"] == "TOOL"
    (tool,) = [s for s in spans if s["name"] == "execute_tool current_time"]
    assert tool["attributes"]["cortex.action_type"] == "GROUNDING"
    assert tool["attributes"]["cortex.access"] == "allowed"
