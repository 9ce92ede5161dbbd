"""The embedded PostgreSQL, a configured DSN, and versioned migrations."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from cortex_ray import Settings, StorageError
from cortex_ray.storage import Database, migrate, schema_head, shipped_head


async def test_the_embedded_server_has_pgvector_and_the_schema_at_head(db: Database) -> None:
    async with db.transaction() as conn:
        cur = await conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = await cur.fetchone()
        assert row is not None and row["extversion"].startswith("0.8")
        cur = await conn.execute("SELECT version_num FROM alembic_version")
        assert (await cur.fetchone()) == {"version_num": schema_head()}
        cur = await conn.execute("SHOW hnsw.iterative_scan")
        assert (await cur.fetchone()) == {"hnsw.iterative_scan": "relaxed_order"}
        cur = await conn.execute("SHOW server_version_num")
        row = await cur.fetchone()
        assert row is not None and int(row["server_version_num"]) >= 180000


async def test_migrations_are_idempotent(db: Database) -> None:
    migrate(db.dsn)  # already at head: a no-op, not an error
    async with db.transaction() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM alembic_version")
        assert (await cur.fetchone()) == {"n": 1}


async def test_a_configured_dsn_is_used_instead_of_starting_a_server(
    db: Database, data_dir: Path
) -> None:
    other_dir = Path(tempfile.mkdtemp(prefix="cortex-ray-unused-", dir="/tmp"))
    try:
        configured = await Database.open(Settings(database_url=db.dsn, data_dir=other_dir).storage)
        try:
            assert not configured.embedded
            async with configured.transaction() as conn:
                cur = await conn.execute("SELECT 1 AS one")
                assert (await cur.fetchone()) == {"one": 1}
        finally:
            await configured.close()
        assert list(other_dir.iterdir()) == []  # no embedded server was started there
    finally:
        shutil.rmtree(other_dir, ignore_errors=True)


async def test_without_migrations_the_schema_version_is_checked(
    db: Database, scratch_database
) -> None:
    assert shipped_head() == schema_head()  # the cheap reading agrees with Alembic's
    checked = await Database.open(Settings(database_url=db.dsn, migrate=False).storage)
    await checked.close()

    async with scratch_database("unmigrated") as bare:
        with pytest.raises(
            StorageError, match=f"schema is at nothing, this code needs {schema_head()}"
        ):
            await Database.open(Settings(database_url=bare, migrate=False).storage)
        async with await psycopg.AsyncConnection.connect(bare, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            assert (await cur.fetchone()) == (0,)  # nothing was created


async def test_an_unreachable_database_is_a_clear_storage_error() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(StorageError, match="cannot reach or migrate the database"):
        await Database.open(settings.storage)


async def test_a_second_embedded_database_starts_and_stops_cleanly() -> None:
    folder = Path(tempfile.mkdtemp(prefix="cortex-ray-own-", dir="/tmp"))
    try:
        database = await Database.open(Settings(data_dir=folder).storage)
        assert database.embedded
        pid_file = folder / "pg" / "postmaster.pid"
        assert pid_file.exists()
        await database.close()
        assert not pid_file.exists()  # the server stopped with its last handle
        reopened = await Database.open(Settings(data_dir=folder).storage)  # data survives a restart
        async with reopened.transaction() as conn:
            cur = await conn.execute("SELECT version_num FROM alembic_version")
            assert (await cur.fetchone()) == {"version_num": schema_head()}
        await reopened.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_default_data_dir_keeps_root_out_of_home() -> None:
    import os

    from cortex_ray.settings import default_data_dir

    path = default_data_dir()
    if os.geteuid() == 0:
        assert path == Path("/var/lib/cortex-ray")
    else:
        assert str(path).startswith(str(Path.home()))


async def test_api_keys_are_hashed_resolve_to_their_principal_and_can_be_revoked(
    db: Database,
) -> None:

    from cortex_ray import Grant, NotFoundError, Principal
    from cortex_ray.storage import Store

    store = Store(db)
    org = f"org-{uuid.uuid4().hex[:8]}"
    alice = Principal(id="alice", org_id=org, grant=Grant(tools=frozenset({"*"})))
    key, key_id = await store.create_api_key(alice, "laptop")
    assert key.startswith("crx_")
    assert await store.principal_for_api_key(key) == alice
    async with db.connection() as conn:
        cur = await conn.execute("SELECT key_hash FROM api_keys WHERE id = %s", (key_id,))
        row = await cur.fetchone()
    assert row is not None and key.encode() not in bytes(row["key_hash"])  # never the key itself
    assert await store.principal_for_api_key(key + "x") is None
    assert await store.principal_for_api_key("Bearer nonsense") is None
    revoked_at, changed = await store.revoke_api_key(org, key_id)
    assert changed
    assert await store.principal_for_api_key(key) is None
    # Idempotent: revoking again changes nothing and says when it was revoked.
    assert await store.revoke_api_key(org, key_id) == (revoked_at, False)
    with pytest.raises(NotFoundError):
        await store.revoke_api_key(org, uuid.uuid4())
    with pytest.raises(NotFoundError):  # another organisation's key does not exist there
        await store.revoke_api_key(f"{org}-other", key_id)


async def test_migration_0021_goes_both_ways_keeping_what_the_older_schema_holds(
    scratch_database,
) -> None:
    """Down: a CANCELLED run becomes FAILED (its reason still says who cancelled it), an
    approval's referenced fields come back inline, a workflow schedule (which the older
    schema cannot express) is removed; up again: the constraints hold."""
    import asyncio
    import json

    from cortex_ray.storage._database import _alembic

    agent, run, approval = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    sha = "a" * 64
    async with scratch_database("m0021") as dsn:
        await asyncio.to_thread(_alembic, dsn, "upgrade", "head")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO organisations (id) VALUES ('acme')")
            conn.execute(
                "INSERT INTO agents (org_id, id, name, mode) "
                "VALUES ('acme', %s, 'a', 'AUTONOMOUS')",
                (agent,),
            )
            conn.execute(
                "INSERT INTO task_runs (org_id, id, agent_id, goal, status, max_steps, reason) "
                "VALUES ('acme', %s, %s, 'g', 'CANCELLED', 3, 'cancelled by ada')",
                (run, agent),
            )
            conn.execute(
                "INSERT INTO payloads (org_id, sha256, body, bytes) VALUES ('acme', %s, %s, 9)",
                (sha, json.dumps({"note": "big"})),
            )
            conn.execute(
                "INSERT INTO approvals (org_id, id, run_id, step_index, tool, args, tier, "
                "requested_by, expires_at, args_ref) VALUES ('acme', %s, %s, 0, 't', %s, "
                "'write', 'ada', now(), %s)",
                (approval, run, json.dumps({"$payload": sha, "bytes": 9}), sha),
            )
            conn.execute(
                "INSERT INTO schedules (org_id, id, agent_id, goal, max_steps, created_by, "
                "workflow, inputs, run_mode) VALUES ('acme', %s, %s, '', 3, 'ada', 'triage', "
                "'{}', NULL)",
                (uuid.uuid4(), agent),
            )
            with pytest.raises(psycopg.errors.CheckViolation):  # a goal or a workflow
                conn.execute(
                    "INSERT INTO schedules (org_id, id, agent_id, goal, max_steps, created_by) "
                    "VALUES ('acme', %s, %s, '', 3, 'ada')",
                    (uuid.uuid4(), agent),
                )
        await asyncio.to_thread(_alembic, dsn, "downgrade", "0020")
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT status, reason FROM task_runs").fetchone()
            assert row == ("FAILED", "cancelled by ada")
            assert conn.execute("SELECT args FROM approvals").fetchone() == ({"note": "big"},)
            assert conn.execute("SELECT count(*) FROM schedules").fetchone() == (0,)
        await asyncio.to_thread(_alembic, dsn, "upgrade", "head")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE task_runs SET status = 'CANCELLED'")
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE task_runs SET status = 'PAUSED'")
