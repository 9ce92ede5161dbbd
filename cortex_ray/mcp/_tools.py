"""A registered MCP server's approved tool definitions as gated ``Tool``s.

Each tool is named ``mcp_tool_name(connector, tool)`` and belongs to its connector (so the
connector's grants decide it in the one gate); its ``parameters`` are the definition's
``inputSchema`` (the gate validates the arguments against them before anything is sent);
its tier is the registration's override, else the annotations' default (unannotated:
WRITE). The handler resolves the credentials the configuration names from the secret store
through ``ToolContext.secret`` (so the gate redacts them from whatever comes back), calls
the server under the call timeout, and turns the answer into the observation: structured
content as it is, else the text blocks joined. A server's ``isError`` and a server that
cannot be reached or does not answer in time raise :class:`McpToolError` naming the
connector: the gate records a failed observation, and the agent's other tools stay.

What a call does is seen on the gate's ``execute_tool`` span (the connector, the server's
own tool name, ``mcp.method.name``; each progress notification a ``mcp.progress`` event, a
request for input a ``mcp.elicitation`` event) and in the ``cortex_mcp_calls`` counter by
outcome. A request for input is declined for now, and the observation fails saying so
(``INPUT_DECLINED``): never a silent answer the model takes for the tool's.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace

from cortex_ray._types import ActionType, CapabilityTier
from cortex_ray.act import Tool, ToolContext
from cortex_ray.mcp._types import (
    McpCallResult,
    McpClient,
    McpCredentials,
    McpElicitation,
    McpElicitationAnswer,
    McpProgress,
    McpServerConfig,
    McpToolDefinition,
    mcp_tool_name,
)
from cortex_ray.observability import metrics, scrub_text

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "INPUT_DECLINED",
    "McpToolError",
    "connection_key",
    "mcp_tools",
    "principal_secret_name",
    "render_result",
    "resolve_credentials",
]

DEFAULT_CALL_TIMEOUT_S = 30.0
"""One call's bound when neither the configuration nor the settings give one."""

INPUT_DECLINED = "declined: cortex-ray cannot ask a person mid-call yet"
"""What a call's observation says after its server asked for input (elicitation)."""

log = logging.getLogger("cortex_ray.mcp")

_GATE_MARGIN_S = 5.0
"""The gate's own timeout is this much longer than the call's, so that the handler (which
names the connector) answers first."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_SECRET_NAME = 100


class McpToolError(Exception):
    """An MCP call that failed: the server's own error (``isError``), or a server that
    could not be reached or did not answer. Raised inside a tool's handler only: the gate
    turns it into a failed observation, never into an exception of the cycle."""


def principal_secret_name(secret: str, principal_id: str) -> str:
    """The name of a principal's own copy of ``secret`` (``per_principal`` connectors):
    ``<secret>.principal.<principal id>``, the id's characters outside ``A-Za-z0-9_-``
    made ``_`` and, when that changed it or the name is too long, 8 hex digits of the id's
    sha256 appended (so two principals never share a name). Set it bound to the connector
    (``cortex-ray secrets set NAME --connector CONNECTOR``)."""
    safe = _UNSAFE.sub("_", principal_id)
    name = f"{secret}.principal.{safe}"
    if safe != principal_id or len(name) > _MAX_SECRET_NAME:
        tag = hashlib.sha256(principal_id.encode()).hexdigest()[:8]
        name = f"{name[: _MAX_SECRET_NAME - 9]}_{tag}"
    return name


def connection_key(org_id: str, connector: str, principal_id: str | None = None) -> str:
    """Whose connection a call uses: the organisation's server, or with per-principal
    credentials the principal's own."""
    key = f"{org_id}/{connector}"
    return key if principal_id is None else f"{key}/{principal_id}"


async def resolve_credentials(
    config: McpServerConfig,
    reveal: Any,
    principal_id: str | None = None,
) -> McpCredentials:
    """The secret values ``config`` names, read with ``reveal(name)`` (a coroutine: a
    ``ToolContext.secret``, or the secret store bound to the connector); with
    ``per_principal`` each name is the principal's own copy (``principal_secret_name``)."""

    def named(secret: str) -> str:
        if config.per_principal and principal_id is not None:
            return principal_secret_name(secret, principal_id)
        return secret

    headers = {h: await reveal(named(s)) for h, s in config.headers.items()}
    if config.bearer_secret is not None:
        headers["Authorization"] = f"Bearer {await reveal(named(config.bearer_secret))}"
    env = {k: await reveal(named(s)) for k, s in config.env.items()}
    return McpCredentials(headers=headers, env=env)


def render_result(result: McpCallResult) -> Any:
    """What the model sees of a result: the structured content, else the text blocks
    joined (binary blocks summarised, never inlined)."""
    if result.structured is not None:
        return result.structured
    parts: list[str] = []
    for block in result.content:
        if block.text is not None:
            parts.append(block.text)
        else:
            what = " ".join(x for x in (block.kind, block.mime_type, block.uri) if x)
            size = "" if block.size is None else f", {block.size} bytes"
            parts.append(f"[{what}{size}]")
    return "\n".join(parts)


def _tier(definition: McpToolDefinition, overrides: Mapping[str, CapabilityTier]) -> CapabilityTier:
    return overrides.get(definition.name) or definition.default_tier()


def mcp_tools(
    connector: str,
    config: McpServerConfig,
    definitions: Sequence[McpToolDefinition],
    client: McpClient,
    *,
    tier_overrides: Mapping[str, CapabilityTier] | None = None,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> list[Tool]:
    """The gated tools of one server's approved definitions (see the module docstring)."""
    timeout = config.timeout_s or call_timeout_s
    overrides = dict(tier_overrides or {})
    return [
        Tool(
            name=mcp_tool_name(connector, d.name),
            description=_description(connector, d),
            handler=_handler(connector, config, d.name, client, timeout),
            parameters=d.input_schema,
            action_type=ActionType.GROUNDING,
            timeout_s=timeout + _GATE_MARGIN_S,
            idempotent=bool(d.annotations.idempotent_hint),
            tier=_tier(d, overrides),
            connector=connector,
        )
        for d in definitions
    ]


def _description(connector: str, definition: McpToolDefinition) -> str:
    title = definition.title or definition.annotations.title
    head = f"{title}: " if title else ""
    return f"{head}{definition.description}".strip() or f"{definition.name} ({connector})"


def _handler(
    connector: str, config: McpServerConfig, tool: str, client: McpClient, timeout_s: float
) -> Any:
    host = urlsplit(config.url).hostname if config.url else None

    async def call(ctx: ToolContext, args: dict[str, Any]) -> Any:
        span = trace.get_current_span()  # the gate's execute_tool span
        span.set_attributes(
            {
                "mcp.method.name": "tools/call",
                "cortex.connector": connector,
                "cortex.mcp.tool": tool,
                "cortex.mcp.transport": config.transport.value,
                **({"server.address": host} if host else {}),
            }
        )
        asked: list[McpElicitation] = []

        async def on_progress(progress: McpProgress) -> None:
            event: dict[str, str | float] = {"mcp.progress": progress.progress}
            if progress.total is not None:
                event["mcp.progress.total"] = progress.total
            if progress.message:
                event["mcp.progress.message"] = scrub_text(progress.message)[:500]
            span.add_event("mcp.progress", event)
            await ctx.report_progress(progress.progress, progress.total, progress.message)

        async def on_elicit(request: McpElicitation) -> McpElicitationAnswer:
            asked.append(request)
            message = scrub_text(request.message)[:500]
            span.add_event("mcp.elicitation", {"mcp.elicitation.message": message})
            log.warning(
                "MCP server %s asked for input in %s (%s): %s", connector, tool, message,
                INPUT_DECLINED,
            )  # fmt: skip
            return McpElicitationAnswer(action="decline")

        outcome = "unavailable"
        try:
            principal = ctx.principal.id if config.per_principal else None
            credentials = await resolve_credentials(config, ctx.secret, principal)
            key = connection_key(ctx.org_id, connector, principal)
            try:
                result = await client.call_tool(
                    key, config, credentials, tool, args, timeout_s=timeout_s,
                    on_progress=on_progress, on_elicit=on_elicit,
                )  # fmt: skip
            except TimeoutError:
                outcome = "timeout"
                raise McpToolError(
                    f"MCP server {connector!r} did not answer {tool!r} within {timeout_s:g}s"
                ) from None
            except Exception as exc:  # unreachable, died mid-call, protocol error
                raise McpToolError(
                    f"MCP server {connector!r} could not be reached: {type(exc).__name__}: {exc}"
                ) from exc
            text = render_result(result.model_copy(update={"structured": None}))
            if asked:
                outcome = "input_declined"
                what = "; ".join(repr(a.message[:200]) for a in asked)
                raise McpToolError(
                    f"MCP server {connector!r} tool {tool!r}: the server asked for input: "
                    f"{what}; {INPUT_DECLINED} (the server then answered: {text[:500]})"
                )
            if result.is_error:
                outcome = "tool_error"
                raise McpToolError(f"MCP server {connector!r} tool {tool!r} failed: {text}")
            outcome = "ok"
            return render_result(result)
        finally:
            metrics.record(
                metrics.MCP_CALLS, org=ctx.org_id, connector=connector, tool=tool, outcome=outcome
            )

    return call
