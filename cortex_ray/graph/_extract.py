"""The deterministic extractor: a document's lines → mentions with exact evidence spans.

It reads bytes, not decoded text, so every span it reports is a byte range of the file
(0-based, end exclusive) and a line range (1-based, inclusive) that reads back to exactly
the mention's text: ``file_bytes[byte_start:byte_end].decode() == name``. Patterns are
ASCII (e-mail addresses, URLs, issue ids, file paths, ISO dates, ``schema.table`` after a SQL
keyword); headings are Markdown ATX/setext and reStructuredText underlined titles (outside
fenced code blocks), whose text may be any UTF-8.

What becomes of the mentions (``facts``): the document ``mentions`` each distinct entity
once (its first occurrence is the evidence), ``has_heading`` each heading, and a heading
``mentions`` each distinct entity of its section. A rule-based extractor never guesses, so
its confidence is 1.0 for headings and structural patterns and 0.9 for patterns that can
match something else (an ISO date inside a version string, a path-like token).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date

__all__ = ["EXTRACTOR_VERSION", "Mention", "extract_mentions", "facts_from_mentions"]

EXTRACTOR_VERSION = "rules-1"
"""Recorded with every assertion the extractor makes; bump it when a pattern changes."""

_EMAIL = re.compile(
    rb"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
)
_URL = re.compile(rb"\bhttps?://[^\s<>\"'`|\]\[(){}]+")
_URL_TAIL = b".,;:!?*_"
_ISSUE = re.compile(
    rb"(?<![\w/-])(?:[A-Z][A-Z0-9]{1,9}-[1-9][0-9]{0,6}|[\w.-]+/[\w.-]+#[1-9][0-9]{0,6})\b"
)
_PATH = re.compile(
    rb"(?<![\w/.:@~-])(?:\.{1,2}/|/)?(?:[\w.-]+/)+[\w-][\w.-]*\.[A-Za-z0-9]{1,8}(?![\w/])"
)
_DATE = re.compile(rb"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?![\w-]|\.\d)")
_TABLE = re.compile(
    rb"\b(?:FROM|JOIN|INTO|UPDATE|TABLE|from|join|into|update|table)\s+"
    rb"((?:[A-Za-z_][A-Za-z0-9_]*)\.(?:[A-Za-z_][A-Za-z0-9_]*))\b(?!\.)"
)
_ATX = re.compile(rb"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_UNDERLINE = re.compile(rb"^([=\-~^*+#\"'`:.!_])\1{2,}[ \t]*$")
_FENCE = re.compile(rb"^ {0,3}(?:`{3,}|~{3,})")

# (entity type, pattern, group, confidence)
_PATTERNS: tuple[tuple[str, re.Pattern[bytes], int, float], ...] = (
    ("url", _URL, 0, 1.0),
    ("email", _EMAIL, 0, 1.0),
    ("issue", _ISSUE, 0, 1.0),
    ("table", _TABLE, 1, 1.0),
    ("path", _PATH, 0, 0.9),
    ("date", _DATE, 0, 0.9),
)


@dataclass(frozen=True, slots=True)
class Mention:
    """One thing found in a document, with the exact range it was found at."""

    type: str  # heading | url | email | issue | table | path | date
    name: str
    line: int  # 1-based
    byte_start: int
    byte_end: int
    confidence: float


def _strip_eol(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line


def extract_mentions(lines: Iterable[bytes]) -> Iterator[tuple[Mention | None, Mention]]:
    """Mentions of ``lines`` (a file's lines, terminators included, in order), each with the
    heading it falls under (``None`` before the first heading). Headings come as
    ``(None, heading)``."""
    offset = 0
    number = 0
    heading: Mention | None = None
    in_fence = False
    previous: tuple[bytes, int, int] | None = None  # a candidate setext/reST title line
    for raw in lines:
        number += 1
        line = _strip_eol(raw)
        start = offset
        offset += len(raw)
        if _FENCE.match(line):
            in_fence = not in_fence
            previous = None
            continue
        if not in_fence:
            atx = _ATX.match(line)
            if atx and atx.group(1):
                heading = _heading(atx.group(1), number, start + atx.start(1))
                if heading is not None:
                    yield None, heading
                previous = None
                continue
            if previous is not None and _UNDERLINE.match(line):
                title, title_line, title_start = previous
                if len(line.rstrip()) >= len(title.rstrip()):
                    found = _heading(title.rstrip(), title_line, title_start)
                    if found is not None:
                        heading = found
                        yield None, heading
                previous = None
                continue
            stripped = line.strip()
            previous = (
                (line, number, start)
                if stripped and not line[:1].isspace() and not _UNDERLINE.match(line)
                else None
            )
        yield from ((heading, m) for m in _line_mentions(line, number, start))


def _heading(text: bytes, number: int, start: int) -> Mention | None:
    lead = len(text) - len(text.lstrip())
    text = text.strip()
    if not text:
        return None
    try:
        name = text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return Mention("heading", name, number, start + lead, start + lead + len(text), 1.0)


def _line_mentions(line: bytes, number: int, start: int) -> Iterator[Mention]:
    taken: list[tuple[int, int]] = []  # a URL's path is not also a file path, etc.
    for kind, pattern, group, confidence in _PATTERNS:
        for m in pattern.finditer(line):
            s, e = m.span(group)
            if kind == "url":
                while e > s and line[e - 1] in _URL_TAIL:
                    e -= 1
            if any(s < te and ts < e for ts, te in taken):
                continue
            if kind == "date" and not _is_date(m):
                continue
            taken.append((s, e))
            yield Mention(kind, line[s:e].decode("ascii"), number, start + s, start + e, confidence)


def _is_date(m: re.Match[bytes]) -> bool:
    try:
        date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return False
    return True


def facts_from_mentions(
    document: str, mentions: Iterable[tuple[Mention | None, Mention]]
) -> Iterator[tuple[str, str, str, Mention]]:
    """``(subject type, subject name, predicate, mention)`` for a document's mentions: the
    document ``has_heading`` each heading and ``mentions`` each distinct entity once; a
    heading ``mentions`` each distinct entity of its section once. The subject ``document``
    is the source's registry path."""
    seen: set[tuple[str, str]] = set()
    seen_under: set[tuple[int, str, str]] = set()
    for heading, m in mentions:
        if m.type == "heading":
            if ("heading", m.name) not in seen:
                seen.add(("heading", m.name))
                yield "document", document, "has_heading", m
            continue
        if (m.type, m.name) not in seen:
            seen.add((m.type, m.name))
            yield "document", document, "mentions", m
        if heading is not None and (heading.byte_start, m.type, m.name) not in seen_under:
            seen_under.add((heading.byte_start, m.type, m.name))
            yield "heading", heading.name, "mentions", m
