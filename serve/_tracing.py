"""HTTP requests as SERVER spans: the API's ``/api`` routes, its MCP (``/mcp``) and A2A
(``/a2a``) endpoints, and the model routes ``/v1``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import Receive, Scope, Send

from cortex_ray.observability import TRACE_CONTEXT, tracer

__all__ = ["TraceRequests"]


class TraceRequests:
    """A SERVER span per HTTP request under ``prefix`` (one or several): ``{method}
    {route}``, HTTP semantic conventions, under the caller's W3C ``traceparent`` if it sent
    one: a run submitted in
    the request stores that context, and a model call made in it hands it on, so the spans
    made for it, wherever they are made, join the caller's trace. Costs nothing when no
    tracer provider records."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        prefix: str | tuple[str, ...] = "/",
    ) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        root = str(scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]  # an app under a route prefix (/models/v1/... → /v1/...)
        if scope["type"] != "http" or not path.startswith(self.prefix) or not tracer.recording:
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET"))
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        answered: dict[str, int] = {}

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                answered["status"] = int(message["status"])
            await send(message)

        with tracer.start_as_current_span(
            f"{method} {path}",
            attributes={"http.request.method": method, "url.path": path},
            kind=SpanKind.SERVER,
            context=TRACE_CONTEXT.extract(carrier),
        ) as span:
            await self.app(scope, receive, sending)
            route = scope.get("route")
            if route is not None and hasattr(route, "path"):
                span.update_name(f"{method} {route.path}")
                span.set_attribute("http.route", route.path)
            status = answered.get("status", 0)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, str(status)))
