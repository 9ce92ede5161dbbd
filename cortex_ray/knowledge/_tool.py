"""The agents' way into knowledge: a RETRIEVAL tool whose observations carry citations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cortex_ray._exceptions import AccessDeniedError, InvalidRequestError
from cortex_ray.act import KNOWLEDGE_SEARCH, Tool, ToolContext
from cortex_ray.knowledge._reading import readable_scope, source_warnings
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
        note: str | None = None
        if wanted is not None:
            if allowed is not None and wanted not in allowed:
                raise AccessDeniedError(f"collection {wanted!r} is not searchable by this tool")
            scope = wanted
            # Small models guess a collection name ("observatories") and, told the real
            # ones in an error, call it the same way until the budget ends (measured with
            # Qwen 1.5B, docs/benchmarks.md): a name that is not published searches every
            # collection the tool may, and the result says so.
            if not (await service.publication(ctx.org_id, wanted)).generations:
                published = sorted((await service.publication(ctx.org_id, allowed)).generations)
                if not published:
                    raise InvalidRequestError("no knowledge is published in this organisation")
                scope = allowed
                note = (
                    f"no published collection {wanted!r}: searched all of "
                    f"{', '.join(published)} instead"
                )
        # A collection with readers listed is searched only by them (and admins).
        names = [scope] if isinstance(scope, str) else (None if scope is None else list(scope))
        principal = ctx.principal
        scope = await readable_scope(
            service, ctx.org_id, principal.id, names, is_admin=principal.is_admin
        )
        result = await service.search(
            ctx.org_id, args["query"], collection=scope, k=args.get("k", 5)
        )
        async with service.db.connection() as conn:  # unhealthy sources: said with each hit
            warnings = await source_warnings(conn, ctx.org_id, [h.source_id for h in result.hits])
        return {
            **({"note": note} if note else {}),
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
                    **({"warning": warnings[h.source_id]} if h.source_id in warnings else {}),
                }
                for h in result.hits
            ],
            "tiers": [t.value for t in result.tiers],
            "skipped": result.skipped,
        }

    return replace(KNOWLEDGE_SEARCH, handler=handler)
