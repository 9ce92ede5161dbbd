"""Model Context Protocol: MCP servers as governed connectors (docs/connectors.md).

The vocabulary (:mod:`cortex_ray.mcp._types`) is what the governance layer and the gate
speak; the client that talks to servers implements :class:`McpClient` with the official
``mcp`` SDK."""

from cortex_ray.mcp._client import SdkMcpClient
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
    "McpTransport",
    "ProgressHook",
    "SdkMcpClient",
    "check_mcp_url",
    "mcp_tool_name",
]
