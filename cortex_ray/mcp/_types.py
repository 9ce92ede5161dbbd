"""The MCP vocabulary the rest of cortex-ray speaks: how to reach a server (no secret values,
only the names of secrets), a tool as the server defines it (with the digest that pins it),
and what a call returns. The client that speaks the protocol (the official ``mcp`` SDK)
implements :class:`McpClient`; the governance layer stores configurations and pinned
definitions and turns each definition into a gated ``Tool``."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from cortex_ray._types import CapabilityTier

__all__ = [
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
    "mcp_tool_name",
]

_MAX_TOOL_NAME = 64  # what chat-completions APIs accept for a function name


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class McpTransport(StrEnum):
    STDIO = "stdio"
    """A local process the connection starts (command, args); only the local operator may
    register one (it runs a command)."""
    HTTP = "http"
    """Streamable HTTP at a URL."""


class McpServerConfig(_Model):
    """How to reach one MCP server. Credentials are never stored here: ``headers``,
    ``bearer_secret`` and ``env`` name secrets of the organisation's secret store (or, with
    ``per_principal``, of the calling principal), resolved into :class:`McpCredentials` at
    connect time."""

    transport: McpTransport
    url: str | None = None
    """Streamable HTTP: the endpoint URL."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP header name → the name of the secret holding its value."""
    bearer_secret: str | None = None
    """The name of the secret holding a bearer token (``Authorization: Bearer …``)."""
    per_principal: bool = False
    """Credentials are the calling principal's own (a person's token for the server), not
    the organisation's."""
    command: str | None = None
    """stdio: the program to start."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: environment variable → the name of the secret holding its value."""
    cwd: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    """One call's bound (``None``: the setting's default)."""
    protocol: Literal["auto", "legacy"] = "auto"
    """``auto``: ask for the current revision (2026-07-28, stateless) and fall back to the
    ``initialize`` handshake when the server does not speak it; ``legacy``: always the
    handshake (for a server whose discovery misbehaves)."""


class McpCredentials(_Model):
    """The secret values a connection uses, resolved from the secret store just before it
    opens (never stored, never logged; the gate redacts them from what a call returns)."""

    headers: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    def values(self) -> list[str]:
        """Every secret value (for redaction)."""
        return [*self.headers.values(), *self.env.values()]


class McpToolAnnotations(_Model):
    """A tool's hints as the server declares them (untrusted: they only choose a default
    tier, which an installation may override)."""

    title: str | None = None
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None


class McpToolDefinition(_Model):
    """One tool as a server lists it."""

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    annotations: McpToolAnnotations = Field(default_factory=McpToolAnnotations)

    def digest(self) -> str:
        """The pin: sha256 of the canonical JSON of everything the model sees or the call
        depends on (name, title, description, schemas, annotations). A changed digest is a
        changed tool."""
        body = self.model_dump(mode="json")
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def default_tier(self) -> CapabilityTier:
        """``readOnlyHint`` → READ, ``destructiveHint`` → ADMIN, anything else (unannotated
        included) → WRITE: fail safe."""
        hints = self.annotations
        if hints.read_only_hint:
            return CapabilityTier.READ
        if hints.destructive_hint:
            return CapabilityTier.ADMIN
        return CapabilityTier.WRITE


class McpContent(_Model):
    """One content block of a result, as the model will see it rendered."""

    kind: Literal["text", "image", "audio", "resource", "resource_link"]
    text: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    size: int | None = None
    """Bytes of binary data (images, audio, blobs are summarised, never inlined)."""


class McpCallResult(_Model):
    """What one ``tools/call`` returned."""

    is_error: bool = False
    content: list[McpContent] = Field(default_factory=list)
    structured: dict[str, Any] | None = None


class McpProgress(_Model):
    """A progress notification of a call in flight."""

    progress: float
    total: float | None = None
    message: str | None = None


class McpElicitation(_Model):
    """A server asking for input in the middle of a call."""

    message: str
    requested_schema: dict[str, Any] = Field(default_factory=dict)
    url: str | None = None
    """URL mode: the page the person should open (the answer then carries no content)."""


class McpElicitationAnswer(_Model):
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None


ProgressHook = Callable[[McpProgress], Awaitable[None]]
ElicitHook = Callable[[McpElicitation], Awaitable[McpElicitationAnswer]]


class McpClient(Protocol):
    """Speaks MCP to servers (``cortex_ray.mcp.SdkMcpClient``: the official SDK). One
    client holds at most one live session per (key, server), reused across calls and
    reopened with backoff when it drops; ``key`` names whose connection it is (the
    organisation and connector, plus the principal with per-principal credentials)."""

    async def list_tools(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> list[McpToolDefinition]:
        """Every tool the server offers (all pages)."""
        ...

    async def call_tool(
        self,
        key: str,
        config: McpServerConfig,
        credentials: McpCredentials,
        name: str,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        on_progress: ProgressHook | None = None,
        on_elicit: ElicitHook | None = None,
    ) -> McpCallResult:
        """Call one tool. Raises ``TimeoutError`` past ``timeout_s`` (the call is cancelled
        on the server), ``ConnectorUnavailableError``-like ``CortexError`` when the server
        cannot be reached or dies mid-call; a tool's own failure is ``is_error``."""
        ...

    async def health(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> str | None:
        """``None`` when the server answers (a ping or a listing), else why not."""
        ...

    async def aclose(self) -> None:
        """Close every session (and stop every stdio server this client started)."""
        ...


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def mcp_tool_name(connector: str, tool: str) -> str:
    """The cortex-ray name of a server's tool: ``<connector>__<tool>``, an identifier of at
    most 64 characters. Characters outside ``[A-Za-z0-9_]`` become ``_``; when that changed
    the name (so two tools could meet) or it is too long, 8 hex digits of the original's
    sha256 keep it unique."""
    safe = _UNSAFE.sub("_", tool)
    name = f"{connector}__{safe}"
    if safe != tool or len(name) > _MAX_TOOL_NAME:
        tag = hashlib.sha256(f"{connector}\0{tool}".encode()).hexdigest()[:8]
        name = f"{name[: _MAX_TOOL_NAME - 9]}_{tag}"
    if not name.isidentifier():
        name = f"t_{name}"[:_MAX_TOOL_NAME]
    return name
