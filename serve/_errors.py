"""One error body for every refusal: ``{"error": {"code", "message", "details", "correlationId"}}``.

status  code                    when
400     malformed_json          the body is not JSON (or not parseable)
401     unauthenticated         no, an unknown or a revoked bearer key
403     forbidden               the principal may not do this (AccessDeniedError, admin-only)
404     not_found               no such row in the caller's organisation, or another
                                organisation (NotFoundError); unknown route
405     method_not_allowed
409     conflict                the session has ended, or its queue of turns is full
                                (ConflictError, SessionBusyError)
413     payload_too_large       the body is over the configured limit
422     invalid_request         the body, path or query fails validation, or the runtime
                                refuses it (InvalidRequestError)
500     internal_error          anything else: the body says only "internal error"
502     model_error             the model backend failed (ModelError)
503     overloaded              at capacity: a turn or run refused before it was accepted,
                                nothing recorded; ``Retry-After`` says when (OverloadedError)
503     unavailable             the runtime is not open, the database is unreachable, a
                                session actor died or cannot be reached, a deployment is
                                down or over its queue (UnavailableError, StorageError,
                                Ray's actor errors, Serve's unavailable and back-pressure
                                errors)
504     timeout                 something behind the route did not answer in time
                                (TimeoutError, Ray's GetTimeoutError), or accepted work
                                reached its own deadline (DeadlineExceededError: its message
                                says whose and what it waited for)

The model app answers the same body in OpenAI's dialect (``{"error": {"message", "type",
"param", "code", "correlationId"}}``, :func:`openai_problem`); both are written by
``serve._error_body``, which cannot fail (ASCII-escaped JSON, bounded messages, user input
quoted truncated by :func:`quote`).

What a client reads is decided here, and only here. An error from a session actor or a
deployment arrives wrapped by Ray (``RayTaskError``: its ``str`` is the remote traceback, with
colour codes, the worker's pid and IP and the actor's id and repr); :func:`root_cause` takes
the wrapper off (``RayTaskError.cause``) and :func:`status_of` maps the cause by type. A
cortex-ray error's own message is shown (4xx, and 503 from ``UnavailableError``, whose
messages say whether to retry); model and storage failures get a fixed message, since theirs
wrap a backend's text (URLs, hosts); anything unexpected is "internal error".

Every request has a correlation id: the client's ``X-Correlation-Id`` or ``X-Request-Id``
when well-formed (1–128 of ``A-Z a-z 0-9 . _ : -``), else a new one (behind Ray Serve the
proxy has set ``X-Request-Id`` to its request id by then). Every response carries it
in the ``X-Correlation-Id`` header, every error body as ``correlationId`` (the SSE ``error``
event too), and :func:`report` writes the full detail (the traceback, Ray's text) to the
``serve.api`` log with it, so one id leads from what a client saw to what happened.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray.exceptions import (
    GetTimeoutError,
    LocalRayletDiedError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RaySystemError,
    RayTaskError,
    TaskCancelledError,
    WorkerCrashedError,
)
from ray.serve.exceptions import BackPressureError, RayServeException, gRPCStatusError
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cortex_ray import (
    AccessDeniedError,
    ConflictError,
    CortexError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelError,
    NotFoundError,
    OverloadedError,
    StorageError,
    UnavailableError,
)
from serve._error_body import (
    CODES,
    CORRELATION_HEADER,
    clean_message,
    correlation_id,
    current_correlation,
    error_response,
    openai_error_response,
    printable,
    quote,
)
from serve.schemas import ErrorDetail

__all__ = [
    "CORRELATION_HEADER",
    "ApiProblem",
    "CorrelationMiddleware",
    "Problem",
    "correlated",
    "correlation_id",
    "error_response",
    "headers_of",
    "install_error_handlers",
    "openai_error_response",
    "openai_problem",
    "printable",
    "quote",
    "report",
    "root_cause",
    "status_of",
]

log = logging.getLogger("serve.api")

_REQUEST_HEADERS = ("x-correlation-id", "x-request-id")
_WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_MAX_UNWRAP = 8
_CODES = CODES

_INTERNAL = "internal error"
_MODEL_FAILED = "the model backend failed; try again later"
_DATABASE_DOWN = "the database is unavailable; try again later"
_ACTOR_DOWN = "the session's actor is unavailable; try again later"
_SERVICE_DOWN = "the service is unavailable; try again later"
_OVERLOADED = "the service is over its queue; try again later"
_CANCELLED = "the request was cancelled before it finished"
_TIMED_OUT = "the request did not finish in time; try again later"

_current = current_correlation


class ApiProblem(HTTPException):
    """An HTTP error with a stable code, raised by routes and dependencies."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.code = code or _CODES.get(status_code, "error")


@dataclass(frozen=True, slots=True)
class Problem:
    """What a client is told about a failure: the status, a stable code, a message that
    leaks nothing, and the correlation id under which the log holds the detail."""

    status: int
    code: str
    message: str
    correlation_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers the response carries (``Retry-After`` of an overload)."""


# correlation ids ---------------------------------------------------------------------------


def _requested_id(scope: Scope) -> str | None:
    headers = Headers(scope=scope)
    for name in _REQUEST_HEADERS:
        value = headers.get(name)
        if value is not None and _WELL_FORMED.fullmatch(value):
            return value
    return None


@asynccontextmanager
async def correlated(scope: Scope, send: Send) -> AsyncIterator[Send]:
    """The request's correlation id for what runs inside (``correlation_id()``), and a
    ``send`` that puts it on the response: for a layer in front of an app's middleware
    (``CorrelationMiddleware`` inside reuses the id)."""
    if scope["type"] != "http" or _current.get() is not None:
        yield send
        return
    cid = _requested_id(scope) or str(uuid.uuid4())
    token = _current.set(cid)

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            if CORRELATION_HEADER not in headers:
                headers[CORRELATION_HEADER] = cid
        await send(message)

    try:
        yield send_with_id
    finally:
        _current.reset(token)


Render = Callable[["Problem"], Response]
"""Writes a problem as an app's error body (the API's or the model app's dialect)."""


def _api_body(problem: Problem) -> Response:
    return error_response(
        problem.status, problem.message, code=problem.code, headers=problem.headers
    )


def openai_problem(problem: Problem) -> Response:
    """A problem in the model app's dialect (OpenAI's error body with the correlation id)."""
    return openai_error_response(
        problem.status, problem.message, code=problem.code, headers=problem.headers
    )


class CorrelationMiddleware:
    """Gives each HTTP request its correlation id (the client's, if well-formed; the one an
    outer layer already gave it), puts it on the response, and renders what no exception
    handler caught as the 500 error body (``render``: the app's dialect)."""

    def __init__(self, app: ASGIApp, render: Render = _api_body) -> None:
        self.app = app
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cid = _current.get() or _requested_id(scope) or str(uuid.uuid4())
        token = _current.set(cid)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                if CORRELATION_HEADER not in headers:
                    headers[CORRELATION_HEADER] = cid
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            what = f"{scope.get('method', '')} {scope.get('path', '')}"
            if started:  # the response is on its way: only the log can hear of it
                log.error("%s failed mid-response [correlation_id=%s]", what, cid, exc_info=exc)
                return
            problem = report(exc, what=what)
            await self.render(problem)(scope, receive, send_with_id)
        finally:
            _current.reset(token)


# mapping -----------------------------------------------------------------------------------


def root_cause(exc: BaseException) -> BaseException:
    """The exception under Ray's wrappers: ``RayTaskError`` (an actor's or a replica's
    exception, re-raised by Ray in the caller as ``RayTaskError(<cause class>)``: its ``cause``
    is the original), Serve's ``gRPCStatusError``, and a group of one."""
    for _ in range(_MAX_UNWRAP):
        inner: BaseException | None
        if isinstance(exc, RayTaskError):
            inner = exc.cause
        elif isinstance(exc, gRPCStatusError):
            inner = exc.original_exception
        elif isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            inner = exc.exceptions[0]
        else:
            return exc
        if not isinstance(inner, BaseException) or inner is exc:
            return exc
        exc = inner
    return exc


_clean = clean_message


_CORTEX_STATUS: tuple[tuple[type[CortexError], int], ...] = (  # first match wins
    (NotFoundError, 404),
    (InvalidRequestError, 422),
    (AccessDeniedError, 403),
    (ConflictError, 409),
    (ModelError, 502),
    (DeadlineExceededError, 504),
    (StorageError, 503),
    (UnavailableError, 503),
)

# Ray's errors of a process, node or object going away: what served the call is down.
_RAY_DOWN: tuple[type[BaseException], ...] = (
    RayActorError,
    WorkerCrashedError,
    NodeDiedError,
    LocalRayletDiedError,
    ObjectLostError,
    RaySystemError,
)


def _classify(cause: BaseException) -> tuple[int, str]:
    """(status, message) for an unwrapped exception."""
    if isinstance(cause, CortexError):
        for kind, status in _CORTEX_STATUS:
            if isinstance(cause, kind):
                if isinstance(cause, ModelError):
                    return status, _MODEL_FAILED
                if isinstance(cause, StorageError):
                    return status, _DATABASE_DOWN
                return status, _clean(str(cause), status)
        return 500, _INTERNAL
    if isinstance(cause, (TimeoutError, GetTimeoutError)):  # asyncio's and Ray's
        return 504, _TIMED_OUT
    if isinstance(cause, RayActorError):
        return 503, _ACTOR_DOWN
    if isinstance(cause, _RAY_DOWN):
        return 503, _SERVICE_DOWN
    if isinstance(cause, BackPressureError):
        return 503, _OVERLOADED
    if isinstance(cause, TaskCancelledError):  # Serve's RequestCancelledError too
        return 503, _CANCELLED
    if isinstance(cause, RayServeException):  # deployment or replica unavailable
        return 503, _SERVICE_DOWN
    if isinstance(cause, psycopg.DataError):
        # A value PostgreSQL cannot hold (validation should have caught it first).
        return 422, "a value in the request cannot be stored"
    if isinstance(cause, psycopg.OperationalError):  # the pool's timeout included
        return 503, _DATABASE_DOWN
    return 500, _INTERNAL


def status_of(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, code, message) for an error raised behind a route (Ray's wrappers
    taken off first). Logs nothing: :func:`report` does."""
    cause = root_cause(exc)
    status, message = _classify(cause)
    code = "overloaded" if isinstance(cause, OverloadedError) else _CODES[status]
    return status, code, message


def headers_of(exc: BaseException) -> dict[str, str]:
    """Headers an error's response carries: ``Retry-After`` (whole seconds) of an
    overload."""
    cause = root_cause(exc)
    if isinstance(cause, OverloadedError):
        return {"Retry-After": str(max(1, math.ceil(cause.retry_after_s)))}
    return {}


def _detail(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails must not stop its report
        text = "<unprintable>"
    return printable(f"{type(exc).__module__}.{type(exc).__qualname__}: {text}")


def report(exc: BaseException, *, what: str) -> Problem:
    """Map ``exc`` for a client and log its full detail under the request's correlation id:
    a server error (5xx) with its traceback at ERROR, a refusal (4xx) at INFO."""
    cid = correlation_id()
    status, code, message = status_of(exc)
    what = printable(what, 300)
    extra = {"correlation_id": cid, "status": status, "code": code}
    if status >= 500:
        log.error(
            "%s failed: %d %s [correlation_id=%s]: %s",
            what, status, code, cid, _detail(exc), exc_info=exc, extra=extra,
        )  # fmt: skip
    else:
        log.info(
            "%s refused: %d %s [correlation_id=%s]: %s",
            what, status, code, cid, _detail(exc), extra=extra,
        )  # fmt: skip
    return Problem(status, code, message, cid, headers_of(exc))


# responses ---------------------------------------------------------------------------------


def _validation_details(errors: list[dict[str, Any]]) -> list[ErrorDetail]:
    return [
        ErrorDetail(
            loc=[p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
            msg=str(e.get("msg", "invalid")),
            type=str(e.get("type", "")),
        )
        for e in errors[:20]
    ]


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    details = _validation_details(errors)
    if any(e.get("type") == "json_invalid" for e in errors):
        message = "the body is not valid JSON"
        return error_response(400, message, code="malformed_json", details=details)
    first = details[0] if details else None
    where = ".".join(str(p) for p in first.loc) if first else ""
    message = f"{where}: {first.msg}" if first and where else (first.msg if first else "invalid")
    return error_response(422, message, details=details)


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = exc.code if isinstance(exc, ApiProblem) else None
    message = str(exc.detail)
    if exc.status_code == 413 and code is None:
        message = "the request body is larger than this server accepts"
        if (limit := request.scope.get("starlette.max_body_size")) is not None:
            message += f" ({limit} bytes)"
    if exc.status_code == 400 and code is None and "parsing the body" in message:
        code = "malformed_json"
    return error_response(exc.status_code, message, code=code, headers=exc.headers)


async def _on_error(request: Request, exc: Exception) -> JSONResponse:
    problem = report(exc, what=f"{request.method} {request.url.path}")
    return error_response(
        problem.status, problem.message, code=problem.code, headers=problem.headers
    )


def install_error_handlers(app: FastAPI) -> None:
    """The error body for every failure of ``app``, and a correlation id for every request."""
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(CortexError, _on_error)
    app.add_exception_handler(psycopg.Error, _on_error)
    # Everything else reaches CorrelationMiddleware (inside Starlette's last-resort handler,
    # so the 500 body and the log line carry the request's correlation id); the handler
    # below is only Starlette's fallback should anything escape it.
    app.add_exception_handler(Exception, _on_error)
    app.add_middleware(CorrelationMiddleware)
