"""The base of ``KnowledgeWriter``'s parts: one psycopg connection per writer, the lookups
every part makes (collections, generations, collection ids; cached, since a job's writer
asks them once per batch) and the checks every write into a generation starts with.

A writer is synchronous because Ray Data's UDFs are; it is not thread-safe: one per worker
process.
"""

from __future__ import annotations

from typing import Any

import psycopg

from cortex_ray._exceptions import InvalidRequestError, NotFoundError
from cortex_ray._names import check_name, is_safe_name
from cortex_ray._sync import SyncConn, SyncConnection
from cortex_ray.knowledge._types import Generation, SourceVersion

__all__ = ["WriterConnection"]


class WriterConnection(SyncConnection):
    """The connection and the cached lookups that the writer's parts share.

    Args:
        dsn: the PostgreSQL connection string (a job passes it to every worker).
    """

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._generations: dict[int, Generation] = {}
        self._ensured: set[tuple[str, str]] = set()  # collections known to exist
        self._collection_ids: dict[tuple[str, str], int] = {}
        # The average passage length impacts are computed with (the passages part reads it;
        # publish forgets it, since a publication changes it).
        self._avgdl: dict[tuple[str, str], float] = {}
        self._seen: dict[tuple[str, str], list[int]] = {}  # [passages, total length]

    def _one(self, sql: str, params: Any = None) -> dict[str, Any] | None:
        return self.conn.execute(sql, params).fetchone()

    # -- collections and generations ------------------------------------------------

    def _ensure_collection(self, org_id: str, collection: str) -> None:
        # Once per writer: collections are never deleted while a job writes into them.
        if (org_id, collection) in self._ensured:
            return
        if not is_safe_name(collection) and not self._collection_exists(org_id, collection):
            check_name("collection", collection)  # a new one: addressable in a path as it is
        try:
            self.conn.execute(
                "INSERT INTO organisations (id) VALUES (%s) ON CONFLICT DO NOTHING", (org_id,)
            )
            self.conn.execute(
                "INSERT INTO kb_collections (org_id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (org_id, collection),
            )
        except psycopg.errors.CheckViolation as exc:
            raise InvalidRequestError(
                f"invalid organisation or collection name: {org_id!r}, {collection!r}"
            ) from exc
        self._ensured.add((org_id, collection))

    def _collection_exists(self, org_id: str, collection: str) -> bool:
        """Whether the collection exists (one made before the safe set of names keeps being
        written)."""
        row = self.conn.execute(
            "SELECT 1 FROM kb_collections WHERE org_id = %s AND name = %s", (org_id, collection)
        ).fetchone()
        return row is not None

    def _generation(self, generation: Generation | int) -> Generation:
        if isinstance(generation, Generation):
            return generation
        known = self._generations.get(generation)
        if known is None:
            row = self._one(
                "SELECT org_id, collection FROM kb_generations WHERE id = %s", (generation,)
            )
            if row is None:
                raise NotFoundError(f"no generation {generation}")
            known = Generation(org_id=row["org_id"], collection=row["collection"], id=generation)
            self._generations[generation] = known
        return known

    def _collection_id(self, org_id: str, collection: str) -> int:
        key = (org_id, collection)
        cid = self._collection_ids.get(key)
        if cid is None:
            row = self._one("SELECT id FROM kb_collections WHERE org_id = %s AND name = %s", key)
            if row is None:
                raise NotFoundError(f"no collection {collection!r} in {org_id}")
            cid = self._collection_ids[key] = int(row["id"])
        return cid

    # -- checks before a write ------------------------------------------------------

    def _lock_building(self, conn: SyncConn, gen: Generation) -> None:
        # FOR SHARE: writers proceed together; publish (FOR UPDATE) waits for them.
        row = conn.execute(
            "SELECT status FROM kb_generations WHERE org_id = %s AND id = %s FOR SHARE",
            (gen.org_id, gen.id),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no generation {gen.id} in {gen.org_id}")
        if row["status"] != "BUILDING":
            raise InvalidRequestError(f"generation {gen.id} is {row['status']}, not BUILDING")

    def _check_source(self, gen: Generation, source: SourceVersion) -> None:
        if (source.org_id, source.collection) != (gen.org_id, gen.collection):
            raise InvalidRequestError(
                f"source {source.path!r} belongs to {source.org_id}/{source.collection}, "
                f"not to generation {gen.id} of {gen.org_id}/{gen.collection}"
            )
