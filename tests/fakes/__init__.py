"""In-memory fakes of the store protocols (``cortex_ray.storage``): use cases tested
without PostgreSQL.

``FakeDatabase`` is the unit of work: a ``transaction()`` yields a ``FakeTransaction`` whose
writes apply on commit and vanish on an error, as PostgreSQL's would. ``FakeStore``
implements ``PrincipalStore``, ``AgentStore``, ``RunStore``, ``SessionStore``,
``ConversationLog``, ``TurnLog`` (accepted turns; none is driven), ``ApiKeyStore``,
``TraceReader`` (no spans nor diagnostics: those are never a use case's writes) and
``AuditLog`` with the real store's rules: every row scoped by organisation, the same
exceptions for the same mistakes (``NotFoundError``, ``InvalidRequestError``, and psycopg's
``ForeignKeyViolation`` where the schema refuses a row that names a missing agent or
session), API keys kept as SHA-256 hashes.
``ScriptedMcpClient`` is an ``McpClient`` whose servers are scripted in memory.
``NoDriver`` stands for the cycle where a run use case is tested without driving a run.
``tests/test_store_contract.py`` runs one set of tests against both, so they cannot drift.
"""

from fakes._driver import NoDriver
from fakes._mcp import McpCall, ScriptedMcpClient, ScriptedServer, text_result
from fakes._store import FakeStore
from fakes._tables import AUDIT_COLUMNS
from fakes._uow import FakeDatabase, FakeTransaction

__all__ = [
    "AUDIT_COLUMNS",
    "FakeDatabase",
    "FakeStore",
    "FakeTransaction",
    "McpCall",
    "NoDriver",
    "ScriptedMcpClient",
    "ScriptedServer",
    "text_result",
]
