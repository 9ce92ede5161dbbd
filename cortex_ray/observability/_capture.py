"""Bounded, scrubbed copies of content (prompts, tool arguments and results) for spans and
diagnostics: nothing is captured unless a setting turns capture on, and what is captured
passes :func:`scrub` and a size cap first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cortex_ray.observability._scrub import scrub

__all__ = ["bound_messages", "bound_text", "captured"]


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit
    for _ in range(3):  # the marker's length depends on the count it reports
        keep = max(limit - len(f"… [{len(text) - keep} more chars]"), 0)
    return text[:keep] + f"… [{len(text) - keep} more chars]"


def _size(message: Mapping[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False, default=str))


def bound_messages(messages: Sequence[Mapping[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Scrubbed chat messages whose JSON fits in ``limit`` characters: the oldest are dropped
    first (a first ``system`` line says how many), and a last message still too long has
    its content cut."""
    kept = [dict(scrub(dict(m))) for m in messages]
    dropped = 0

    def marker() -> list[dict[str, Any]]:
        return [{"role": "system", "content": f"[{dropped} earlier messages dropped]"}]

    while len(kept) > 1 and sum(_size(m) for m in (marker() if dropped else []) + kept) > limit:
        kept.pop(0)
        dropped += 1
    if dropped:
        kept = marker() + kept
    over = sum(_size(m) for m in kept) - limit
    if over > 0 and isinstance(kept[-1].get("content"), str):
        content = kept[-1]["content"]
        kept[-1]["content"] = bound_text(content, max(len(content) - over, 0))
    return kept


def captured(value: Any, limit: int) -> str:
    """``value`` scrubbed, as JSON text (a string as itself), cut to ``limit`` characters."""
    clean = scrub(value)
    text = clean if isinstance(clean, str) else json.dumps(clean, ensure_ascii=False, default=str)
    return bound_text(text, limit)
