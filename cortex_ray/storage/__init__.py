"""PostgreSQL: the embedded server or a configured one, migrations, and typed stores."""

from cortex_ray.storage._database import (
    Conn,
    Database,
    EmbeddedPostgres,
    migrate,
    schema_head,
    shipped_head,
)
from cortex_ray.storage._leases import (
    LeaseHolder,
    OrphanedRun,
    RunLease,
    RunLeases,
    exhausted_reason,
    fenced,
)
from cortex_ray.storage._protocols import (
    AgentStore,
    ApiKeyStore,
    AuditLog,
    ConversationLog,
    PrincipalStore,
    RunStore,
    SessionStore,
    UnitOfWork,
)
from cortex_ray.storage._stores import AuditEntry, Store
from cortex_ray.storage._turns import (
    SessionMessage,
    StoredTurnEvent,
    TurnClaim,
    TurnLease,
    TurnLeaseLostError,
    TurnRecord,
    TurnRef,
    TurnStatus,
    TurnStore,
)

__all__ = [
    "AgentStore",
    "ApiKeyStore",
    "AuditEntry",
    "AuditLog",
    "Conn",
    "ConversationLog",
    "Database",
    "EmbeddedPostgres",
    "LeaseHolder",
    "OrphanedRun",
    "PrincipalStore",
    "RunLease",
    "RunLeases",
    "RunStore",
    "SessionMessage",
    "SessionStore",
    "Store",
    "StoredTurnEvent",
    "TurnClaim",
    "TurnLease",
    "TurnLeaseLostError",
    "TurnRecord",
    "TurnRef",
    "TurnStatus",
    "TurnStore",
    "UnitOfWork",
    "exhausted_reason",
    "fenced",
    "migrate",
    "schema_head",
    "shipped_head",
]
