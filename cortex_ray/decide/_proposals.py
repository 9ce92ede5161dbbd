"""The proposal's schemas and its parsing: what the planner may propose, and which of its
candidates are valid.

- ``proposal_schema``: the agent's tools, each with its own argument schema, or a finish;
  once the run has observations, what remains (or the objective's checklist) comes first.
- ``parse_candidates``: every candidate validated again (an unconstrained backend can
  produce anything): unknown tools, bad arguments, placeholders and duplicates are recorded
  as invalid, never selected.
- ``nothing_left``: whether the planner's "remaining" says the objective is met.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from cortex_ray._types import Candidate, ToolSpec
from cortex_ray.decide._answers import collapse_lead_in, placeholder_note, placeholders

__all__ = [
    "RATIONALE_CHARS",
    "REMAINING_CHARS",
    "finish_schema",
    "nothing_left",
    "parse_candidates",
    "proposal_schema",
]


# A rationale is a sentence; bounding it keeps a small model from repeating itself inside
# the string until the token limit cuts the JSON off.
RATIONALE_CHARS = 200


# What the planner says is still to do, before it proposes (once it has observations):
# bounded like a rationale.
REMAINING_CHARS = 160


def proposal_schema(
    tools: tuple[ToolSpec, ...], k: int, *, remaining: bool = False, parts: int = 0
) -> dict[str, Any]:
    """``{"candidates": [...]}``; with ``remaining``, a ``"remaining"`` string comes first:
    what part of the objective is not done yet. Constrained decoding writes properties in
    the schema's order, so the model states what is left before it proposes (issue 14:
    without it, small models kept calling tools after the objective was met)."""
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {
                "tool": {"const": t.name},
                "args": t.parameters,
                "rationale": {"type": "string", "maxLength": RATIONALE_CHARS},
            },
            "required": ["tool", "args", "rationale"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    options.append(_finish_option())
    properties: dict[str, Any] = {}
    if parts:
        # The objective's checklist: one true/false per part, in order.
        properties["done"] = {
            "type": "array",
            "items": {"type": "boolean"},
            "minItems": parts,
            "maxItems": parts,
        }
    elif remaining:
        properties["remaining"] = {"type": "string", "maxLength": REMAINING_CHARS}
    properties["candidates"] = {
        "type": "array",
        "items": {"anyOf": options},
        "minItems": 1,
        "maxItems": k,
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _finish_option() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "finish": {"const": True},
            "message": {"type": "string"},
            "rationale": {"type": "string", "maxLength": RATIONALE_CHARS},
        },
        "required": ["finish", "message", "rationale"],
        "additionalProperties": False,
    }


def finish_schema() -> dict[str, Any]:
    """A finish alone: the final answer once the planner said nothing remains."""
    return _finish_option()


_NOTHING = re.compile(
    r"^(nothing(?! but)|none(?! of)|no ?thing|n/?a|-+|no (part|step|action)s?|"
    r"all (parts )?(are )?done|every(thing| part) (is )?done|"
    r"the objective is (met|done|complete))\b"
)


def nothing_left(remaining: str) -> bool:
    """Whether the planner's "remaining" says every part of the objective is done."""
    text = remaining.strip().strip(".!\"'").casefold()
    return bool(_NOTHING.match(text))


# Compiled argument validators by the id of the schema they were built from (kept with it,
# so a reused id never answers for another schema). The registry hands out one ToolSpec per
# tool, so this holds one per tool; bounded in case specs are built elsewhere.
_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft202012Validator]] = {}


def _validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_VALIDATORS) >= 256:
            _VALIDATORS.clear()
        cached = (schema, jsonschema.Draft202012Validator(schema))
        _VALIDATORS[id(schema)] = cached
    return cached[1]


def parse_candidates(raw: Any, tools: tuple[ToolSpec, ...], k: int) -> list[Candidate]:
    """Shape-check the proposal and validate each candidate; raise if none is usable."""
    if not isinstance(raw, dict) or not isinstance(raw.get("candidates"), list):
        raise ValueError('expected {"candidates": [...]}')
    by_name = {t.name: t for t in tools}
    out: list[Candidate] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw["candidates"][:k]):
        if isinstance(item, dict):
            # The same idea proposed twice is one candidate: scoring copies says nothing.
            key = json.dumps(
                {f: item.get(f) for f in ("tool", "args", "finish", "message")}, sort_keys=True
            )
            if key in seen:
                out.append(
                    Candidate(
                        index=i,
                        kind="finish" if item.get("finish") is True else "tool",
                        tool=item.get("tool") if isinstance(item.get("tool"), str) else None,
                        valid=False,
                        invalid_reason=f"the same as candidate {seen[key]}",
                    )
                )
                continue
            seen[key] = i
        if not isinstance(item, dict):
            out.append(Candidate(index=i, kind="tool", valid=False, invalid_reason="not an object"))
            continue
        rationale = str(item.get("rationale", ""))
        if item.get("finish") is True or ("message" in item and "tool" not in item):
            message = item.get("message")
            why: str | None = None
            if isinstance(message, str) and message.strip():
                message = collapse_lead_in(message.strip())
                if found := placeholders(message, by_name):
                    why = placeholder_note(found, by_name)
            else:
                why = "finish without a message"
            out.append(
                Candidate(
                    index=i,
                    kind="finish",
                    message=message if isinstance(message, str) else None,
                    rationale=rationale,
                    valid=why is None,
                    invalid_reason=why,
                )
            )
            continue
        name = item.get("tool")
        args = item.get("args", {})
        reason = None
        if not isinstance(name, str) or name not in by_name:
            reason = f"unknown tool {name!r}"
        elif not isinstance(args, dict):
            reason = "invalid arguments: not an object"
        else:
            error = next(iter(_validator(by_name[name].parameters).iter_errors(args)), None)
            if error is not None:
                reason = f"invalid arguments: {error.message}"
            elif held := _held_placeholders(args, by_name):
                # "remember_fact(fact='It is [current_time].')" would store the placeholder.
                key, found = held
                reason = f"invalid arguments: {key}: " + placeholder_note(found, by_name)
        out.append(
            Candidate(
                index=i,
                kind="tool",
                tool=name if isinstance(name, str) else None,
                args=args if isinstance(args, dict) else {},
                rationale=rationale,
                valid=reason is None,
                invalid_reason=reason,
            )
        )
    if not any(c.valid for c in out):
        reasons = "; ".join(c.invalid_reason or "" for c in out) or "no candidates"
        raise ValueError(f"no valid candidate ({reasons})")
    return out


def _held_placeholders(
    args: dict[str, Any], tools: dict[str, ToolSpec]
) -> tuple[str, list[str]] | None:
    """The first argument whose text holds a placeholder, and the placeholders."""
    for key, value in args.items():
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for text in texts:
            if isinstance(text, str) and (found := placeholders(text, tools)):
                return key, found
    return None
