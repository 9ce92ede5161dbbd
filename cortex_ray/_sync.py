"""One synchronous psycopg connection, opened on first use: the base of the writers that
Ray Data's (synchronous) workers use, the knowledge writer's parts and the graph writer.

Not thread-safe: one per worker process.
"""

from __future__ import annotations

from typing import Any, Self

import psycopg
from psycopg.rows import dict_row

from cortex_ray._exceptions import StorageError

__all__ = ["SyncConn", "SyncConnection"]

SyncConn = psycopg.Connection[dict[str, Any]]


class SyncConnection:
    """A lazily opened autocommit connection (each write is its own transaction unless the
    caller opens one), reopened if it was closed.

    Args:
        dsn: the PostgreSQL connection string (a job passes it to every worker).
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: SyncConn | None = None

    @property
    def conn(self) -> SyncConn:
        """The connection (opened, or reopened, on first use)."""
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.dsn, row_factory=dict_row, autocommit=True)
            except psycopg.OperationalError as exc:
                raise StorageError(f"cannot reach the database: {exc}") from exc
        return self._conn

    def close(self) -> None:
        """Close the connection (a later use opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
