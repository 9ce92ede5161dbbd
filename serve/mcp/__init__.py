"""cortex-ray as an MCP server: a streamable-HTTP endpoint of the API at ``/mcp/{org}``.

``McpEndpoint`` is the ASGI app the API mounts (``serve._app``): it authenticates the
API's bearer keys, checks the organisation as every ``/api/orgs/{org}`` route does, and
hands the request to the official SDK's session manager (stateless). The tools
(``run_task``, ``get_run``, ``send_message``, ``knowledge_search``, ``graph_search``,
``memory_search``) call the same use cases as the HTTP routes, as the key's principal.
docs/mcp_server.md.
"""

from serve.mcp._endpoint import MCP_PATH, McpEndpoint
from serve.mcp._tools import TOOL_NAMES, build_server

__all__ = ["MCP_PATH", "TOOL_NAMES", "McpEndpoint", "build_server"]
