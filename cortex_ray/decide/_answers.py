"""Checks on the text an agent hands a person: a run's result, an interactive reply.

Small models copy the shape of their prompt into the answer: a lead-in written twice ("The
final answer is: The final answer is: 42") and template placeholders nobody renders
("It's currently {{current_time}}.", "The time is [current_time]."). A repeated lead-in is
collapsed (the answer is still there); a placeholder is refused, since it stands where a
value should be: the drivers ask once more, naming the tool that gives the value when there
is one. A placeholder is ``{{anything}}``; a tool's name in single brackets, braces or
angle brackets (``[current_time]``, ``{current time}``, ``<current_time>``); or a short
lower-case phrase in square brackets or braces (``[current date and time]``, ``{date}``,
``[insert name]``), the template slots small models write where a value belongs; or an
action category in square brackets (``[RETRIEVAL]``), copied from the progress lines the
planner reads ("1. knowledge_search(...) [RETRIEVAL] OK: ..."). Ordinary bracketed text
("[1]", "[sic]", "[Note: ...]", "[OK]", ``{"a": 1}``) is left alone.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from typing import Any

from cortex_ray._types import MemoryKind, WorkingMemory

__all__ = [
    "claims_a_write",
    "collapse_lead_in",
    "evidence_of",
    "made_up_optionals",
    "placeholder_note",
    "placeholders",
    "tools_named",
    "unsupported_values",
]

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]{0,80}?)\s*\}\}")
_BRACKETED = re.compile(r"[\[{<]\s*([A-Za-z][\w .-]{0,60}?)\s*[\]}>]")
# "[current date and time]", "{date}": one to six lower-case words, nothing else.
# Not right after a name or a closing bracket: ``array[index]``, ``f"{value}"`` in code.
_SLOT = re.compile(
    r"(?<![\w\])}\"'$])(?:\[\s*([a-z][a-z_]+(?:[ -][a-z_]+){0,5})\s*\]"
    r"|\{\s*([a-z][a-z_]+(?: [a-z_]+){0,5})\s*\})"
)
# The progress lines' action categories (cortex_ray._types.ActionType), as the model copies them.
_CATEGORY = re.compile(r"\[\s*(REASONING|RETRIEVAL|LEARNING|GROUNDING)\s*\]")
_NOT_SLOTS = frozenset({"sic", "citation needed", "sic passim", "emphasis added", "sic erat"})
_LEAD_IN = re.compile(r"\s*([^\n:]{1,80}:)\s*")


def _tool_key(name: str) -> str:
    return re.sub(r"[\s.-]+", "_", name.strip().casefold())


def placeholders(text: str, tools: Iterable[str] = ()) -> list[str]:
    """The placeholders in ``text``, as written: every ``{{...}}``, a name of one of
    ``tools`` in single brackets, braces or angle brackets, a lower-case slot, an action
    category in square brackets."""
    found = [m.group(0) for m in _PLACEHOLDER.finditer(text)]
    found += [m.group(0) for m in _CATEGORY.finditer(text) if m.group(0) not in found]
    rest = _PLACEHOLDER.sub(" ", text)
    keys = {_tool_key(t) for t in tools}
    if keys:
        found += [m.group(0) for m in _BRACKETED.finditer(rest) if _tool_key(m.group(1)) in keys]
    for m in _SLOT.finditer(rest):
        if m.group(0) not in found and (m.group(1) or m.group(2) or "") not in _NOT_SLOTS:
            found.append(m.group(0))
    return found


def _named(placeholder: str) -> str:
    inner = placeholder.strip("{}[]<> ")
    return _tool_key(inner)


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


def tools_named(found: list[str], tools: Iterable[str]) -> list[str]:
    """The tools whose value the placeholders stand for: named in one, or with every word of
    the name in them ("[insert current date and time]" → ``current_time``), sorted."""
    by_key = {_tool_key(t): t for t in tools}
    named = {by_key[k] for p in found if (k := _named(p)) in by_key}
    words = {w for p in found for w in re.findall(r"[a-z]+", p.casefold())}
    named |= {t for k, t in by_key.items() if set(k.split("_")) <= words}
    return sorted(named)


def placeholder_note(found: list[str], tools: Iterable[str]) -> str:
    """What the model is told when its answer holds ``found`` placeholders."""
    callable_ = tools_named(found, tools)
    what = ", ".join(found)
    if callable_:
        how = f"To get that value, call the tool {' or '.join(callable_)} first."
    else:
        how = "Write the actual value, or say plainly that you do not know it."
    return (
        f"Your answer contained {what}: a placeholder that nothing fills in, so the person "
        f"would see it as written. {how}"
    )


_NUMBER = re.compile(r"\d+(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def _values(text: str) -> list[tuple[str, float, int]]:
    """Each number of ``text``: as written, its value, its decimals ("1,000.50" → 1000.5, 2)."""
    out = []
    for raw in _NUMBER.findall(text):
        plain = raw.replace(",", "")
        decimals = len(plain.split(".")[1]) if "." in plain else 0
        out.append((raw, float(plain), decimals))
    return out


_PROPER = re.compile(r"\b[A-Z][a-z]{2,}\b")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})")
_NAMES = re.compile(
    r"\b(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|January|February|March|"
    r"April|May|June|July|August|September|October|November|December)\b"
)


def unsupported_values(
    answer: str, evidence: Iterable[str], *, names_anywhere: bool = False
) -> list[str]:
    """The numbers, day names and month names of ``answer`` that appear in none of
    ``evidence`` (the objective, the results observed, the memories recalled), numbers even
    rounded: values the model made up rather than read ("Today is Wednesday" when
    ``current_time`` said Tuesday); and capitalised names inside a sentence that no evidence
    holds ("The observatory is in Las Vegas" when the search found nothing).

    A deterministic check, not a model's opinion: "The result of (17 * 23) + 4 is 82." before
    any calculation has 82 unsupported; "It is 15:02 UTC on 2026-12-01" after
    ``current_time`` returned "2026-12-01T15:02:11+00:00" has none, and "26.1 miles" is
    supported by a result of 26.0976 (a rounding of it).

    ``names_anywhere``: a capitalised name counts wherever it stands but the very start, for
    text that is not prose, such as a fact to store ("veltran observatory: city: Los
    Angeles", where nothing said Los Angeles)."""
    texts = list(evidence)
    seen = [value for text in texts for _, value, _ in _values(text)]
    names = {n.casefold() for text in texts for n in _NAMES.findall(text)}
    for text in texts:  # a date names its month and weekday: 2026-12-01 → December, Tuesday
        for y, m, d in _ISO_DATE.findall(text):
            try:
                day = datetime.date(int(y), int(m), int(d))
            except ValueError:
                continue
            names |= {day.strftime("%B").casefold(), day.strftime("%A").casefold()}
    missing: list[str] = [
        n for n in dict.fromkeys(_NAMES.findall(answer)) if n.casefold() not in names
    ]
    # Proper names inside a sentence ("located in Las Vegas") that nothing gave.
    words = {w.casefold() for text in texts for w in re.findall(r"[A-Za-z]+", text)}
    for m in _PROPER.finditer(answer):
        name = m.group(0)
        before = answer[: m.start()].rstrip()
        starts = not before or (not names_anywhere and before[-1] in ".!?:\"'(")
        if starts or _NAMES.fullmatch(name):
            continue  # a sentence starts here, or a day/month name (checked above)
        if name.casefold() not in words and name not in missing:
            missing.append(name)
    for raw, value, decimals in _values(answer):
        step = 10.0**-decimals
        supported = any(abs(round(e, decimals) - value) < step / 2 for e in seen)
        if not supported and raw not in missing:
            missing.append(raw)
    return missing


def evidence_of(wm: WorkingMemory) -> list[str]:
    """What a value may come from: the objective, what the person said in the conversation,
    the results, the memories; once the run has results, not earlier runs' episodes (a
    made-up date in an earlier demo's result was recalled and copied into the next run's
    answer)."""
    acted = bool(wm.observations)
    return [
        wm.objective,
        *(t.content for t in wm.conversation if t.role != "assistant"),
        *(o.summary for o in wm.observations),
        *(o.output if isinstance(o.output, str) else "" for o in wm.observations),
        *(
            hit.memory.content
            for hit in wm.snapshot.recalled
            if not (acted and hit.memory.kind is MemoryKind.EPISODIC)
        ),
    ]


_WORD = re.compile(r"\w+")


# Words too common to say where a value came from ("the best" is not given by "the").
_COMMON = frozenset({"the", "and", "for", "with", "from", "that", "this", "are", "was", "its"})


def _words(text: str) -> set[str]:
    found = {w.casefold() for w in _WORD.findall(text)}
    return {w for w in found if (len(w) > 2 or w.isdigit()) and w not in _COMMON}


def made_up_optionals(
    parameters: dict[str, Any], args: dict[str, Any], evidence: Iterable[str]
) -> list[str]:
    """The optional arguments of a call whose text nothing gave: a string value (or every
    string of a list) sharing no word with ``evidence`` (the objective, the results, the
    memories), other than the parameter's declared default. Left out, the tool applies its
    own default; filled in, the call acts on a value the model made up (BFCL: ``make``
    "Yamaha" for "an acoustic instrument under $1000", ``scale`` "high" where nobody named a
    scale and the default is medium). Required arguments are kept: the call needs them, and
    a value written differently ("New York" for "New York, NY") is still the person's.
    Numbers and booleans are kept: an optional number is most often a knob (``k``,
    ``limit``), not a fact."""
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    known: set[str] = set()
    for text in evidence:
        known |= _words(text)
    out = []
    for name, value in args.items():
        if name in required or name not in properties:
            continue
        spec = properties[name] if isinstance(properties[name], dict) else {}
        if "default" in spec and spec["default"] == value:
            continue
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        strings = [t for t in texts if isinstance(t, str) and _words(t)]
        if strings and len(strings) == len(texts) and not any(_words(t) & known for t in strings):
            out.append(name)
    return out


_CLAIMED_WRITE = re.compile(
    r"\bI(?:'ve|'d| have| had)?\s+(?:now\s+|just\s+|already\s+)?"
    r"(?:stored|saved|remembered|noted|recorded|memori[sz]ed|written down)\b"
    r"|\bI(?:'ll| will)\s+(?:remember|store|save|keep in mind)\b",
    re.IGNORECASE,
)


def claims_a_write(text: str) -> bool:
    """The reply says the agent stored something ("I have stored the fact that ...", "I'll
    remember that"): true only if a memory tool was called, which the driver checks."""
    return _CLAIMED_WRITE.search(text) is not None
