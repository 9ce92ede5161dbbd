"""``SdkMcpClient``: :class:`~cortex_ray.mcp.McpClient` on the official ``mcp`` SDK.

One live session per key, opened on first use and reused by every call after it (concurrent
calls share it). Opening is serialised per key by an asyncio lock. A session that drops (a
stdio server that died, an HTTP server gone, an answer that is not MCP) is closed and the
call that found out fails with :class:`~cortex_ray.ConnectorUnavailableError`; the next call
opens a new one. A failed open makes later calls fail at once for a backoff that doubles
with each failure in a row (``connectors.mcp_reconnect_backoff_s`` up to
``mcp_reconnect_max_backoff_s``), so a dead server costs one connect attempt per backoff, not
one per call. docs/connectors.md, "The MCP client"."""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from pydantic import ValidationError

from cortex_ray._exceptions import ConnectorUnavailableError
from cortex_ray.mcp._render import to_call_result, to_definition
from cortex_ray.mcp._sessions import (
    CallHooks,
    LiveSession,
    ToolsChangedHook,
    credentials_digest,
    describe_failure,
)
from cortex_ray.mcp._types import (
    ElicitHook,
    McpCallResult,
    McpCredentials,
    McpProgress,
    McpServerConfig,
    McpToolDefinition,
    McpTransport,
    ProgressHook,
)
from cortex_ray.mcp._urls import check_mcp_url
from cortex_ray.settings import ConnectorOptions

__all__ = ["SdkMcpClient"]

log = logging.getLogger("cortex_ray.mcp")

_MAX_PAGES = 1000  # a server whose cursor never ends cannot hang a listing
_HEALTH_TIMEOUT_S = 5.0


@dataclass
class _Backoff:
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""
    attempt: tuple[McpServerConfig, str] | None = None
    """What failed (the configuration and a digest of the credentials): a changed one is
    tried at once, not after the backoff."""


class SdkMcpClient:
    """Speaks MCP to servers with the official SDK (both protocol eras, stdio and streamable
    HTTP). ``on_tools_changed(key)`` hears that a server's tool list changed:
    ``notifications/tools/list_changed`` in the handshake era, a ``subscriptions/listen``
    stream at 2026-07-28 (a server that announces nothing is found out by the periodic
    listing, ``connectors.mcp_list_refresh_s``)."""

    def __init__(
        self,
        options: ConnectorOptions | None = None,
        *,
        on_tools_changed: ToolsChangedHook | None = None,
    ) -> None:
        self.options = options or ConnectorOptions()
        self._on_tools_changed = on_tools_changed
        self._sessions: dict[str, LiveSession] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._closed = False

    # --- sessions ----------------------------------------------------------------------

    def protocol_version(self, key: str) -> str | None:
        """The revision the live session of ``key`` speaks (``None``: none open)."""
        session = self._sessions.get(key)
        return session.protocol_version if session is not None else None

    async def _session(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> LiveSession:
        if self._closed:
            raise ConnectorUnavailableError("the MCP client is closed")
        digest = credentials_digest(credentials)

        def usable(session: LiveSession | None) -> bool:
            return (
                session is not None
                and session.broken is None
                and session.config == config
                and session.credentials_digest == digest
            )

        session = self._sessions.get(key)
        if session is not None and usable(session):
            return session
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            session = self._sessions.get(key)
            if session is not None and usable(session):
                return session
            if session is not None:  # dropped, or its configuration or credentials changed
                self._sessions.pop(key, None)
                await session.close()
            return await self._open(key, config, credentials)

    async def _open(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> LiveSession:
        attempt = (config, credentials_digest(credentials))
        backoff = self._backoff.get(key)
        if backoff is None or backoff.attempt != attempt:
            backoff = self._backoff[key] = _Backoff(attempt=attempt)
        wait = backoff.retry_at - time.monotonic()
        if wait > 0:
            raise ConnectorUnavailableError(
                f"MCP server {key} is unavailable: {backoff.last_error}; "
                f"the next attempt to connect is in {wait:.1f} s"
            )
        session = LiveSession(key, config, on_tools_changed=self._on_tools_changed)
        try:
            if config.transport is McpTransport.HTTP:
                await asyncio.to_thread(
                    check_mcp_url, config.url or "", self.options.mcp_allowed_hosts
                )
            await session.open(credentials, self.options.mcp_connect_timeout_s)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                why = f"no session within {self.options.mcp_connect_timeout_s:g} s"
            else:
                why = describe_failure(exc, session.http_status)
            backoff.failures += 1
            delay = min(
                self.options.mcp_reconnect_backoff_s * 2 ** (backoff.failures - 1),
                self.options.mcp_reconnect_max_backoff_s,
            )
            backoff.retry_at = time.monotonic() + delay
            backoff.last_error = why
            log.warning("MCP server %s: cannot connect: %s (retry in %.1f s)", key, why, delay)
            raise ConnectorUnavailableError(
                f"MCP server {key} is unavailable: cannot connect: {why}"
            ) from None
        self._backoff.pop(key, None)
        self._sessions[key] = session
        log.info("MCP server %s: connected (%s)", key, session.protocol_version)
        return session

    async def _drop(self, key: str, session: LiveSession, why: str) -> None:
        if session.broken is None:
            session.broken = why
        if self._sessions.get(key) is session:
            self._sessions.pop(key, None)
        await session.close()

    # --- McpClient -----------------------------------------------------------------------

    async def list_tools(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> list[McpToolDefinition]:
        """Every tool the server offers, following ``nextCursor`` to the last page. A session
        found closed is reopened once (listing is safe to repeat)."""
        for attempt in (1, 2):
            session = await self._session(key, config, credentials)
            try:
                return await self._list(session)
            except ConnectorUnavailableError:
                if attempt == 2 or not _was_closed(session):
                    raise
        raise AssertionError("unreachable")

    async def _list(self, session: LiveSession) -> list[McpToolDefinition]:
        tools: list[McpToolDefinition] = []
        http_errors = session.http_errors
        cursor: str | None = None
        seen: set[str] = set()
        timeout = self.options.mcp_call_timeout_s
        try:
            for _ in range(_MAX_PAGES):
                async with asyncio.timeout(timeout):
                    page = await session.client.list_tools(cursor=cursor)
                tools.extend(to_definition(tool) for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return tools
                if cursor in seen:
                    raise _Garbage(f"the server repeated the cursor {cursor!r} of tools/list")
                seen.add(cursor)
            raise _Garbage(f"tools/list did not end after {_MAX_PAGES} pages")
        except BaseException as exc:
            await self._fail(
                session, exc, "tools/list", transport_failed=session.http_errors > http_errors
            )
            raise AssertionError("unreachable") from None

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
        session = await self._session(key, config, credentials)

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            if on_progress is not None:
                await on_progress(McpProgress(progress=progress, total=total, message=message))

        async def call() -> types.CallToolResult:
            return await session.client.call_tool(
                name,
                dict(arguments),
                read_timeout_seconds=timeout_s,
                progress_callback=relay if on_progress is not None else None,
            )

        hooks = CallHooks(on_elicit=on_elicit)
        http_errors = session.http_errors
        try:
            # the SDK's own bound cancels the request on the server (notifications/cancelled);
            # this one, a little later, is the backstop for anything else that hangs
            async with asyncio.timeout(timeout_s + 1.0):
                result = await session.run_call(hooks, call)
        except BaseException as exc:
            if hooks.raised and not isinstance(exc, asyncio.CancelledError):
                raise hooks.raised[0] from None
            await self._fail(
                session,
                exc,
                f"tools/call {name}",
                timeout_s=timeout_s,
                transport_failed=session.http_errors > http_errors,
            )
            raise AssertionError("unreachable") from None
        if hooks.raised:
            raise hooks.raised[0]
        return to_call_result(result)

    async def _fail(
        self,
        session: LiveSession,
        exc: BaseException,
        what: str,
        *,
        timeout_s: float | None = None,
        transport_failed: bool = False,
    ) -> None:
        """Raise what ``exc`` means to a caller, dropping the session where it is unusable
        (``transport_failed``: the server answered an HTTP error during the request, so an
        error answer came from the transport, not from the tool)."""
        key = session.key
        if isinstance(exc, asyncio.CancelledError):
            raise exc  # the caller's own cancellation (the SDK told the server)
        timed_out = isinstance(exc, MCPError) and exc.code == types.REQUEST_TIMEOUT
        if timed_out or isinstance(exc, TimeoutError):
            bound = f"{timeout_s:g} s" if timeout_s is not None else "its bound"
            raise TimeoutError(
                f"MCP server {key}: {what} did not finish within {bound} (cancelled)"
            ) from None
        if (
            isinstance(exc, MCPError)
            and exc.code != types.CONNECTION_CLOSED
            and not transport_failed
        ):
            # a protocol-level error answer (unknown tool, invalid params): the session is fine
            raise ConnectorUnavailableError(
                f"MCP server {key}: {what} failed: {exc.error.message}"
            ) from None
        if isinstance(exc, _Garbage | ValidationError | RuntimeError | ValueError):
            why = f"answered something that is not valid MCP ({_short(exc)})"
        else:
            why = describe_failure(exc, session.http_status)
        await self._drop(key, session, why)
        raise ConnectorUnavailableError(
            f"MCP server {key}: {what} failed: {why}; the next call reconnects"
        ) from None

    async def health(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> str | None:
        """``None`` when the server answers a ping (handshake era) or a listing (the current
        revision has no ping) within a few seconds, else why not."""
        bound = min(_HEALTH_TIMEOUT_S, self.options.mcp_connect_timeout_s)
        try:
            session = await self._session(key, config, credentials)
        except ConnectorUnavailableError as exc:
            return str(exc)
        try:
            async with asyncio.timeout(bound):
                if (session.protocol_version or "") < "2026":
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await session.client.send_ping()
                else:
                    await session.client.list_tools()
        except TimeoutError:
            return f"MCP server {key} did not answer within {bound:g} s"
        except Exception as exc:
            why = describe_failure(exc, session.http_status)
            await self._drop(key, session, why)
            return f"MCP server {key} is unavailable: {why}"
        return None

    async def aclose(self) -> None:
        """Close every session and stop every stdio server this client started."""
        self._closed = True
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


class _Garbage(Exception):
    """The server's answer is not MCP."""


def _was_closed(session: LiveSession) -> bool:
    return session.broken is not None and "closed the connection" in session.broken


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]
