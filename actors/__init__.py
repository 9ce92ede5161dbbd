"""cortex-ray on Ray actors: one ``AgentSession`` actor per live session or task run.

``SessionManager`` is the ``cortex_ray.Executor`` the HTTP API uses: it finds (or creates)
the actor for an organisation's session or run by name, and the namespace's
``SessionDirectory`` keeps the live sessions under a cap and resumes runs whose actor died.
All state is in PostgreSQL, so actors passivate when idle and come back on the next message.
See docs/actors.md.
"""

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the actors package needs Ray: pip install 'cortex-ray[ray]'") from exc

from actors._directory import SessionDirectory
from actors._exceptions import SessionBusyError, SessionError, SessionUnavailableError
from actors._factory import RuntimeFactory, ServedModels, open_runtime
from actors._local import announce_local_ray, local_ray_address
from actors._manager import SessionManager
from actors._mcp import McpConnections, RayMcpClient, close_connections
from actors._metrics import RayMetrics, install_ray_metrics
from actors._naming import DIRECTORY_NAME, NAMESPACE, ActorKey
from actors._session import AgentSession
from cortex_ray import SessionPolicy

__all__ = [
    "DIRECTORY_NAME",
    "NAMESPACE",
    "ActorKey",
    "AgentSession",
    "McpConnections",
    "RayMcpClient",
    "RayMetrics",
    "RuntimeFactory",
    "ServedModels",
    "SessionBusyError",
    "SessionDirectory",
    "SessionError",
    "SessionManager",
    "SessionPolicy",
    "SessionUnavailableError",
    "announce_local_ray",
    "close_connections",
    "install_ray_metrics",
    "local_ray_address",
    "open_runtime",
]
