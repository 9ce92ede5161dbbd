"""What a reader of knowledge may read, and what it should be told about what it reads.

- Collection readers (``kb_collection_readers``): a collection with readers listed is
  readable only by them (and admins); without, by every member. Knowledge search and the
  context graph both apply it (``readable_scope``, ``denied_collections``).
- Source warnings: hits and facts from a source whose collection's latest health report
  has findings other than ``UNKNOWN_FRESHNESS`` carry a warning (``source_warnings``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from uuid import UUID

from cortex_ray._exceptions import AccessDeniedError
from cortex_ray.knowledge._service import KnowledgeService
from cortex_ray.storage import Conn

__all__ = ["denied_collections", "readable_scope", "source_warnings", "warning_text"]

_DENIED = """
SELECT collection FROM kb_collection_readers WHERE org_id = %s
GROUP BY collection HAVING NOT bool_or(principal_id = %s)
"""


async def denied_collections(
    conn: Conn, org_id: str, principal_id: str, *, is_admin: bool = False
) -> list[str]:
    """The collections whose readers are listed without ``principal_id`` (none for admins)."""
    if is_admin:
        return []
    rows = await (await conn.execute(_DENIED, (org_id, principal_id))).fetchall()
    return sorted(r["collection"] for r in rows)


async def readable_scope(
    service: KnowledgeService,
    org_id: str,
    principal_id: str,
    wanted: Sequence[str] | None,
    *,
    is_admin: bool = False,
) -> list[str] | None:
    """The collections a search by ``principal_id`` may cover: ``wanted`` (``None``: every
    published collection) without the denied ones.

    Raises:
        AccessDeniedError: A wanted collection is denied, or every published one is.
    """
    async with service.db.connection() as conn:
        denied = set(await denied_collections(conn, org_id, principal_id, is_admin=is_admin))
    if not denied:
        return None if wanted is None else list(wanted)
    if wanted is not None:
        refused = sorted(set(wanted) & denied)
        if refused:
            raise AccessDeniedError(f"collection {refused[0]!r} is not readable by {principal_id}")
        return list(wanted)
    readable = sorted(set((await service.publication(org_id, None)).generations) - denied)
    if not readable:
        raise AccessDeniedError(f"no published collection is readable by {principal_id}")
    return readable


def warning_text(path: str, kinds: Iterable[str], version: int | None) -> str:
    """What a hit or fact from an unhealthy source says about it."""
    at = f" (latest version v{version})" if version is not None else ""
    return f"source {path} is {' and '.join(sorted(kinds))}{at}: this may be out of date"


async def source_warnings(conn: Conn, org_id: str, source_ids: Sequence[UUID]) -> dict[UUID, str]:
    """The warning of each unhealthy source among ``source_ids``, from its collection's
    latest health report."""
    if not source_ids:
        return {}
    rows = await (
        await conn.execute(
            """
            SELECT f.source_id, s.path, array_agg(f.kind ORDER BY f.kind) AS kinds,
                   max(f.latest_version) AS version
            FROM kb_source_findings f
            JOIN kb_sources s ON s.org_id = f.org_id AND s.id = f.source_id
            WHERE f.org_id = %s AND f.source_id = ANY(%s::uuid[]) AND f.kind <> 'UNKNOWN_FRESHNESS'
            GROUP BY f.source_id, s.path
            """,
            (org_id, list(set(source_ids))),
        )
    ).fetchall()
    return {r["source_id"]: warning_text(r["path"], r["kinds"], r["version"]) for r in rows}
