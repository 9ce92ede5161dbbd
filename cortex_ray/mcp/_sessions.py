"""One live MCP session: the SDK's ``Client`` held open by a task of its own.

The SDK's client is an async context manager built on anyio task groups, which must be
entered and left by the same task; a session shared by many callers therefore lives in an
owner task that enters it, reports ready and waits to be told to close. Callers in any task
send requests through it concurrently (the SDK matches responses by request id).

A call's hooks (progress, elicitation) travel with the call: progress through the SDK's
per-request callback; a server's request for input finds its call through a context variable
(streamable HTTP carries the caller's context to the requests the server sends back on the
call's stream, and the current revision asks for input inside the call itself), else, on a
stdio session speaking the handshake, through the one call in flight (with more than one,
nobody can tell whose it is, and the request is declined)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from cortex_ray.mcp._render import to_elicit_result, to_elicitation
from cortex_ray.mcp._types import ElicitHook, McpCredentials, McpServerConfig, McpTransport

__all__ = [
    "CallHooks",
    "LiveSession",
    "ToolsChangedHook",
    "credentials_digest",
    "describe_failure",
]

log = logging.getLogger("cortex_ray.mcp")

_HTTP_READ_TIMEOUT_S = 300.0  # a response stream may stay open for a long call
_LISTEN_ACK_S = 5.0  # how long opening a session waits for its change stream

ToolsChangedHook = Callable[[str], Awaitable[None]]


@dataclass
class CallHooks:
    """What one call wants to hear about while it is in flight."""

    on_elicit: ElicitHook | None = None
    raised: list[Exception] = field(default_factory=list)
    """What ``on_elicit`` raised: the server is told the request was cancelled, and the call
    raises it once the server has answered (a hook may end a call this way, to ask a person
    later)."""


_CURRENT_CALL: contextvars.ContextVar[CallHooks | None] = contextvars.ContextVar(
    "cortex_mcp_call", default=None
)
_ids = itertools.count(1)


@dataclass
class LiveSession:
    """One open session to one server, for one key."""

    key: str
    config: McpServerConfig
    on_tools_changed: ToolsChangedHook | None = None
    broken: str | None = None
    """Why this session may no longer be used (``None`` while it is healthy)."""
    http_status: int | None = None
    """The last HTTP error status the server answered (streamable HTTP)."""
    http_errors: int = 0
    """HTTP error answers so far: a call during which it grew failed in the transport (a
    refused token, a session the server no longer knows), not in the tool."""
    credentials_digest: str = ""
    """A digest of the credentials the session opened with (a changed secret reopens it)."""
    _client: Client | None = None
    _task: asyncio.Task[None] | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _calls: dict[int, CallHooks] = field(default_factory=dict)
    _opened: bool = False

    # --- opening and closing -------------------------------------------------------------

    async def open(self, credentials: McpCredentials, timeout_s: float) -> None:
        """Start the server (stdio) or reach it (HTTP) and negotiate the protocol, within
        ``timeout_s``. Raises what the SDK raised (the caller describes it)."""
        self.credentials_digest = credentials_digest(credentials)
        self._client = Client(
            self._target(credentials),
            mode=self.config.protocol,
            cache=None,  # every listing is fresh: pinning compares what the server says now
            elicitation_callback=self._elicit,
            message_handler=self._on_message,
            client_info=types.Implementation(name="cortex-ray", version="1"),
        )
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # an opener that gave up (timeout, cancellation) never reads the outcome: mark it read
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-session {self.key}")
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(ready)
        except BaseException:
            await self.close()
            raise

    def _target(self, credentials: McpCredentials) -> Any:
        config = self.config
        if config.transport is McpTransport.STDIO:
            if not config.command:
                raise ValueError("a stdio MCP server needs a command")
            return StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(credentials.env) or None,
                cwd=config.cwd,
            )
        if not config.url:
            raise ValueError("an HTTP MCP server needs a url")
        http = httpx2.AsyncClient(
            headers=dict(credentials.headers),
            timeout=httpx2.Timeout(30.0, read=_HTTP_READ_TIMEOUT_S),
            event_hooks={"response": [self._on_response]},
        )
        return _http_transport(config.url, http)

    async def _on_response(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.http_status = response.status_code
            self.http_errors += 1

    async def _own(self, ready: asyncio.Future[None]) -> None:
        assert self._client is not None
        try:
            async with self._client:
                listener = None
                if self._listens():  # open only once changes will be heard
                    hearing = asyncio.Event()
                    listener = asyncio.create_task(self._listen(hearing))
                    with contextlib.suppress(TimeoutError):  # not heard: the listing finds it
                        await asyncio.wait_for(hearing.wait(), _LISTEN_ACK_S)
                ready.set_result(None)
                self._opened = True
                try:
                    await self._closing.wait()
                finally:
                    if listener is not None:
                        listener.cancel()
                        await asyncio.gather(listener, return_exceptions=True)
        except BaseException as exc:  # the owner ends here, whatever ended the session
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else _Ended(exc))
            elif self.broken is None and not self._closing.is_set():
                self.broken = describe_failure(exc)
            if isinstance(exc, asyncio.CancelledError) and not self._closing.is_set():
                raise
        finally:
            if self.broken is None:
                self.broken = "the session was closed"

    def _listens(self) -> bool:
        """Whether to open a change stream: someone wants to hear of changes, the session
        speaks the current revision (the handshake era notifies without asking) and the
        server says its tool list changes."""
        if self.on_tools_changed is None or self._client is None:
            return False
        session = self._client.session
        tools = session.server_capabilities.tools if session.server_capabilities else None
        version = session.protocol_version or ""
        return version >= "2026" and tools is not None and bool(tools.list_changed)

    async def _listen(self, hearing: asyncio.Event) -> None:
        """Hear ``tools`` changes on a ``subscriptions/listen`` stream (2026-07-28) until the
        session closes, setting ``hearing`` once the server acknowledged it (or refused).
        Without a stream, changes are found by the periodic listing."""
        assert self._client is not None and self.on_tools_changed is not None
        try:
            async with self._client.listen(tools_list_changed=True) as stream:
                hearing.set()
                if not stream.honored.tools_list_changed:
                    return
                async for _event in stream:
                    await self.on_tools_changed(self.key)
        except Exception as exc:
            log.info(
                "MCP server %s: no change stream (%s); its changes are found by listing again",
                self.key,
                describe_failure(exc),
            )
        finally:
            hearing.set()

    async def close(self) -> None:
        """Close the session (a stdio server's process is stopped: stdin closed, then
        terminated, then killed, by the SDK)."""
        if self.broken is None:
            self.broken = "the session was closed"
        self._closing.set()
        task = self._task
        if task is None or task.done():
            return
        if not self._opened:
            task.cancel()  # still starting or in the handshake: nothing waits for `closing`
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=10.0)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        except Exception:  # ended badly: it has ended, which is all close() needs
            log.debug("closing MCP session %s", self.key, exc_info=True)

    # --- use -------------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        if self._client is None or self.broken is not None:
            raise RuntimeError(f"MCP session {self.key} is not open")
        return self._client

    @property
    def protocol_version(self) -> str | None:
        client = self._client
        if client is None or self.broken is not None:
            return None
        return client.session.protocol_version

    async def run_call(self, hooks: CallHooks, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call`` as one call of this session, with its hooks reachable."""
        call_id = next(_ids)
        self._calls[call_id] = hooks
        token = _CURRENT_CALL.set(hooks)
        try:
            return await call()
        finally:
            _CURRENT_CALL.reset(token)
            self._calls.pop(call_id, None)

    # --- what the server sends -------------------------------------------------------------

    async def _elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        hooks = _CURRENT_CALL.get()
        if hooks is None and len(self._calls) == 1:
            hooks = next(iter(self._calls.values()))
        if hooks is None or hooks.on_elicit is None:
            why = "no one to ask" if hooks is not None else "cannot tell which call asks"
            log.info("MCP server %s asked for input (%s): declined", self.key, why)
            return types.ElicitResult(action="decline")
        try:
            answer = await hooks.on_elicit(to_elicitation(params))
        except Exception as exc:  # raised again by the call, after the server's answer
            hooks.raised.append(exc)
            return types.ElicitResult(action="cancel")
        return to_elicit_result(answer)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.info("MCP server %s: transport error: %s", self.key, describe_failure(message))
            return
        if isinstance(message, types.ToolListChangedNotification) and self.on_tools_changed:
            await self.on_tools_changed(self.key)


@asynccontextmanager
async def _http_transport(url: str, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    """The SDK's streamable-HTTP transport on our HTTP client, which it closes with the
    session (the SDK leaves a client it was given open)."""
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


def credentials_digest(credentials: McpCredentials) -> str:
    """A digest of the secret values, to notice that they changed without keeping them."""
    canonical = json.dumps(credentials.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Ended(Exception):
    """The session's owner ended on something that is not an ``Exception`` (a group holding a
    cancellation, say), carried to the caller waiting for the session to open."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, _Ended):
        return _leaves(exc.cause)
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def describe_failure(exc: BaseException, http_status: int | None = None) -> str:
    """What went wrong, in words a person can act on (never the credentials)."""
    leaves = _leaves(exc)
    # the most telling leaf: a connection error beats the cancellations it caused
    leaves.sort(key=lambda e: isinstance(e, asyncio.CancelledError | GeneratorExit))
    first = leaves[0]
    if http_status in (401, 403):
        return f"the server refused the credentials (HTTP {http_status})"
    if isinstance(first, httpx2.ConnectError):
        return f"cannot connect ({first})"
    if isinstance(first, httpx2.TimeoutException):
        return "the server did not answer in time"
    if isinstance(first, httpx2.HTTPError):
        return f"HTTP failed ({type(first).__name__}: {first})"
    if isinstance(first, FileNotFoundError):
        return f"cannot start the command ({first})"
    if isinstance(first, MCPError):
        if first.code == types.CONNECTION_CLOSED:
            return "the server closed the connection (it stopped or crashed)"
        status = f" (HTTP {http_status})" if http_status else ""
        return f"the server answered with an error{status}: {first.error.message}"
    if isinstance(first, TimeoutError):
        return "no answer in time"
    text = str(first) or type(first).__name__
    return f"{type(first).__name__}: {text}"[:500]
