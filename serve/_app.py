"""The HTTP API as a FastAPI app: it opens the runtime and the executor, and includes the
routers of ``serve.routes`` (one per domain: agents, runs, sessions, tools, memory,
knowledge, graph, evals, governance, workflows, plus health and the key's principal),
mounts the MCP endpoint (``serve.mcp``, ``/mcp/{org}``) and the A2A routes (``serve.a2a``).

``create_app`` takes the runtime (or the settings to open one) and the ``Executor`` that
drives runs and turns, so the same app runs in-process (tests, one machine) and as the Ray
Serve ingress (``serve.ApiIngress``) in front of session actors. Authentication, the
organisation check and the error responses every route shares: ``serve._deps``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import cortex_ray
from cortex_ray import (
    ApiOptions,
    Executor,
    InProcessExecutor,
    RunSupervisor,
    Runtime,
    Settings,
    load_settings,
)
from cortex_ray.knowledge import HealthSweeper, SourceHealthMonitor
from serve._deps import ApiState
from serve._errors import error_response, install_error_handlers
from serve._tracing import TraceRequests
from serve.a2a import a2a_router
from serve.mcp import MCP_PATH, McpEndpoint
from serve.routes import ROUTERS

__all__ = [
    "ApiOptions",
    "ApiState",
    "ExecutorFactory",
    "RuntimeFactory",
    "create_app",
    "options_for",
]

log = logging.getLogger("serve.api")

RuntimeFactory = Callable[[], Awaitable[Runtime]]
"""Opens the runtime the app serves (called once, at start-up, in the serving process)."""

ExecutorFactory = Callable[[Runtime], "Executor | Awaitable[Executor]"]
"""Builds the executor for the opened runtime (e.g. ``InProcessExecutor``)."""


def options_for(runtime: Runtime | Settings | object | None) -> ApiOptions:
    """The serving options of these settings (or of an open runtime's), else the
    environment's (``CORTEX_API__*``)."""
    if isinstance(runtime, Runtime):
        return runtime.settings.api
    if isinstance(runtime, Settings):
        return runtime.api
    return load_settings().api


async def _open_runtime(source: Runtime | Settings | RuntimeFactory | None) -> Runtime:
    if isinstance(source, Runtime):
        return source
    if source is None or isinstance(source, Settings):
        # The backend registry opens a ``served`` model through its entry point. With session
        # actors, MCP servers are reached through their connection actors, as from the actors.
        settings = source or load_settings()
        if settings.sessions.executor == "actors":
            from actors import RayMcpClient

            return await Runtime.open(settings, mcp_client=RayMcpClient(settings))
        return await Runtime.open(settings)
    return await source()


async def _build_executor(source: Executor | ExecutorFactory | None, runtime: Runtime) -> Executor:
    if source is None:
        return InProcessExecutor(runtime)
    if isinstance(source, Executor):
        return source
    made = source(runtime)
    return await made if inspect.isawaitable(made) else made


async def _aclose(thing: object) -> None:
    close = getattr(thing, "aclose", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


# the app ---------------------------------------------------------------------------------


class _Api(FastAPI):
    """FastAPI, refusing a declared oversized body with the JSON error body before any of it
    is read. (A body without ``Content-Length`` is counted as it streams in, by FastAPI's
    ``max_body_size``, which raises the 413 that ``install_error_handlers`` renders; for a
    declared length Starlette would answer in plain text.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.max_body_size is not None:
            declared = Headers(scope=scope).get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_size:
                response = error_response(
                    413,
                    f"the request body is larger than this server accepts "
                    f"({self.max_body_size} bytes)",
                )
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    runtime: Runtime | Settings | RuntimeFactory | None = None,
    executor: Executor | ExecutorFactory | None = None,
    *,
    options: ApiOptions | None = None,
) -> FastAPI:
    """Build the HTTP API.

    Args:
        runtime: An open ``Runtime`` (the caller closes it), or ``Settings`` / a factory
            (or ``None``: settings from the environment) to open one at start-up and close at
            shutdown, in the serving process.
        executor: Drives runs and turns. An ``Executor`` is used as given (the caller closes
            it); a factory gets the opened runtime; ``None`` means an ``InProcessExecutor``.
            Either of the last two is closed at shutdown. The app's start-up also starts a
            ``RunSupervisor`` on them: RUNNING runs that nobody drives are resumed.
        options: Limits and serving options (default: the settings' ``api``, from
            ``CORTEX_API__*``).
    """
    opts = options or options_for(runtime)
    mcp = McpEndpoint(max_body_bytes=opts.max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            state: ApiState | None = getattr(app.state, "api", None)
            if state is None:
                opened = await _open_runtime(runtime)
                if opened is not runtime:
                    stack.push_async_callback(opened.close)
                made = await _build_executor(executor, opened)
                if made is not executor:
                    stack.push_async_callback(_aclose, made)
                app.state.api = state = ApiState(opened, made)
            elif executor is None:
                stack.push_async_callback(_aclose, state.executor)
            # Resumes the runs nobody drives (interrupted by a stop or a crash), now and
            # periodically; stopped first on the way out (the stack unwinds in reverse).
            supervisor = RunSupervisor(state.runtime, state.executor)
            await supervisor.start()
            stack.push_async_callback(supervisor.aclose)
            every = state.runtime.settings.knowledge.health_check_interval_s
            if every is not None:  # the source health monitor, on a schedule (docs/graph.md)
                knowledge = state.runtime.settings.knowledge
                sweeper = HealthSweeper(
                    SourceHealthMonitor(state.runtime.db),
                    every,
                    retention_days=knowledge.health_report_retention_days,
                )
                await sweeper.start()
                stack.push_async_callback(sweeper.aclose)
            # MCP servers' tool lists listed again every connectors.mcp_list_refresh_s: a
            # changed definition is pending until approved (docs/connectors.md).
            await state.runtime.mcp_refresher.start()
            stack.push_async_callback(state.runtime.mcp_refresher.stop)
            await stack.enter_async_context(mcp.running())  # /mcp/{org}: docs/mcp_server.md
            log.info("cortex-ray API ready (executor: %s)", type(state.executor).__name__)
            try:
                yield
            finally:
                app.state.api = None

    app = _Api(
        title="cortex-ray",
        version=cortex_ray.__version__,
        summary="A CoALA agent runtime: tasks, agents, sessions, tools and memory.",
        lifespan=lifespan,
        max_body_size=opts.max_body_bytes,
        docs_url="/docs" if opts.docs else None,
        redoc_url=None,
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.api = None
    if isinstance(runtime, Runtime) and (executor is None or isinstance(executor, Executor)):
        # Usable at once, also by a client that does not run the ASGI lifespan.
        app.state.api = ApiState(runtime, executor or InProcessExecutor(runtime))
    install_error_handlers(app)
    # the MCP and A2A endpoints too: a run started there joins the caller's trace
    app.add_middleware(TraceRequests, prefix=("/api/", "/mcp/", "/a2a/"))
    for router in ROUTERS:
        app.include_router(router())
    app.router.routes.append(Route(MCP_PATH, mcp, name="mcp"))
    app.include_router(a2a_router())  # agents over A2A (docs/a2a.md)
    return app
