"""The agents' way into knowledge: a RETRIEVAL tool whose observations carry citations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError
from cortex_ray._types import ActionType
from cortex_ray.act import Tool, ToolContext
from cortex_ray.knowledge._service import KnowledgeService

__all__ = ["knowledge_search_tool"]

_TEXT_CHARS = 700


def knowledge_search_tool(
    service: KnowledgeService, *, collections: Sequence[str] | None = None
) -> Tool:
    """``knowledge_search``: hybrid search over the organisation's published knowledge.

    Args:
        service: the knowledge service the tool searches with.
        collections: the collections agents may search (``None``: every collection of the
            caller's organisation). A ``collection`` argument must be one of them.
    """
    allowed = tuple(collections) if collections is not None else None

    async def handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        wanted = args.get("collection")
        scope: str | Sequence[str] | None = allowed
        if wanted is not None:
            if allowed is not None and wanted not in allowed:
                raise AccessDeniedError(f"collection {wanted!r} is not searchable by this tool")
            scope = wanted
            # A model that guesses a collection name would read "no hits" as "not known":
            # say which collections there are instead.
            if not (await service.publication(ctx.org_id, wanted)).generations:
                published = sorted((await service.publication(ctx.org_id, allowed)).generations)
                raise InvalidRequestError(
                    f"no published collection {wanted!r}; search without a collection, or "
                    f"name one of: {', '.join(published) or '(none published)'}"
                )
        result = await service.search(
            ctx.org_id, args["query"], collection=scope, k=args.get("k", 5)
        )
        return {
            "hits": [
                {
                    "citation": h.citation,
                    "text": h.text[:_TEXT_CHARS] + ("…" if len(h.text) > _TEXT_CHARS else ""),
                    "source_id": str(h.source_id),
                    "version": h.version,
                    "path": h.path,
                    "lines": [h.line_start, h.line_end],
                    "bytes": [h.byte_start, h.byte_end],
                    "score": round(h.score, 4),
                }
                for h in result.hits
            ],
            "tiers": [t.value for t in result.tiers],
            "skipped": result.skipped,
        }

    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 2000},
            "k": {"type": "integer", "minimum": 1, "maximum": 20},
            "collection": {"type": "string", "minLength": 1, "maxLength": 128},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    return Tool(
        name="knowledge_search",
        description="Search the organisation's documents; every hit has a citation "
        "(path:lines (headings) @version) to quote.",
        handler=handler,
        parameters=schema,
        action_type=ActionType.RETRIEVAL,
        idempotent=True,
    )
