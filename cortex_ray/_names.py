"""What a name or a piece of text may hold, decided once for every door (HTTP, CLI, Python).

**Names** of the objects a client addresses by name in a URL path (agents, workflows,
secrets, connectors, eval suites, knowledge collections) are 1 to 128 characters of
``A-Z a-z 0-9 _ . -``, the first a letter or a digit (:data:`NAME_PATTERN`). Such a name
is one path segment as it is: no percent-encoding, no ``/``, nothing a client, proxy or
shell normalises (``..``, spaces, quotes), and it cannot be mistaken for an option
(``-x``). Kinds with a narrower rule of their own (a workflow is lower case, a connector
or secret an identifier) keep it on top of this one. Rows created before the rule keep
working by id (docs/api.md, "Names").

**Text** anywhere (names included) holds no NUL character and no lone surrogate:
PostgreSQL stores neither, a tokenizer cannot read a surrogate, and a surrogate cannot be
written to a UTF-8 log or response (:func:`text_problem`, :func:`json_problem`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from cortex_ray._exceptions import InvalidRequestError

__all__ = [
    "MAX_JSON_DEPTH",
    "NAME_PATTERN",
    "NAME_RULE",
    "SafeName",
    "check_name",
    "is_safe_name",
    "json_problem",
    "text_problem",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""The safe set of an addressable name (see the module's docstring)."""

NAME_RULE = "1 to 128 characters of A-Z a-z 0-9 _ . -, starting with a letter or a digit"
""":data:`NAME_PATTERN` in words, for error messages and docs."""

MAX_JSON_DEPTH = 32
"""The deepest nesting of a free-form JSON value that is accepted."""

_NAME = re.compile(NAME_PATTERN)
_QUOTE_LIMIT = 40


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored or shown (a NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "text must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (no lone surrogates)"
    return None


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Why a free-form JSON value cannot be stored (a NUL or lone surrogate in any key or
    string, nested deeper than :data:`MAX_JSON_DEPTH`), or None."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return text_problem(value)
    items: list[Any]
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    for item in items:
        if (reason := json_problem(item, depth + 1)) is not None:
            return reason
    return None


def is_safe_name(value: str) -> bool:
    """Whether ``value`` is in the safe set of names."""
    return _NAME.fullmatch(value) is not None


def _quoted(value: str) -> str:
    shown = value[:_QUOTE_LIMIT].encode("utf-8", "replace").decode("utf-8")
    more = f"… ({len(value)} characters)" if len(value) > _QUOTE_LIMIT else ""
    return f"{shown!r}{more}"


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a safe name for a ``kind`` (``"agent"``, ``"workflow"``, ...).

    Raises:
        InvalidRequestError: It is not (the message quotes it truncated and says the rule).
    """
    if not is_safe_name(value):
        raise InvalidRequestError(f"{kind} name {_quoted(value)}: {NAME_RULE}")
    return value


def _safe(value: str) -> str:
    if not is_safe_name(value):
        raise PydanticCustomError("invalid_name", "a name is {rule}", {"rule": NAME_RULE})
    return value


SafeName = Annotated[
    str,
    AfterValidator(_safe),
    Field(json_schema_extra={"pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128}),
]
"""A name in the safe set, as a pydantic field type (the HTTP bodies' names use it)."""
