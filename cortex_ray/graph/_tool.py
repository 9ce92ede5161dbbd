"""The agents' way into the context graph: ``graph_search``, a RETRIEVAL tool whose facts
carry citations, their time of validity, and a warning when their source is unhealthy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cortex_ray.act import GRAPH_SEARCH, Tool, ToolContext
from cortex_ray.graph._store import GraphStore, Reader
from cortex_ray.graph._types import Fact, GraphResult

__all__ = ["graph_search_tool", "render_fact"]


def render_fact(f: Fact) -> dict[str, Any]:
    """A fact as an observation shows it: short, with its citation and validity."""
    out: dict[str, Any] = {
        "fact": f"{f.subject.type}:{f.subject.name} {f.predicate} {f.object.type}:{f.object.name}",
        "citation": f.citation,
        "confidence": f.confidence,
        "valid_from": f.valid_from.isoformat(),
    }
    if f.valid_to is not None:
        out["valid_to"] = f.valid_to.isoformat()
    if f.warning:
        out["warning"] = f.warning
    return out


def graph_search_tool(graph: GraphStore) -> Tool:
    """``graph_search``: facts about the entities a query names, and their neighbours."""

    async def handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        reader = Reader(ctx.principal.id, is_admin=ctx.principal.is_admin)
        query: str = args["query"]
        # "a, b" names two seeds; the whole query is a seed too (a name may hold a comma).
        terms = [query, *(query.split(",") if "," in query else ())]
        result: GraphResult = await graph.search(
            ctx.org_id,
            reader,
            terms=terms,
            depth=args.get("depth", 1),
            max_facts=args.get("max_facts", 20),
            predicates=[args["predicate"]] if args.get("predicate") else None,
        )
        if args.get("to"):
            target = await graph.search(ctx.org_id, reader, terms=[args["to"]], max_facts=1)
            if result.seeds and target.seeds:
                result = await graph.path(
                    ctx.org_id, reader, result.seeds[0].id, target.seeds[0].id, max_depth=3
                )
        return {
            "entities": [f"{e.type}:{e.name}" for e in result.seeds],
            "facts": [render_fact(f) for f in (result.path or result.facts)],
            **({"truncated": True} if result.truncated else {}),
            **({"warnings": result.warnings} if result.warnings else {}),
            **({"path_found": result.path is not None} if args.get("to") else {}),
        }

    return replace(GRAPH_SEARCH, handler=handler)
