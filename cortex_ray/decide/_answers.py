"""Checks on the text an agent hands a person: a run's result, an interactive reply.

Small models copy the shape of their prompt into the answer: a lead-in written twice ("The
final answer is: The final answer is: 42") and template placeholders nobody renders
("It's currently {{current_time}}."). A repeated lead-in is collapsed (the answer is still
there); a placeholder is refused, since it stands where a value should be: the drivers
ask once more, naming the tool that gives the value when there is one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["collapse_lead_in", "placeholder_note", "placeholders"]

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]{0,80}?)\s*\}\}")
_LEAD_IN = re.compile(r"\s*([^\n:]{1,80}:)\s*")


def placeholders(text: str) -> list[str]:
    """The ``{{...}}`` placeholders in ``text``, as written."""
    return [m.group(0) for m in _PLACEHOLDER.finditer(text)]


def collapse_lead_in(text: str) -> str:
    """``text`` with a lead-in ending in ":" said once, however often it was repeated."""
    head = _LEAD_IN.match(text)
    if head is None:
        return text
    lead = head.group(1)
    rest = text[head.end() :]
    repeated = False
    while rest[: len(lead)].casefold() == lead.casefold():
        rest = rest[len(lead) :].lstrip()
        repeated = True
    return f"{lead} {rest}" if repeated else text


def placeholder_note(found: list[str], tools: Iterable[str]) -> str:
    """What the model is told when its answer holds ``found`` placeholders."""
    names = {m.group(1).strip() for p in found if (m := _PLACEHOLDER.match(p))}
    callable_ = sorted(names & set(tools))
    what = ", ".join(found)
    if callable_:
        how = f"To get that value, call the tool {' or '.join(callable_)} first."
    else:
        how = "Write the actual value, or say plainly that you do not know it."
    return (
        f"Your answer contained {what}: a placeholder that nothing fills in, so the person "
        f"would see it as written. {how}"
    )
