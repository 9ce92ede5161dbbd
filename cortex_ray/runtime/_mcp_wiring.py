"""The MCP parts of a runtime, wired once (``wire``): the store of registrations and pins,
the client (this process's ``SdkMcpClient`` unless one is given: the Ray layer gives one
actor per organisation and server), the URL guard and the per-organisation tool overlay
the registry consults (reloaded like grants), and the refresher that keeps pinned
definitions live (``refresher``: the client's ``on_tools_changed`` reaches it through a
relay, as the client is made before the use cases)."""

from __future__ import annotations

from dataclasses import dataclass

from cortex_ray.governance import McpConnectorStore
from cortex_ray.mcp import McpClient, McpToolOverlay, SdkMcpClient
from cortex_ray.runtime._connectors import McpConnectors
from cortex_ray.runtime._mcp_config import UrlGuard, settings_url_guard
from cortex_ray.runtime._mcp_refresh import McpListRefresher, ToolsChangedRelay
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
    relay: ToolsChangedRelay
    """The made client's ``on_tools_changed`` (a given client tells nobody: the periodic
    sweep finds its servers' changes)."""
    refresh_s: float

    def refresher(self, connectors: McpConnectors) -> McpListRefresher:
        """The refresher of these use cases, hearing the made client's announcements."""
        made = McpListRefresher(connectors, self.store, every_s=self.refresh_s)
        self.relay.target = made.changed
        return made


def wire_mcp(
    db: Database, settings: Settings, client: McpClient | None, url_guard: UrlGuard | None
) -> McpWiring:
    store = McpConnectorStore(db)
    relay = ToolsChangedRelay()
    made = client or SdkMcpClient(settings.connectors, on_tools_changed=relay)
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
        relay=relay,
        refresh_s=settings.connectors.mcp_list_refresh_s,
    )
