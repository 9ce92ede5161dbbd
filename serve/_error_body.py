"""The one error body, rendered so that rendering it cannot fail (``serve._errors`` maps
exceptions to it; this module only writes it).

Both apps answer ``{"error": {"code", "message", "correlationId", ...}}``: the API adds
``details`` (the validation errors), the model app OpenAI's ``type`` and ``param`` (so the
official clients read it as they read OpenAI's). Whatever a message or detail holds, the
body is bounded and valid JSON: control characters and colour codes are dropped, a lone
surrogate is written as its escape (``\\ud800``), a message is at most ``MAX_MESSAGE``
characters and a quoted piece of user input at most ``QUOTE_LIMIT`` (:func:`quote`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from fastapi.responses import JSONResponse

from serve.schemas import ApiError, ErrorBody, ErrorDetail

__all__ = [
    "CODES",
    "CORRELATION_HEADER",
    "MAX_MESSAGE",
    "QUOTE_LIMIT",
    "ErrorJSONResponse",
    "clean_message",
    "correlation_id",
    "current_correlation",
    "error_response",
    "openai_body",
    "openai_error_response",
    "printable",
    "quote",
]

CORRELATION_HEADER = "X-Correlation-Id"
"""The response header naming the request's correlation id (also accepted on requests)."""

MAX_MESSAGE = 1000
"""The longest message a body carries (longer ones are cut, with "…")."""

QUOTE_LIMIT = 64
"""The most characters of a client's own input a message quotes."""

_MAX_DETAILS = 20
_MAX_DETAIL = 300
_MAX_LOG = 4000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_TRACEBACK_MARKS = ("Traceback (most recent call last)", 'File "')

CODES = {
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
    429: "too_many_requests",
    500: "internal_error",
    502: "model_error",
    503: "unavailable",
    504: "timeout",
}
_INTERNAL = "internal error"

current_correlation: ContextVar[str | None] = ContextVar("cortex_correlation_id", default=None)
"""The request's correlation id, set by ``serve._errors.CorrelationMiddleware``."""


def correlation_id() -> str:
    """The current request's correlation id (a new one outside a request)."""
    return current_correlation.get() or str(uuid.uuid4())


def printable(text: str, limit: int = _MAX_LOG) -> str:
    """``text`` fit for a UTF-8 log line or body: lone surrogates written as escapes,
    bounded (the rest cut, with how much there was)."""
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """A client's input quoted in a message: ``'abc'``, cut to ``limit`` characters
    (``'abc…' (100000 characters)``), control characters and surrogates escaped."""
    text = value if isinstance(value, str) else str(value)
    shown = repr(text[:limit] + ("…" if len(text) > limit else ""))
    more = f" ({len(text)} characters)" if len(text) > limit else ""
    return printable(shown + more)


def clean_message(message: str, status: int) -> str:
    """A message fit for a client: no colour codes or control characters, one line,
    bounded, valid UTF-8; a message that carries a traceback is replaced (the log has it)."""
    text = _CONTROL.sub(" ", _ANSI.sub("", message[: MAX_MESSAGE * 4]))
    text = printable(" ".join(text.split()), limit=MAX_MESSAGE * 4)
    if not text or any(mark in text for mark in _TRACEBACK_MARKS):
        return _INTERNAL if status >= 500 else CODES.get(status, "error").replace("_", " ")
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


class ErrorJSONResponse(JSONResponse):
    """JSON written ASCII-only: any text (a lone surrogate included) renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _detail(detail: ErrorDetail) -> ErrorDetail:
    loc = [p if isinstance(p, int) else printable(str(p), 100) for p in detail.loc[:16]]
    return ErrorDetail(
        loc=loc, msg=clean_message(detail.msg, 422)[:_MAX_DETAIL], type=detail.type[:100]
    )


def error_response(
    status_code: int,
    message: str,
    *,
    code: str | None = None,
    details: list[ErrorDetail] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The API's error body, with the request's correlation id in it and in its header."""
    cid = correlation_id()
    body = ApiError(
        error=ErrorBody(
            code=code or CODES.get(status_code, "error"),
            message=clean_message(message, status_code),
            details=[_detail(d) for d in (details or [])[:_MAX_DETAILS]],
            correlation_id=cid,
        )
    )
    return ErrorJSONResponse(
        body.model_dump(mode="json", by_alias=True),
        status_code=status_code,
        headers={**(headers or {}), CORRELATION_HEADER: cid},
    )


def openai_body(
    message: str,
    *,
    status: int,
    type: str,
    param: str | None,
    code: str | None,
    cid: str | None = None,
) -> dict[str, Any]:
    """The model app's error body: OpenAI's fields and the correlation id."""
    return {
        "error": {
            "message": clean_message(message, status),
            "type": type,
            "param": None if param is None else printable(param, 200),
            "code": code,
            "correlationId": cid or correlation_id(),
        }
    }


def openai_error_response(
    status_code: int,
    message: str,
    *,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The model app's error body (OpenAI's shape plus ``correlationId``) and header."""
    cid = correlation_id()
    kind = type or ("server_error" if status_code >= 500 else "invalid_request_error")
    body = openai_body(message, status=status_code, type=kind, param=param, code=code, cid=cid)
    return ErrorJSONResponse(
        body, status_code=status_code, headers={**(headers or {}), CORRELATION_HEADER: cid}
    )
