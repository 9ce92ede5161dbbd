"""The model-based extractor: a batch of passages → facts, through a chat model asked for
JSON under a schema, kept only where the evidence is in the text.

A passage is immutable evidence whose text is exactly ``file_bytes[byte_start:byte_end]``
of its version (docs/knowledge.md), so a quote found in the text is also a byte range and a
line range of the file. The model is asked, per batch of passages, for facts with a quote
copied from the passage they come from; what it answers is validated with pydantic (an
answer that does not parse, or a fact that does not validate, is counted and dropped), and a
fact is kept only when its quote occurs verbatim in its passage and names both its subject
and its object. That check is what keeps invented facts out of the record: a model can
write anything, but it cannot make a sentence appear in a file.

No Ray here: the job (``jobs.graph_extract``) runs this in its actors; tests drive it with
the scripted model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cortex_ray._exceptions import StructuredOutputError
from cortex_ray.models import ChatMessage, ModelClient, structured_call

__all__ = [
    "MODEL",
    "PROMPT_VERSION",
    "BatchOutcome",
    "ModelFact",
    "Passage",
    "PublishedVersion",
    "extract_batch",
    "locate",
    "model_method_version",
    "plan_batches",
]

MODEL = "model"
"""The extraction method of the model-based extractor."""

PROMPT_VERSION = "prompt-1"
"""Part of every model assertion's extraction version; bump it when the prompt or schema
changes (a new version extracts every version again)."""

_MAX_NAME = 200
_MAX_QUOTE = 400
_MAX_FACTS = 48  # per call: bounds the answer (and the grammar) of a batch
_FACTS_PER_PASSAGE = 6  # the schema's bound: a small model that repeats itself must stop
_SNAKE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def model_method_version(model_name: str) -> str:
    """The extraction version recorded for ``model_name``'s facts: the model and the prompt."""
    return f"{model_name}/{PROMPT_VERSION}"


@dataclass(frozen=True, slots=True)
class Passage:
    """One published passage: its text and where it starts in its version's file."""

    source_id: str
    version: int
    ordinal: int
    text: str
    byte_start: int
    line_start: int


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    """A source version a published generation serves."""

    source_id: str
    version: int
    key: str  # the registry path
    collection: str
    created_at: datetime


def _snake(value: Any) -> Any:
    """``Owned By`` → ``owned_by``: a type or predicate in the record's spelling."""
    if not isinstance(value, str):
        return value
    return re.sub(r"[^a-z0-9]+", "_", value.strip().lower()).strip("_")


class ModelFact(BaseModel):
    """One fact as the model states it (validated before anything else looks at it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    passage: int = Field(ge=1)
    subject: str = Field(min_length=1, max_length=_MAX_NAME)
    subject_type: str
    predicate: str
    object: str = Field(min_length=1, max_length=_MAX_NAME)
    object_type: str
    evidence: str = Field(min_length=1, max_length=_MAX_QUOTE)

    @field_validator("subject_type", "predicate", "object_type", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        value = _snake(value)
        if isinstance(value, str) and not _SNAKE.match(value):
            raise ValueError("expected a snake_case name of 1 to 64 characters")
        return value

    @field_validator("subject", "object", "evidence")
    @classmethod
    def _text(cls, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise ValueError("empty or NUL")
        return value


class _Answer(BaseModel):
    """The answer's envelope; each fact is validated on its own (one bad fact does not
    cost the others)."""

    facts: list[dict[str, Any]] = Field(max_length=_MAX_FACTS)


def _schema(passages: int) -> dict[str, Any]:
    name = {"type": "string", "minLength": 1, "maxLength": _MAX_NAME}
    label = {"type": "string", "minLength": 1, "maxLength": 40}
    fact = {
        "type": "object",
        "properties": {
            # an enum, not minimum/maximum: llama.cpp's grammar ignores integer bounds
            "passage": {"type": "integer", "enum": list(range(1, passages + 1))},
            "subject": name,
            "subject_type": label,
            "predicate": label,
            "object": name,
            "object_type": label,
            "evidence": {"type": "string", "minLength": 1, "maxLength": _MAX_QUOTE},
        },
        "required": [
            "passage",
            "subject",
            "subject_type",
            "predicate",
            "object",
            "object_type",
            "evidence",
        ],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": fact,
                "maxItems": min(_MAX_FACTS, _FACTS_PER_PASSAGE * passages),
            }
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


_SYSTEM = (
    "You extract facts for a knowledge graph. For each numbered passage, list the "
    "relationships the passage states between two named things: the subject, a predicate "
    "(a short snake_case verb phrase such as owned_by, depends_on, runs_on, part_of), the "
    "object, the type of each (a snake_case noun such as person, team, service, system, "
    "document, product), the number of the passage, and the evidence: a short quote copied "
    "exactly, character for character, from that passage, which states the fact and "
    "contains both the subject and the object as written there. Never state a fact the "
    "passage does not. If a passage states none, list nothing for it. Answer "
    '{"facts": []} when no passage states any.'
)


def _prompt(passages: Sequence[Passage]) -> list[ChatMessage]:
    shown = "\n\n".join(f"Passage {i}:\n<<<\n{p.text}\n>>>" for i, p in enumerate(passages, 1))
    return [ChatMessage(role="system", content=_SYSTEM), ChatMessage(role="user", content=shown)]


def _key(text: str) -> str:
    """``graph_key``'s normalisation (lower case, whitespace collapsed)."""
    return " ".join(text.split()).lower()


def locate(passage: Passage, quote: str) -> tuple[int, int, int, int] | None:
    """The ``(byte_start, byte_end, line_start, line_end)`` of the first verbatim
    occurrence of ``quote`` (its surrounding whitespace stripped) in the passage's file, or
    ``None`` when the passage does not contain it."""
    quote = quote.strip()
    at = passage.text.find(quote) if quote else -1
    if at < 0:
        return None
    start = passage.byte_start + len(passage.text[:at].encode("utf-8"))
    line = passage.line_start + passage.text.count("\n", 0, at)
    return start, start + len(quote.encode("utf-8")), line, line + quote.count("\n")


@dataclass
class BatchOutcome:
    """What one call gave: the facts kept (``graph_assert`` rows without the run's fields)
    and what was dropped, by reason."""

    passages: int = 0
    calls: int = 0
    invalid_outputs: int = 0  # answers that did not parse or validate (after retries)
    invalid_facts: int = 0  # facts that did not validate
    unsupported: int = 0  # facts whose quote is not in their passage or omits a name
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: BatchOutcome) -> None:
        self.passages += other.passages
        self.calls += other.calls
        self.invalid_outputs += other.invalid_outputs
        self.invalid_facts += other.invalid_facts
        self.unsupported += other.unsupported
        self.rows += other.rows


def plan_batches(
    passages: Sequence[Passage], *, batch_passages: int, batch_chars: int
) -> list[list[Passage]]:
    """Passages in order, grouped into batches of at most ``batch_passages`` passages and
    ``batch_chars`` characters of text (a longer passage is a batch of its own)."""
    batches: list[list[Passage]] = []
    current: list[Passage] = []
    size = 0
    for p in passages:
        if current and (len(current) >= batch_passages or size + len(p.text) > batch_chars):
            batches.append(current)
            current, size = [], 0
        current.append(p)
        size += len(p.text)
    if current:
        batches.append(current)
    return batches


async def extract_batch(
    client: ModelClient,
    passages: Sequence[Passage],
    *,
    confidence: float,
    retries: int = 1,
    max_tokens: int | None = None,
    priority: int = 0,
) -> BatchOutcome:
    """Ask ``client`` for the facts of ``passages`` (one structured call, retried on invalid
    output ``retries`` times) and keep those whose evidence is verbatim in their passage.

    A model or server failure (``ModelError``) propagates: the job fails rather than
    recording the versions as extracted.
    """
    outcome = BatchOutcome(passages=len(passages), calls=1)
    try:
        answer = await structured_call(
            client,
            _prompt(passages),
            schema=_schema(len(passages)),
            validate=_Answer.model_validate,
            schema_name="graph_facts",
            retries=retries,
            max_tokens=max_tokens,
            temperature=0.0,
            priority=priority,
        )
    except StructuredOutputError:
        outcome.invalid_outputs += 1
        return outcome
    seen: set[tuple[str, ...]] = set()
    for raw in answer.facts:
        try:
            fact = ModelFact.model_validate(raw)
        except ValidationError:
            outcome.invalid_facts += 1
            continue
        if fact.passage > len(passages):
            outcome.invalid_facts += 1
            continue
        passage = passages[fact.passage - 1]
        span = locate(passage, fact.evidence)
        quote = _key(fact.evidence)
        if span is None or _key(fact.subject) not in quote or _key(fact.object) not in quote:
            outcome.unsupported += 1
            continue
        row_key = (
            fact.subject_type,
            _key(fact.subject),
            fact.predicate,
            fact.object_type,
            _key(fact.object),
            passage.source_id,
            str(span[0]),
        )
        if row_key in seen:
            continue
        seen.add(row_key)
        outcome.rows.append(
            {
                "s_type": fact.subject_type,
                "s_name": fact.subject.strip(),
                "p": fact.predicate,
                "o_type": fact.object_type,
                "o_name": fact.object.strip(),
                "source_id": passage.source_id,
                "source_version": passage.version,
                "confidence": confidence,
                "byte_start": span[0],
                "byte_end": span[1],
                "line_start": span[2],
                "line_end": span[3],
            }
        )
    return outcome
