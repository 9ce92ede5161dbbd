"""The post-session extraction pass: durable facts out of a conversation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from cortex_ray._types import Turn
from cortex_ray.models import ChatMessage

__all__ = [
    "FACTS_SCHEMA",
    "MAX_FACTS",
    "extraction_keys",
    "facts_prompt",
    "normalise_subject",
    "validate_facts",
]

MAX_FACTS = 8
# SmolLM2, the packaged local model, reads 4096 tokens: keep the newest part of a long
# session rather than overflow its context.
MAX_CONVERSATION_CHARS = 6000

FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": MAX_FACTS,
            "items": {
                "type": "object",
                "properties": {
                    "subject": {"type": "string"},
                    "fact": {"type": "string"},
                },
                "required": ["subject", "fact"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["facts"],
    "additionalProperties": False,
}

_SYSTEM = (
    "You read a conversation between a person (user) and an assistant and list the durable "
    "facts worth remembering about the person and their world: preferences, names, plans, "
    "decisions, corrections. Skip greetings, small talk and what is only true for this "
    "moment. Give each fact a short subject naming what it is about (for example "
    '"user\'s favourite colour" or "project deadline") and one sentence stating it. Use '
    "the same subject for the same thing, so that a newer fact replaces an older one. "
    f"At most {MAX_FACTS} facts; an empty list when there are none."
)

_SPACE = re.compile(r"\s+")


def normalise_subject(subject: str | None) -> str | None:
    """The key under which facts supersede each other: lower-case, trimmed, single-spaced.

    Returns None for a missing or blank subject.
    """
    if subject is None:
        return None
    key = _SPACE.sub(" ", subject).strip().lower()
    return key or None


def extraction_keys(session_id: UUID) -> tuple[str, ...]:
    """The idempotency keys of a session's extracted facts, in the pass's order: the n-th
    fact of the session's extraction is ``session-end:<session id>:<n>`` (unique per
    organisation), so that a second pass (a retried end, two ends at once) finds the first
    pass's facts instead of writing them again."""
    return tuple(f"session-end:{session_id}:{n}" for n in range(MAX_FACTS))


def facts_prompt(conversation: Sequence[Turn]) -> list[ChatMessage]:
    """The messages of the extraction call for ``conversation``."""
    lines = [
        f"{turn.role}" + (f" ({turn.tool})" if turn.tool else "") + f": {turn.content}"
        for turn in conversation
    ]
    text = "\n".join(lines)
    if len(text) > MAX_CONVERSATION_CHARS:
        text = "…" + text[-MAX_CONVERSATION_CHARS:]
    return [
        ChatMessage(role="system", content=_SYSTEM),
        ChatMessage(
            role="user",
            content=f"Conversation:\n{text}\n\n"
            'Answer with JSON: {"facts": [{"subject": "...", "fact": "..."}]}',
        ),
    ]


def validate_facts(value: Any) -> list[tuple[str, str]]:
    """``(normalised subject, fact)`` pairs from the model's answer.

    Blank entries are dropped and a subject named twice keeps its last fact (two facts
    about one subject in one pass would only supersede each other at the same instant);
    anything not shaped like the schema raises so that the call is retried.
    """
    if not isinstance(value, dict) or not isinstance(value["facts"], list):
        raise ValueError('expected {"facts": [...]}')
    out: dict[str, str] = {}
    for item in value["facts"]:
        if not isinstance(item, dict):
            raise ValueError("each fact must be an object")
        subject, fact = item["subject"], item["fact"]
        if not isinstance(subject, str) or not isinstance(fact, str):
            raise ValueError("subject and fact must be strings")
        key = normalise_subject(subject)
        if key is None or not fact.strip():
            continue
        out.pop(key, None)  # re-insert so the order follows the last mention
        out[key] = fact.strip()
    return list(out.items())[:MAX_FACTS]
