"""One error body for every refusal: ``{"error": {"code", "message", "details"}}``.

status  code                    when
400     malformed_json          the body is not JSON (or not parseable)
401     unauthenticated         no, an unknown or a revoked bearer key
403     forbidden               the principal may not do this (AccessDeniedError, admin-only)
404     not_found               no such row in the caller's organisation, or another
                                organisation (NotFoundError); unknown route
405     method_not_allowed
409     conflict                the session has ended
413     payload_too_large       the body is over the configured limit
422     invalid_request         the body, path or query fails validation, or the runtime
                                refuses it (InvalidRequestError)
502     model_error             the model backend failed (ModelError)
503     unavailable             the runtime is not open, or the database is unreachable
500     internal_error          anything else (logged with its traceback)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from cortex_ray import (
    AccessDeniedError,
    ConflictError,
    CortexError,
    InvalidRequestError,
    ModelError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from serve._schemas import ApiError, ErrorBody, ErrorDetail

__all__ = ["ApiProblem", "error_response", "install_error_handlers", "status_of"]

log = logging.getLogger("serve.api")

_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    500: "internal_error",
    502: "model_error",
    503: "unavailable",
}


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


def error_response(
    status_code: int,
    message: str,
    *,
    code: str | None = None,
    details: list[ErrorDetail] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ApiError(
        error=ErrorBody(
            code=code or _CODES.get(status_code, "error"), message=message, details=details or []
        )
    )
    return JSONResponse(
        body.model_dump(mode="json", by_alias=True), status_code=status_code, headers=headers
    )


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


def _status_table() -> tuple[tuple[type[CortexError], int], ...]:
    table: list[tuple[type[CortexError], int]] = [  # first match wins
        (NotFoundError, 404),
        (InvalidRequestError, 422),
        (AccessDeniedError, 403),
        (ConflictError, 409),
        (ModelError, 502),
        (StorageError, 503),
        (UnavailableError, 503),
    ]
    return tuple(table)


_CORTEX_STATUS = _status_table()


def status_of(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, code, message) for an error raised behind a route."""
    if isinstance(exc, CortexError):
        for kind, status in _CORTEX_STATUS:
            if isinstance(exc, kind):
                return status, _CODES[status], str(exc)
    return 500, _CODES[500], "internal error"


async def _on_cortex(request: Request, exc: Exception) -> JSONResponse:
    status, code, message = status_of(exc)
    if status == 500:
        log.error("unexpected cortex-ray error", exc_info=exc)
    return error_response(status, message, code=code)


async def _on_data_error(request: Request, exc: Exception) -> JSONResponse:
    # A value PostgreSQL cannot hold (validation should have caught it first).
    log.warning("the database refused a value: %s", exc)
    return error_response(422, "a value in the request cannot be stored")


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(CortexError, _on_cortex)
    app.add_exception_handler(psycopg.DataError, _on_data_error)
    app.add_exception_handler(Exception, _on_unexpected)
