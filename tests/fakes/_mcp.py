"""A scripted in-memory ``McpClient``: servers by address (an HTTP server's URL, a stdio
server's command), each with the tools it lists and what each call answers; it records
every listing and call with the key and the credentials it was given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cortex_ray._exceptions import UnavailableError
from cortex_ray.mcp import (
    McpCallResult,
    McpContent,
    McpCredentials,
    McpServerConfig,
    McpToolDefinition,
)

Answer = McpCallResult | Exception | Callable[[Mapping[str, Any]], McpCallResult]


@dataclass
class ScriptedServer:
    tools: list[McpToolDefinition] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)
    down: bool = False
    """Unreachable: every listing and call fails as a dead server's would."""


@dataclass
class McpCall:
    key: str
    tool: str
    arguments: dict[str, Any]
    credentials: McpCredentials
    timeout_s: float


def text_result(text: str, *, is_error: bool = False) -> McpCallResult:
    return McpCallResult(is_error=is_error, content=[McpContent(kind="text", text=text)])


class ScriptedMcpClient:
    """The scripted client (see the module docstring)."""

    def __init__(self, servers: dict[str, ScriptedServer] | None = None) -> None:
        self.servers: dict[str, ScriptedServer] = dict(servers or {})
        self.calls: list[McpCall] = []
        self.listings: list[tuple[str, McpCredentials]] = []
        self.closed = False

    def _server(self, config: McpServerConfig) -> ScriptedServer:
        address = config.url or config.command or ""
        server = self.servers.get(address)
        if server is None or server.down:
            raise UnavailableError(f"connection refused: {address}")
        return server

    async def list_tools(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> list[McpToolDefinition]:
        self.listings.append((key, credentials))
        return list(self._server(config).tools)

    async def call_tool(
        self,
        key: str,
        config: McpServerConfig,
        credentials: McpCredentials,
        name: str,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        on_progress: Any = None,
        on_elicit: Any = None,
    ) -> McpCallResult:
        self.calls.append(McpCall(key, name, dict(arguments), credentials, timeout_s))
        answer = self._server(config).answers.get(name)
        if answer is None:
            return text_result(f"unknown tool {name}", is_error=True)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(arguments)
        return answer

    async def health(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> str | None:
        try:
            self._server(config)
        except UnavailableError as exc:
            return str(exc)
        return None

    async def aclose(self) -> None:
        self.closed = True
