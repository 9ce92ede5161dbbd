"""Alembic environment: migrations run on a connection handed in by ``cortex_ray.storage``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
# Many processes (session actors, jobs) may start at once: one migrates, the others wait.
connection.execute(text("SELECT pg_advisory_lock(7232316110)"))
try:
    with context.begin_transaction():
        context.run_migrations()
finally:
    connection.execute(text("SELECT pg_advisory_unlock(7232316110)"))
