"""Bounded regular expressions in schemas that people write (a workflow version's input
schema, a connector grant's constraints): the ``pattern`` and ``patternProperties``
keywords, which ``jsonschema`` would run with Python's ``re``, a backtracking engine with
no time limit. A pattern such as ``^(a+)+$`` takes exponential time on ``"aaaa…!"``: one
run start (or one governed call) could hold a process's event loop for minutes.

Two guards, both needed:

- **when a schema is published** (or a grant made), each pattern is at most
  ``max_pattern_chars`` long and must compile (``check_patterns``): a short pattern can
  still be catastrophic, so this alone is not enough;
- **when a value is checked**, the patterns run on the ``regex`` engine (re-compatible
  syntax) with a timeout, out of one time budget for the whole check
  (``bounded_validator``, ``pattern_budget``): a pattern that runs out of it is a refusal
  that names the pattern, never a hang. A run's inputs are capped in size before any
  pattern sees them.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jsonschema
import regex
from jsonschema import ValidationError
from jsonschema.protocols import Validator

from cortex_ray._exceptions import InvalidRequestError

__all__ = [
    "BoundedValidator",
    "InputLimits",
    "PatternTimeout",
    "bounded_validator",
    "check_patterns",
    "pattern_budget",
]


@dataclass(frozen=True)
class InputLimits:
    """What a workflow run's inputs and its version's schema may cost (settings
    ``workflow_input_max_bytes``, ``schema_pattern_max_chars``, ``schema_pattern_budget_s``)."""

    max_bytes: int = 64 * 1024
    """The inputs as JSON, at most."""
    max_pattern_chars: int = 1000
    """A schema's ``pattern`` (or ``patternProperties`` key), at most, when published."""
    pattern_budget_s: float = 0.25
    """All the pattern matches of one check of inputs together, at most."""


class PatternTimeout(Exception):
    """A schema's pattern ran out of the check's time budget."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.pattern = pattern


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "cortex_pattern_deadline", default=None
)


def _search(pattern: str, text: str) -> bool:
    deadline = _DEADLINE.get()
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise PatternTimeout(pattern)
    try:
        return regex.search(pattern, text, timeout=left) is not None
    except TimeoutError:
        raise PatternTimeout(pattern) from None


def _pattern(
    validator: Validator, patrn: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Validator, pattern_properties: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _search(patrn, key):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


BoundedValidator: type[Validator] = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties},
)
"""Draft 2020-12, its patterns run on ``regex`` within the current ``pattern_budget``
(none set: unbounded, so use it inside one)."""


@contextmanager
def pattern_budget(budget_s: float) -> Iterator[None]:
    """While the block runs, every ``BoundedValidator`` pattern match of this task together
    takes at most ``budget_s`` (``PatternTimeout`` when they run out)."""
    token = _DEADLINE.set(time.monotonic() + budget_s)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def bounded_validator(schema: dict[str, Any], budget_s: float) -> Iterator[Validator]:
    """A ``BoundedValidator`` of ``schema`` within ``pattern_budget(budget_s)``."""
    with pattern_budget(budget_s):
        yield BoundedValidator(schema)


def check_patterns(schema: Any, max_chars: int, where: str = "input_schema") -> None:
    """Every ``pattern`` (and ``patternProperties`` key) in ``schema``, at any depth, is at
    most ``max_chars`` long and compiles.

    Raises:
        InvalidRequestError: Naming the path of the first that does not.
    """

    def check(patrn: str, path: str) -> None:
        if len(patrn) > max_chars:
            raise InvalidRequestError(
                f"{where}: {path}: a pattern is at most {max_chars} characters, got {len(patrn)}"
            )
        try:
            regex.compile(patrn)
        except regex.error as exc:
            raise InvalidRequestError(f"{where}: {path}: invalid pattern: {exc}") from None

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{path}/{key}" if path else str(key)
                if key == "pattern" and isinstance(value, str):
                    check(value, here)
                elif key == "patternProperties" and isinstance(value, dict):
                    for patrn in value:
                        check(str(patrn), f"{here}/{patrn}")
                walk(value, here)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}/{i}")

    walk(schema, "")
