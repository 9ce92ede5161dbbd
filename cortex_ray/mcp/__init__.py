"""Model Context Protocol: MCP servers as governed connectors (docs/connectors.md).

The vocabulary (:mod:`cortex_ray.mcp._types`) is what the governance layer and the gate
speak; the client that talks to servers implements :class:`McpClient` with the official
``mcp`` SDK."""

from cortex_ray.mcp._client import SdkMcpClient
from cortex_ray.mcp._overlay import McpToolOverlay, offered_definitions
from cortex_ray.mcp._tools import (
    DEFAULT_CALL_TIMEOUT_S,
    INPUT_DECLINED,
    McpToolError,
    connection_key,
    mcp_tools,
    principal_secret_name,
    render_result,
    resolve_credentials,
)
from cortex_ray.mcp._types import (
    ElicitHook,
    McpCallResult,
    McpClient,
    McpContent,
    McpCredentials,
    McpElicitation,
    McpElicitationAnswer,
    McpProgress,
    McpServerConfig,
    McpToolAnnotations,
    McpToolDefinition,
    McpTransport,
    ProgressHook,
    mcp_tool_name,
)
from cortex_ray.mcp._urls import check_mcp_url

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "INPUT_DECLINED",
    "ElicitHook",
    "McpCallResult",
    "McpClient",
    "McpContent",
    "McpCredentials",
    "McpElicitation",
    "McpElicitationAnswer",
    "McpProgress",
    "McpServerConfig",
    "McpToolAnnotations",
    "McpToolDefinition",
    "McpToolError",
    "McpToolOverlay",
    "McpTransport",
    "ProgressHook",
    "SdkMcpClient",
    "check_mcp_url",
    "connection_key",
    "mcp_tool_name",
    "mcp_tools",
    "offered_definitions",
    "principal_secret_name",
    "render_result",
    "resolve_credentials",
]
