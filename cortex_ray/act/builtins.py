"""Built-in tools: memory search (RETRIEVAL), remember a fact and propose a procedural edit
(LEARNING), the clock and the reply to a person (GROUNDING; dialogue is a grounding action),
and the declarations of the two search tools whose services live elsewhere
(``knowledge_search``, bound by ``cortex_ray.knowledge``; ``graph_search``, bound by
``cortex_ray.graph``).

Every built-in declares its CoALA category and capability tier here, on its ``Tool``: the
``ActionClassifier`` reads them, so a new built-in has no name map to be added to.

The two that write are idempotent by the call's key (``ToolContext.idempotency_key``): a
second call with the same key (a run step decided again after a crash, a retried turn round,
a repeated direct call's ``Idempotency-Key``) returns what the first call wrote and writes
nothing. Their rows carry the run, step and session that wrote them.
"""

from __future__ import annotations

from typing import Any

from cortex_ray._exceptions import ConfigurationError
from cortex_ray._types import ActionType, CapabilityTier, MemoryKind
from cortex_ray.act._tools import Tool, ToolContext, ToolHandler

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "GRAPH_SEARCH",
    "KNOWLEDGE_SEARCH",
    "builtin_declarations",
    "builtin_tools",
]


def _memory(ctx: ToolContext) -> Any:
    if ctx.memory is None:
        raise ConfigurationError("this runtime has no memory service")
    return ctx.memory


async def _current_time(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    now = ctx.clock()
    return {"utc": now.isoformat(timespec="seconds"), "weekday": now.strftime("%A")}


async def _reply(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    # Delivery is the runtime's job (the reply joins the conversation in the same
    # transaction as the turn's records); the gate still checks, audits and logs it.
    return {"delivered": True, "message": args["message"]}


async def _memory_search(ctx: ToolContext, args: dict[str, Any]) -> list[dict[str, Any]]:
    k = args.get("k", 5)
    # The run's own steps are its progress already: finding them again (and each quoting
    # what the earlier searches found) is what made small models search in a loop.
    run = ctx.run_id
    own = (ctx.step_index or 0) if run is not None else 0  # at most one memory per step
    hits = await _memory(ctx).recall(
        org_id=ctx.org_id, agent_id=ctx.agent.id, query=args["query"], k=k + own
    )
    if run is not None:
        hits = [
            h for h in hits if h.memory.run_id != run or h.memory.kind is not MemoryKind.EPISODIC
        ]
    hits = hits[:k]
    return [
        {
            "kind": h.memory.kind.value,
            "content": h.memory.content,
            "subject": h.memory.subject,
            "recorded_at": h.memory.recorded_at.isoformat(timespec="seconds"),
            "score": round(h.score, 3),
        }
        for h in hits
    ]


async def _remember_fact(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    # Importance is never waited for here (the model rescores after the write, or the
    # inline scoring is bounded by importance_timeout_s): the tool's timeout is the write's.
    record = await _memory(ctx).write(
        org_id=ctx.org_id,
        agent_id=ctx.agent.id,
        kind=MemoryKind.SEMANTIC,
        content=args["fact"],
        subject=" ".join(args["subject"].lower().split()),
        run_id=ctx.run_id,
        session_id=ctx.session_id,
        step_index=ctx.step_index if ctx.run_id is not None else None,
        metadata={"source": "remember_fact", "principal": ctx.principal.id},
        idempotency_key=ctx.idempotency_key,
    )
    return {"remembered": True, "id": str(record.id), "subject": record.subject}


async def _propose_procedural_edit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    value: str | list[str] = args["value"]
    if args["field"] == "skills":
        value = [s.strip() for s in str(args["value"]).split("\n") if s.strip()]
    proposal = await _memory(ctx).propose_edit(
        org_id=ctx.org_id,
        agent_id=ctx.agent.id,
        field=args["field"],
        value=value,
        rationale=args.get("rationale", ""),
        proposed_by=ctx.principal,
        idempotency_key=ctx.idempotency_key,
        run_id=ctx.run_id,
        step_index=ctx.step_index,
        session_id=ctx.session_id,
    )
    return {
        "proposal_id": str(proposal.id),
        "status": proposal.status.value,
        "note": "takes effect only when a person approves it",
    }


def builtin_tools() -> list[Tool]:
    """The built-in tools every runtime registers, each with its category and tier."""
    return [
        Tool(
            name="current_time",
            description="Read the current date and time (UTC).",
            handler=_current_time,
            action_type=ActionType.GROUNDING,  # the clock is the outside world
            tier=CapabilityTier.READ,
            idempotent=True,
        ),
        Tool(
            name="reply",
            description="Say something to the person you are talking with.",
            handler=_reply,
            parameters={
                "type": "object",
                "properties": {"message": {"type": "string", "minLength": 1, "maxLength": 8000}},
                "required": ["message"],
                "additionalProperties": False,
            },
            action_type=ActionType.GROUNDING,  # dialogue is a grounding action
            tier=CapabilityTier.WRITE,  # a reply reaches a person: it changes what they know
        ),
        Tool(
            name="memory_search",
            description="Search your long-term memory (past steps, conversations, facts).",
            handler=_memory_search,
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "k": {"type": "integer", "minimum": 1, "maximum": 20},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            action_type=ActionType.RETRIEVAL,
            tier=CapabilityTier.READ,
            idempotent=True,
        ),
        Tool(
            name="remember_fact",
            description="Store a fact about the world or a person; a newer fact about the "
            "same subject replaces the older one.",
            handler=_remember_fact,
            parameters={
                "type": "object",
                "properties": {
                    "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                    "fact": {"type": "string", "minLength": 1, "maxLength": 4000},
                },
                "required": ["subject", "fact"],
                "additionalProperties": False,
            },
            action_type=ActionType.LEARNING,
            tier=CapabilityTier.WRITE,
        ),
        Tool(
            name="propose_procedural_edit",
            description="Propose a change to your own persona or skills (one skill per line); "
            "a person must approve it before it takes effect.",
            handler=_propose_procedural_edit,
            parameters={
                "type": "object",
                "properties": {
                    "field": {"type": "string", "enum": ["persona", "skills"]},
                    "value": {"type": "string", "minLength": 1, "maxLength": 8000},
                    "rationale": {"type": "string", "maxLength": 2000},
                },
                "required": ["field", "value"],
                "additionalProperties": False,
            },
            action_type=ActionType.LEARNING,
            tier=CapabilityTier.WRITE,
        ),
    ]


BUILTIN_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in builtin_tools())


def _unbound(service: str) -> ToolHandler:
    async def handler(ctx: ToolContext, args: dict[str, Any]) -> Any:
        raise ConfigurationError(f"this runtime has no {service}")

    return handler


KNOWLEDGE_SEARCH = Tool(
    name="knowledge_search",
    description="Search the organisation's documents; every hit has a citation "
    "(path:lines (headings) @version) to quote.",
    handler=_unbound("knowledge service"),
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 2000},
            "k": {"type": "integer", "minimum": 1, "maximum": 20},
            "collection": {"type": "string", "minLength": 1, "maxLength": 128},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    action_type=ActionType.RETRIEVAL,
    tier=CapabilityTier.READ,
    idempotent=True,
)
"""``knowledge_search`` as declared; ``cortex_ray.knowledge.knowledge_search_tool`` binds its
handler to a knowledge service."""

GRAPH_SEARCH = Tool(
    name="graph_search",
    description="Facts about an entity (a name, e-mail, issue id, path, table...) and its "
    "neighbours, each with a citation; with `to`, how two entities are connected.",
    handler=_unbound("context graph"),
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "depth": {"type": "integer", "minimum": 1, "maximum": 3},
            "max_facts": {"type": "integer", "minimum": 1, "maximum": 50},
            "predicate": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$"},
            "to": {"type": "string", "minLength": 1, "maxLength": 500},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    action_type=ActionType.RETRIEVAL,
    tier=CapabilityTier.READ,
    idempotent=True,
)
"""``graph_search`` as declared; ``cortex_ray.graph.graph_search_tool`` binds its handler to
a graph store."""


def builtin_declarations() -> tuple[Tool, ...]:
    """Every built-in tool as declared: those every runtime registers, then the two search
    tools a runtime registers when it has their service. The ``ActionClassifier`` classifies
    a name as the built-in of that name declares."""
    return (*builtin_tools(), KNOWLEDGE_SEARCH, GRAPH_SEARCH)
