"""The MCP tools cortex-ray offers, each one use case of the door called as the caller's
principal (the same access decisions and audit rows as the HTTP routes), rendered with the
HTTP API's own response bodies (``serve.schemas``), so a tool's structured result is what
the matching route answers.

A refusal or a bad request (unknown agent, access denied, a session that has ended) comes
back as a tool result with ``isError`` and the reason, as the error map of the API words it
(``serve._errors``): a model reads it and can correct itself; it is not a protocol error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Final
from uuid import UUID

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request

import cortex_ray
from cortex_ray import MemoryKind, Principal, Runtime, TurnEvent, events_until
from serve._deps import MAX_WAIT_S, ApiState, state_of
from serve._errors import report
from serve.mcp._waits import follow_run, run_body
from serve.schemas.graph import GraphSearchBody
from serve.schemas.knowledge import KnowledgeHit, KnowledgeSearch
from serve.schemas.memory import MemoryHit, MemorySearch
from serve.schemas.sessions import TurnStatusBody

__all__ = ["PRINCIPAL_KEY", "TOOL_NAMES", "build_server"]

PRINCIPAL_KEY: Final = "cortex_ray.principal"
"""The ASGI scope key under which the endpoint leaves the authenticated principal."""

TOOL_NAMES: Final = (
    "run_task",
    "get_run",
    "send_message",
    "knowledge_search",
    "graph_search",
    "memory_search",
)

Ctx = Context[Any, Any]

AgentRef = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[^\x00]+$", description="an agent's id or name"),
]
Query = Annotated[str, Field(min_length=1, max_length=2000, pattern=r"^[^\x00]+$")]
WaitS = Annotated[
    float,
    Field(
        ge=0,
        le=MAX_WAIT_S,
        description=f"seconds to wait for the work to end (at most {MAX_WAIT_S:g}); past it "
        "the answer says where it stands, and get_run (or the session) has the rest",
    ),
]


@dataclass(frozen=True, slots=True)
class _Caller:
    state: ApiState
    principal: Principal

    @property
    def runtime(self) -> Runtime:
        return self.state.runtime

    @property
    def org(self) -> str:
        return self.principal.org_id


def _caller(ctx: Ctx) -> _Caller:
    """The app's state and the principal the endpoint authenticated for this request."""
    request = ctx.request_context.request
    if not isinstance(request, Request) or PRINCIPAL_KEY not in request.scope:
        raise ToolError("cortex-ray's tools are served only by the API's /mcp/{org} endpoint")
    principal = request.scope[PRINCIPAL_KEY]
    assert isinstance(principal, Principal)
    return _Caller(state_of(request), principal)


@contextmanager
def _reported(tool: str) -> Iterator[None]:
    """A failed use case as a tool error worded as the API words it (a server error's
    detail stays in the log, under the correlation id given)."""
    try:
        yield
    except ToolError:
        raise
    except Exception as exc:
        problem = report(exc, what=f"MCP tool {tool}")
        raise ToolError(
            f"{problem.code} ({problem.status}): {problem.message} "
            f"[correlation id {problem.correlation_id}]"
        ) from exc


def _json(body: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = body.model_dump(mode="json", by_alias=True)
    return dumped


# the tools ---------------------------------------------------------------------------------


async def run_task(
    agent: AgentRef,
    goal: Annotated[str, Field(min_length=1, max_length=20_000, description="the objective")],
    ctx: Ctx,
    max_steps: Annotated[
        int | None, Field(ge=1, description="step budget (default: the server's, 8)")
    ] = None,
    name: Annotated[str, Field(max_length=200, description="a name for the run")] = "",
    wait_s: WaitS = 30.0,
) -> dict[str, Any]:
    """Run a task on an AUTONOMOUS agent: the agent works toward the goal, one step at a
    time, until it finishes or its step budget ends. Reports a progress notification per
    step (when the request carries a progress token) and returns the run with its step log
    and result once it has ended; if it has not ended within wait_s, returns the run as it
    stands (done: false): call get_run with its id later."""
    caller = _caller(ctx)
    with _reported("run_task"):
        run = await caller.runtime.start_run(
            caller.org,
            agent,
            goal,
            max_steps=max_steps,
            name=name,
            caller_id=caller.principal.id,
            principal=caller.principal,
        )
        await caller.state.executor.start_run(caller.org, run.id)
        run = await follow_run(caller.runtime, caller.principal, run, wait_s, ctx, seen=0)
        return run_body(run)


async def get_run(
    run_id: Annotated[UUID, Field(description="the run's id (from run_task)")],
    ctx: Ctx,
    wait_s: WaitS = 0.0,
) -> dict[str, Any]:
    """A task run: status (RUNNING, AWAITING_APPROVAL, COMPLETED, FAILED, CANCELLED), its
    step log and its result; wait_s > 0 waits that long for a RUNNING run to end, reporting
    each new step as progress."""
    caller = _caller(ctx)
    with _reported("get_run"):
        run = await caller.runtime.get_run(caller.org, run_id, principal=caller.principal)
        run = await follow_run(
            caller.runtime, caller.principal, run, wait_s, ctx, seen=len(run.steps)
        )
        return run_body(run)


def _describe(event: TurnEvent) -> str:
    if event.tool is not None:
        return f"{event.kind.value}: {event.tool}"
    return event.kind.value


async def send_message(
    message: Annotated[str, Field(min_length=1, max_length=20_000)],
    ctx: Ctx,
    agent: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=200,
            pattern=r"^[^\x00]+$",
            description="open a new session with this INTERACTIVE agent (its id or name)",
        ),
    ] = None,
    session_id: Annotated[
        UUID | None, Field(description="continue this session (yours, still open)")
    ] = None,
    wait_s: WaitS = MAX_WAIT_S,
) -> dict[str, Any]:
    """Send a message to an agent in a conversation: give agent to open a new session, or
    session_id (from an earlier answer) to continue one. Returns the turn with the agent's
    reply; its tool calls and observations are reported as progress while it runs. A turn
    not ended within wait_s keeps running: its reply lands in the session's history."""
    caller = _caller(ctx)
    with _reported("send_message"):
        if (agent is None) == (session_id is None):
            raise ToolError("give either agent (to open a session) or session_id, not both")
        runtime, org, principal = caller.runtime, caller.org, caller.principal
        if session_id is None:
            assert agent is not None
            session_id = (await runtime.open_session(org, agent, principal)).id
        turn = await runtime.accept_turn(org, session_id, message, principal=principal)
        events: asyncio.Queue[TurnEvent] = asyncio.Queue()
        running = caller.state.keep(
            asyncio.ensure_future(
                caller.state.executor.turn(
                    org,
                    session_id,
                    principal,
                    turn.message,
                    turn_id=turn.id,
                    on_event=events.put_nowait,
                )
            )
        )
        seen = 0
        try:
            async with asyncio.timeout(wait_s):  # never cancels the turn: events_until
                async for event in events_until(running, events):
                    seen += 1
                    await ctx.report_progress(seen, None, _describe(event))
        except TimeoutError:
            pass
        record = await runtime.get_turn(org, session_id, turn.id, principal=principal)
        return {**_json(TurnStatusBody.of(record)), "done": record.status.ended}


async def knowledge_search(
    query: Query,
    ctx: Ctx,
    collections: Annotated[
        list[str] | None, Field(max_length=16, description="search only these collections")
    ] = None,
    k: Annotated[int, Field(ge=1, le=50)] = 10,
) -> dict[str, Any]:
    """Hybrid search (BM25 + vectors, fused, reranked where available) over the
    organisation's published knowledge; every hit carries its citation (path:lines @version)
    and its source id. Needs knowledge_search granted (or an admin)."""
    caller = _caller(ctx)
    with _reported("knowledge_search"):
        result = await caller.runtime.search_knowledge(
            caller.org, query, collection=collections or None, k=k, principal=caller.principal
        )
        return _json(
            KnowledgeSearch(
                query=result.query,
                hits=[KnowledgeHit.of(h) for h in result.hits],
                tiers=result.tiers,
                fusion=result.fusion,
                reranked=result.reranked,
                reranker=result.reranker,
                skipped=result.skipped,
                publications=result.publications,
            )
        )


async def graph_search(
    terms: Annotated[
        list[str], Field(min_length=1, max_length=16, description="names, aliases or ids")
    ],
    ctx: Ctx,
    depth: Annotated[int, Field(ge=1, le=4)] = 1,
    max_facts: Annotated[int, Field(ge=1, le=500)] = 50,
    per_entity: Annotated[int, Field(ge=1, le=200)] = 10,
    predicates: Annotated[list[str] | None, Field(max_length=16)] = None,
) -> dict[str, Any]:
    """The context graph around the entities these terms name: neighbours within depth
    hops, each fact with its provenance (source, version, evidence span). Facts from
    sources the caller may not read are left out. Needs graph_search granted (or an
    admin)."""
    caller = _caller(ctx)
    with _reported("graph_search"):
        result = await caller.runtime.search_graph(
            caller.org,
            terms=[t for t in terms if t.strip() and "\x00" not in t],
            depth=depth,
            max_facts=max_facts,
            per_entity=per_entity,
            predicates=predicates or None,
            principal=caller.principal,
        )
        return _json(GraphSearchBody.of(result))


async def memory_search(
    agent: AgentRef,
    query: Query,
    ctx: Ctx,
    k: Annotated[int, Field(ge=1, le=50)] = 5,
    kinds: Annotated[list[MemoryKind] | None, Field(max_length=3)] = None,
) -> dict[str, Any]:
    """Recall an agent's long-term memory (episodic, semantic, procedural), ranked by
    similarity, recency and importance. Needs memory_search granted with this agent (or an
    admin)."""
    caller = _caller(ctx)
    with _reported("memory_search"):
        found, hits = await caller.runtime.search_memory(
            caller.org, agent, query, k=k, kinds=kinds or None, principal=caller.principal
        )
        return _json(
            MemorySearch(agent_id=found.id, query=query, results=[MemoryHit.of(h) for h in hits])
        )


def build_server() -> MCPServer[Any]:
    """The MCP server with cortex-ray's tools (transport-free: the endpoint serves it)."""
    server: MCPServer[Any] = MCPServer(
        name="cortex-ray",
        version=cortex_ray.__version__,
        instructions="Run tasks on cortex-ray agents, talk with them, and search the "
        "organisation's knowledge, context graph and agent memory.",
    )
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    acts = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)
    server.add_tool(run_task, annotations=acts)
    server.add_tool(get_run, annotations=reads)
    server.add_tool(send_message, annotations=acts)
    server.add_tool(knowledge_search, annotations=reads)
    server.add_tool(graph_search, annotations=reads)
    server.add_tool(memory_search, annotations=reads)
    return server
