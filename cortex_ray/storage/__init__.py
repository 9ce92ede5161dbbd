"""PostgreSQL: the embedded server or a configured one, migrations, and typed stores."""

from cortex_ray.storage._database import (
    Conn,
    Database,
    EmbeddedPostgres,
    migrate,
    schema_head,
    shipped_head,
)
from cortex_ray.storage._stores import AuditEntry, Store

__all__ = [
    "AuditEntry",
    "Conn",
    "Database",
    "EmbeddedPostgres",
    "Store",
    "migrate",
    "schema_head",
    "shipped_head",
]
