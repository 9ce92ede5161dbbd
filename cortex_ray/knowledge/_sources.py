"""Sources and their health: the writer's part that keeps the registry of a collection's
files and what happened to each.

- ``register_sources`` gives each path its stable source id and each content hash its
  version (a new one per new hash, the old one back for a hash the source had), and says
  which are unchanged (the published generation serves exactly that version).
- ``record_health_events`` logs READ_OK | READ_FAILURE | DISAPPEARED | SKIPPED per path (a
  path's last event is its health); ``mark_disappeared`` records the published sources a
  run did not see. ``record_events`` is the health write the passages part makes in its own
  transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.knowledge._connection import WriterConnection
from cortex_ray.knowledge._sql import PUBLISHED_VERSIONS_SQL, SyncConn
from cortex_ray.knowledge._types import (
    Generation,
    HealthEvent,
    HealthRecord,
    SourceFile,
    SourceVersion,
)

__all__ = ["SourceWriter", "check_events", "health_many", "record_events", "upsert_sources"]

_HEALTH_EVENTS = ("READ_OK", "READ_FAILURE", "DISAPPEARED", "SKIPPED")


def upsert_sources(
    conn: SyncConn, org_id: str, collection: str, paths: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Create (or find) the sources of ``paths`` and row-lock them, in path order (so
    concurrent writers cannot deadlock); ``{path: {"id", "next_version"}}``."""
    ordered = sorted(set(paths))
    rows = conn.execute(
        """
        INSERT INTO kb_sources (org_id, id, collection, path)
        SELECT %s, t.id, %s, t.path FROM unnest(%s::uuid[], %s::text[]) AS t(id, path)
        ORDER BY t.path
        ON CONFLICT (org_id, collection, path) DO UPDATE SET path = EXCLUDED.path
        RETURNING id, path, next_version
        """,
        (org_id, collection, [uuid.uuid4() for _ in ordered], ordered),
    ).fetchall()
    return {r["path"]: r for r in rows}


def check_events(events: Sequence[HealthRecord]) -> None:
    """Refuse an event that is not a ``HealthEvent``."""
    for _, event, _ in events:
        if event not in _HEALTH_EVENTS:
            raise InvalidRequestError(f"unknown health event {event!r}")


def record_events(
    conn: SyncConn, org_id: str, collection: str, events: Sequence[HealthRecord]
) -> None:
    """Record ``events`` in the caller's transaction (the sources are created if new)."""
    sources = upsert_sources(conn, org_id, collection, [e[0] for e in events])
    ids = [sources[path]["id"] for path, _, _ in events]
    health_many(conn, org_id, ids, [e[1] for e in events], [e[2][:2000] for e in events])


def health_many(
    conn: SyncConn, org_id: str, ids: list[Any], events: list[str], details: list[str]
) -> None:
    """Log one event per source id and set each source's health to its last one."""
    if not ids:
        return
    conn.execute(
        "INSERT INTO kb_source_events (org_id, source_id, event, detail) "
        "SELECT %s, t.* FROM unnest(%s::uuid[], %s::text[], %s::text[]) "
        "AS t(source_id, event, detail)",
        (org_id, ids, events, details),
    )
    last = {source_id: i for i, source_id in enumerate(ids)}  # one update per source
    conn.execute(
        """
        UPDATE kb_sources s SET health = t.event, health_detail = t.detail, health_at = now()
        FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS t(id, event, detail)
        WHERE s.org_id = %s AND s.id = t.id
        """,
        (
            list(last),
            [events[i] for i in last.values()],
            [details[i] for i in last.values()],
            org_id,
        ),
    )


class SourceWriter(WriterConnection):
    """Registers a collection's sources and versions and records their health."""

    def register_source(
        self, org_id: str, collection: str, path: str, content_hash: str, size_bytes: int
    ) -> SourceVersion:
        """The stable id of ``path`` and the version of this content (a new one per new hash).

        ``unchanged`` is true when the collection's published generation already serves
        exactly this version: carry it forward instead of rewriting it.
        """
        return self.register_sources(org_id, collection, [(path, content_hash, size_bytes)])[0]

    def register_sources(
        self, org_id: str, collection: str, files: Sequence[SourceFile]
    ) -> list[SourceVersion]:
        """``register_source`` for many files in one transaction; results in input order.

        A path listed twice must have the same content hash both times.
        """
        wanted: dict[str, tuple[str, int]] = {}
        for path, content_hash, size_bytes in files:
            if not path or not content_hash:
                raise InvalidRequestError("a source needs a path and a content hash")
            if wanted.setdefault(path, (content_hash, size_bytes))[0] != content_hash:
                raise InvalidRequestError(f"{path!r} is listed twice with different content")
        if not wanted:
            return []
        self._ensure_collection(org_id, collection)
        with self.conn.transaction():
            conn = self.conn
            sources = upsert_sources(conn, org_id, collection, list(wanted))  # locked now
            paths = sorted(wanted)
            ids = [sources[path]["id"] for path in paths]
            existing: dict[uuid.UUID, int] = {
                r["source_id"]: int(r["version"])
                for r in conn.execute(
                    """
                    UPDATE kb_source_versions v SET touched_at = now()
                    FROM unnest(%s::uuid[], %s::text[]) AS t(source_id, content_hash)
                    WHERE v.org_id = %s AND v.source_id = t.source_id
                      AND v.content_hash = t.content_hash
                    RETURNING v.source_id, v.version
                    """,
                    (ids, [wanted[path][0] for path in paths], org_id),
                ).fetchall()
            }
            new = [path for path in paths if sources[path]["id"] not in existing]
            if new:
                new_ids = [sources[path]["id"] for path in new]
                conn.execute(
                    """
                    INSERT INTO kb_source_versions
                        (org_id, source_id, version, content_hash, size_bytes)
                    SELECT %s, t.* FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::bigint[])
                        AS t(source_id, version, content_hash, size_bytes)
                    """,
                    (
                        org_id,
                        new_ids,
                        [sources[path]["next_version"] for path in new],
                        [wanted[path][0] for path in new],
                        [wanted[path][1] for path in new],
                    ),
                )
                conn.execute(
                    "UPDATE kb_sources SET next_version = next_version + 1 "
                    "WHERE org_id = %s AND id = ANY(%s::uuid[])",
                    (org_id, new_ids),
                )
                existing.update(
                    (sources[path]["id"], int(sources[path]["next_version"])) for path in new
                )
            published: dict[uuid.UUID, int] = {
                r["source_id"]: int(r["version"])
                for r in conn.execute(PUBLISHED_VERSIONS_SQL, (org_id, collection, ids)).fetchall()
            }
        result = []
        for path, _, _ in files:
            source_id = sources[path]["id"]
            version = existing[source_id]
            result.append(
                SourceVersion(
                    org_id=org_id,
                    collection=collection,
                    path=path,
                    source_id=source_id,
                    version=version,
                    unchanged=published.get(source_id) == version,
                )
            )
        return result

    def record_health(
        self, org_id: str, collection: str, path: str, event: HealthEvent, detail: str = ""
    ) -> None:
        """Record what happened when the source at ``path`` was last looked at."""
        self.record_health_events(org_id, collection, [(path, event, detail)])

    def record_health_events(
        self, org_id: str, collection: str, events: Sequence[HealthRecord]
    ) -> None:
        """``record_health`` for many paths in one transaction (a path's last event wins)."""
        check_events(events)
        if not events:
            return
        self._ensure_collection(org_id, collection)
        with self.conn.transaction():
            record_events(self.conn, org_id, collection, events)

    def mark_disappeared(
        self, generation: Generation | int, paths_seen: Iterable[str]
    ) -> list[str]:
        """Record DISAPPEARED for the published sources whose paths this run did not see.

        They are not members of the new generation (nothing carried them), so they stop being
        served when it is published. Returns their paths.
        """
        gen = self._generation(generation)
        with self.conn.transaction():
            conn = self.conn
            conn.execute("CREATE TEMP TABLE kb_seen (path text) ON COMMIT DROP")
            with conn.cursor().copy("COPY kb_seen (path) FROM STDIN") as copy:
                for path in paths_seen:
                    copy.write_row((path,))
            rows = conn.execute(
                """
                SELECT s.id, s.path FROM kb_collections c
                JOIN kb_generation_sources m
                  ON m.org_id = c.org_id AND m.generation = c.published_generation
                JOIN kb_sources s ON s.org_id = m.org_id AND s.id = m.source_id
                WHERE c.org_id = %s AND c.name = %s
                  AND NOT EXISTS (SELECT 1 FROM kb_seen k WHERE k.path = s.path)
                ORDER BY s.path
                """,
                (gen.org_id, gen.collection),
            ).fetchall()
            health_many(
                conn,
                gen.org_id,
                [r["id"] for r in rows],
                ["DISAPPEARED"] * len(rows),
                ["not seen by the run"] * len(rows),
            )
        return [r["path"] for r in rows]
