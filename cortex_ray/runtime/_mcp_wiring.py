"""The MCP parts of a runtime, wired once (``wire``): the store of registrations and pins,
the client (this process's ``SdkMcpClient`` unless one is given: the Ray layer gives one
actor per organisation and server), the URL guard and the per-organisation tool overlay
the registry consults (reloaded like grants)."""

from __future__ import annotations

from dataclasses import dataclass

from cortex_ray.governance import McpConnectorStore
from cortex_ray.mcp import McpClient, McpToolOverlay, SdkMcpClient
from cortex_ray.runtime._mcp_config import UrlGuard, settings_url_guard
from cortex_ray.settings import Settings
from cortex_ray.storage import Database

__all__ = ["McpWiring", "wire_mcp"]


@dataclass(frozen=True, slots=True)
class McpWiring:
    store: McpConnectorStore
    client: McpClient
    owns_client: bool
    """The client was made here: the runtime closes it (and the stdio servers it started)."""
    url_guard: UrlGuard
    overlay: McpToolOverlay
    call_timeout_s: float


def wire_mcp(
    db: Database, settings: Settings, client: McpClient | None, url_guard: UrlGuard | None
) -> McpWiring:
    store = McpConnectorStore(db)
    made = client or SdkMcpClient(settings.connectors)
    call_s = settings.connectors.mcp_call_timeout_s
    return McpWiring(
        store=store,
        client=made,
        owns_client=client is None,
        url_guard=url_guard or settings_url_guard(settings.connectors.mcp_allowed_hosts),
        overlay=McpToolOverlay(
            store, made, call_timeout_s=call_s, cache_s=settings.governance.grant_cache_s
        ),
        call_timeout_s=call_s,
    )
