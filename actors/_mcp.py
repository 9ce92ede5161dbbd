"""MCP connections on Ray: one named actor per organisation and server.

A connection to an MCP server is a session (a stdio child process, or a streamable-HTTP
session with its handshake). Opened in every session actor, 100 live sessions of one
organisation would hold 100 connections to the same server and start 100 copies of a stdio
server. Instead each (organisation, connector) has one ``McpConnections`` actor, named
``cortex-ray:mcp/<org>/<connector>`` in the sessions' namespace, holding an
``SdkMcpClient`` whose sessions (one per connection key: the organisation's credentials, or
each principal's own) every session actor, run actor and API replica shares through a
``RayMcpClient``.

- **Lifetime**: detached, restarted by Ray after its process dies (``max_restarts=-1``);
  its stdio servers are its children and die with it (their stdin closes); the restarted
  actor reconnects on the next call. A call in flight when it died fails with
  ``ConnectorUnavailableError`` (never retried by Ray: a tool call may have had effects).
- **No CPU**: it waits on servers, so it asks for none (``num_cpus=0``), like session actors.
- **Progress and elicitation cross the actor boundary** on the call's stream: the actor
  yields each progress notification and each request for input as it comes; the caller
  relays progress to its hook and answers an elicitation with ``answer`` (its hook's
  answer, or a decline when it has none).
- **Credentials** travel with each call (resolved from the secret store by the caller,
  which redacts them); the actor keeps them only inside its open sessions.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

import cortex_ray
from cortex_ray import ConnectorUnavailableError, CortexError, Settings
from cortex_ray.mcp import (
    ElicitHook,
    McpCallResult,
    McpCredentials,
    McpElicitation,
    McpElicitationAnswer,
    McpProgress,
    McpServerConfig,
    McpToolDefinition,
    ProgressHook,
    SdkMcpClient,
)
from cortex_ray.settings import ConnectorOptions

__all__ = [
    "MCP_PREFIX",
    "McpConnections",
    "RayMcpClient",
    "close_connections",
    "connections_name",
]

log = logging.getLogger("actors.mcp")

MCP_PREFIX = "cortex-ray:mcp/"
"""Names of connection actors: ``cortex-ray:mcp/<org>/<connector>`` (no session key parses
to one)."""

_DECLINE = McpElicitationAnswer(action="decline")
_CANCEL = McpElicitationAnswer(action="cancel")


def connections_name(key: str) -> str:
    """The actor that holds ``key``'s session: the key's organisation and connector
    (``<org>/<connector>[/<principal>]``; organisation ids and connector names hold no
    ``/``), so one organisation's principals share one actor per server."""
    org, _, rest = key.partition("/")
    connector = rest.partition("/")[0]
    if not org or not connector:
        raise ValueError(f"not an MCP connection key: {key!r}")
    return f"{MCP_PREFIX}{org}/{connector}"


def _error(exc: BaseException) -> dict[str, Any]:
    kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
    return {"kind": "error", "type": kind, "message": str(exc) or type(exc).__name__}


def _raise(item: Mapping[str, Any]) -> None:
    """Raise, in the caller, the error the actor reported."""
    kind, message = str(item["type"]), str(item["message"])
    if kind == "timeout":
        raise TimeoutError(message)
    error = getattr(cortex_ray, kind, None)
    if isinstance(error, type) and issubclass(error, CortexError):
        raise error(message)
    raise ConnectorUnavailableError(message)


@ray.remote
class McpConnections:
    """One organisation-and-server's MCP sessions, shared by every caller on the cluster."""

    def __init__(self, options: ConnectorOptions) -> None:
        self._client = SdkMcpClient(options)
        self._answers: dict[str, asyncio.Future[McpElicitationAnswer]] = {}

    async def list_tools(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> list[McpToolDefinition] | dict[str, Any]:
        try:
            return await self._client.list_tools(key, config, credentials)
        except (CortexError, TimeoutError) as exc:
            return _error(exc)

    async def health(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> str | None:
        return await self._client.health(key, config, credentials)

    async def call_tool(
        self,
        key: str,
        config: McpServerConfig,
        credentials: McpCredentials,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        progress: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        """The call's stream: ``progress`` and ``elicit`` items as they come, then one
        ``result`` or ``error``."""
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def on_progress(update: McpProgress) -> None:
            await events.put({"kind": "progress", "progress": update})

        async def on_elicit(request: McpElicitation) -> McpElicitationAnswer:
            ask = uuid.uuid4().hex
            answer: asyncio.Future[McpElicitationAnswer] = (
                asyncio.get_running_loop().create_future()
            )
            self._answers[ask] = answer
            await events.put({"kind": "elicit", "id": ask, "request": request})
            try:
                return await answer
            finally:
                self._answers.pop(ask, None)

        async def call() -> None:
            try:
                result = await self._client.call_tool(
                    key,
                    config,
                    credentials,
                    name,
                    arguments,
                    timeout_s=timeout_s,
                    on_progress=on_progress if progress else None,
                    on_elicit=on_elicit,
                )
            except (CortexError, TimeoutError) as exc:
                await events.put(_error(exc))
            else:
                await events.put({"kind": "result", "result": result})

        task = asyncio.create_task(call())
        try:
            while True:
                item = await events.get()
                yield item
                if item["kind"] in ("result", "error"):
                    return
        finally:
            if not task.done():  # the caller went away: so does the call
                task.cancel()

    async def answer(self, ask: str, answer: McpElicitationAnswer) -> bool:
        """A person's answer to a server's request for input (``False``: nobody waits)."""
        waiting = self._answers.get(ask)
        if waiting is None or waiting.done():
            return False
        waiting.set_result(answer)
        return True

    async def close(self) -> None:
        await self._client.aclose()


class RayMcpClient:
    """The :class:`~cortex_ray.mcp.McpClient` of the Ray layer: every call goes to the
    organisation-and-server's ``McpConnections`` actor (created on first use), so a server
    has one connection per credential on the whole cluster. What ``open_runtime`` gives the
    session actors and the API."""

    def __init__(self, settings: Settings) -> None:
        self._options = settings.connectors
        self._namespace = settings.sessions.namespace
        self._handles: dict[str, ActorHandle[Any]] = {}

    def _actor(self, key: str) -> ActorHandle[Any]:
        name = connections_name(key)
        handle = self._handles.get(name)
        if handle is None:
            actor_class = cast("ActorClass[Any]", McpConnections)
            created = actor_class.options(
                name=name,
                namespace=self._namespace,
                get_if_exists=True,
                lifetime="detached",
                max_restarts=-1,
                max_task_retries=0,
                num_cpus=0,
                max_concurrency=1000,
            ).remote(self._options)
            handle = cast("ActorHandle[Any]", created)
            self._handles[name] = handle
        return handle

    def _gone(self, key: str, exc: BaseException) -> ConnectorUnavailableError:
        self._handles.pop(connections_name(key), None)
        return ConnectorUnavailableError(
            f"MCP server {key}: its connection actor stopped in the middle of the call "
            f"({type(exc).__name__}); Ray restarts it and the next call reconnects"
        )

    async def list_tools(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> list[McpToolDefinition]:
        try:
            got = await self._actor(key).list_tools.remote(key, config, credentials)
        except (RayActorError, ActorUnavailableError) as exc:
            raise self._gone(key, exc) from None
        if isinstance(got, dict):
            _raise(got)
        return cast("list[McpToolDefinition]", got)

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
        actor = self._actor(key)
        stream: Any = actor.call_tool.remote(
            key, config, credentials, name, dict(arguments), timeout_s, on_progress is not None
        )
        try:
            async for ref in stream:
                item: dict[str, Any] = await ref
                kind = item["kind"]
                if kind == "progress" and on_progress is not None:
                    await on_progress(item["progress"])
                elif kind == "elicit":
                    try:
                        answer = _DECLINE if on_elicit is None else await on_elicit(item["request"])
                    except BaseException:  # the hook's error ends the call, there as here
                        await actor.answer.remote(item["id"], _CANCEL)
                        raise
                    await actor.answer.remote(item["id"], answer)
                elif kind == "error":
                    _raise(item)
                elif kind == "result":
                    return cast("McpCallResult", item["result"])
        except (RayActorError, ActorUnavailableError) as exc:
            raise self._gone(key, exc) from None
        raise self._gone(key, RuntimeError("the call's stream ended without a result"))

    async def health(
        self, key: str, config: McpServerConfig, credentials: McpCredentials
    ) -> str | None:
        try:
            why: str | None = await self._actor(key).health.remote(key, config, credentials)
        except (RayActorError, ActorUnavailableError) as exc:
            return str(self._gone(key, exc))
        return why

    async def aclose(self) -> None:
        """Forget the handles; the actors stay, shared by every other caller."""
        self._handles.clear()


async def close_connections(namespace: str) -> int:
    """Stop every MCP connection actor of ``namespace`` (their stdio servers with them);
    the number stopped. For shutdown and tests: a later call starts them again."""
    from ray.util import list_named_actors

    stopped = 0
    for entry in list_named_actors(all_namespaces=True):
        if entry["namespace"] != namespace or not entry["name"].startswith(MCP_PREFIX):
            continue
        try:
            handle = ray.get_actor(entry["name"], namespace=namespace)
            await handle.close.remote()
            ray.kill(handle, no_restart=True)
            stopped += 1
        except (ValueError, RayActorError):
            continue
    log.info("stopped %d MCP connection actor(s) in %s", stopped, namespace)
    return stopped
