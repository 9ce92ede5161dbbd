"""Streaming splitter: a document's bytes → sections (by heading) → passages (by paragraph).

The splitter consumes the file as a sequence of byte chunks (any sizes, cut anywhere) and
yields records as soon as they are complete, so a multi-gigabyte file is split with memory
bounded by one passage, one line and a few pending heading lines. Every record carries
exact ranges: 1-based inclusive line numbers and 0-based byte offsets into the file
(``byte_end`` exclusive). A passage's ``text`` is exactly
``file_bytes[span.byte_start:span.byte_end].decode("utf-8")``.

Order of records: a section's passages come first, then the section itself (a section is
only complete when the next heading, or the end of the file, is seen).

Headings by format:

- Markdown: ATX headings (``#`` to ``######``, up to three spaces of indent) and setext
  headings (a single-line paragraph underlined with ``===`` or ``---``). Lines inside
  fenced code blocks (````` ``` ````` / ``~~~``) are never headings.
- reStructuredText: a title is a line at column 0 underlined (and optionally overlined)
  with one repeated punctuation character at least as long as the title; levels follow the
  order in which adornment styles first appear, as in docutils.
- Plain text: no headings; one section, passages by blank-line paragraphs.

Sections cover whole lines, from the heading's first line (the overline for reST) to the
line before the next heading; text before the first heading is a section with an empty
heading path when it holds anything but blank lines. Heading lines are not part of any
passage. Passages pack whole paragraphs of one section up to ``max_passage_bytes`` (UTF-8
bytes, so never more characters than that); a longer paragraph is cut at line boundaries,
and a line longer than the bound is cut at UTF-8 character boundaries. A passage never
includes the line terminator of its last line. Lines longer than ``max_line_bytes`` raise
:class:`LineTooLongError` (the reader skips such files before splitting; see ``_read``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_PASSAGE_BYTES",
    "DEFAULT_SUMMARY_CHARS",
    "Format",
    "LineTooLongError",
    "Span",
    "SplitPassage",
    "SplitSection",
    "Splitter",
    "split_bytes",
    "split_stream",
]

DEFAULT_MAX_PASSAGE_BYTES = 1200
DEFAULT_MAX_LINE_BYTES = 1 << 20
DEFAULT_SUMMARY_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Span:
    line_start: int  # 1-based, inclusive
    line_end: int  # 1-based, inclusive
    byte_start: int  # 0-based offset into the source file, inclusive
    byte_end: int  # exclusive


@dataclass(frozen=True, slots=True)
class SplitSection:
    ordinal: int  # 0-based order within the document
    heading_path: tuple[str, ...]  # () for text before the first heading
    span: Span
    # heading path + first ~1,000 chars of its body: input for the eager section vector
    summary_text: str


@dataclass(frozen=True, slots=True)
class SplitPassage:
    ordinal: int  # 0-based within the document
    section_ordinal: int
    text: str  # exactly file_bytes[span.byte_start:span.byte_end].decode("utf-8")
    span: Span


class Format(StrEnum):
    """The document formats the splitter understands."""

    MARKDOWN = "markdown"
    RST = "rst"
    TEXT = "text"


class LineTooLongError(ValueError):
    """A line is longer than ``max_line_bytes``: likely generated data, not prose."""

    def __init__(self, line_no: int, limit: int) -> None:
        super().__init__(f"line {line_no} is longer than {limit} bytes")
        self.line_no = line_no
        self.limit = limit


_ATX = re.compile(rb"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*\r?\n?$")
_SETEXT = re.compile(rb"^ {0,3}(=+|-+)[ \t]*\r?\n?$")
_FENCE = re.compile(rb"^ {0,3}(`{3,}|~{3,})")
# reST adornment: one punctuation character repeated, from column 0 (docutils' set).
_ADORNMENT = re.compile(rb"^([!-/:-@\[-`{-~])\1+[ \t]*\r?\n?$")
_RST_MARKS = frozenset(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _content_len(line: bytes) -> int:
    """Length of ``line`` without its terminator (``\\n`` or ``\\r\\n``)."""
    n = len(line)
    if n and line[n - 1] == 0x0A:
        n -= 1
        if n and line[n - 1] == 0x0D:
            n -= 1
    return n


def _utf8_cut(data: bytes, start: int, limit: int) -> int:
    """The largest end ≤ ``start + limit`` that does not cut a UTF-8 character."""
    end = start + limit
    if end >= len(data):
        return len(data)
    while end > start and (data[end] & 0xC0) == 0x80:
        end -= 1
    return end if end > start else start + limit


@dataclass(slots=True)
class _Line:
    data: bytes  # with its terminator, if any
    no: int
    start: int


class Splitter:
    """Incremental splitter: :meth:`feed` chunks, then :meth:`finish`; both return records."""

    def __init__(
        self,
        fmt: Format,
        *,
        max_passage_bytes: int = DEFAULT_MAX_PASSAGE_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        summary_chars: int = DEFAULT_SUMMARY_CHARS,
    ) -> None:
        if max_passage_bytes < 4:
            raise ValueError("max_passage_bytes must be at least 4 (one UTF-8 character)")
        self.fmt = fmt
        self.max_passage_bytes = max_passage_bytes
        self.max_line_bytes = max_line_bytes
        self.summary_chars = summary_chars
        self._out: list[SplitSection | SplitPassage] = []
        self._tail = b""
        self._offset = 0  # byte offset of the next complete line
        self._line_no = 0  # number of the last line handed to _line
        self._finished = False
        # heading structure
        self._stack: list[tuple[int, str]] = []  # (level, title)
        self._rst_styles: dict[tuple[int, bool], int] = {}
        self._pending: list[_Line] = []
        self._last = "start"  # kind of the last classified line: start, blank, heading, text
        self._fence: bytes | None = None  # the opening fence while inside a Markdown code block
        # the open section
        self._sec_ordinal = 0
        self._sec_open = False  # has a heading or non-blank body
        self._sec_path: tuple[str, ...] = ()
        self._sec_start = 0
        self._sec_line = 1
        self._summary: list[str] = []
        self._summary_len = 0
        # the open passage: its lines (full, with terminators) and ranges
        self._p_ordinal = 0
        self._p_lines: list[bytes] = []
        self._p_start = 0
        self._p_line = 0
        self._p_end = 0  # end of the last non-blank line's content (exclusive)
        self._p_end_line = 0
        self._gap: list[bytes] = []  # blank lines after the passage's last line
        self._in_para = False
        # where the current paragraph starts inside the passage, and where the previous ends
        self._para_idx = 0
        self._para_start = 0
        self._para_line = 0
        self._prev_end = 0
        self._prev_end_line = 0

    # input -------------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> list[SplitSection | SplitPassage]:
        """Split what ``chunk`` completes; returns the records that became complete."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            self._tail = data
        else:
            self._tail = data[cut:]
            start = 0
            while start < cut:
                end = data.index(b"\n", start) + 1
                self._take(data[start:end])
                start = end
        if len(self._tail) > self.max_line_bytes:
            raise LineTooLongError(self._line_no + 1, self.max_line_bytes)
        return self._drain()

    def finish(self) -> list[SplitSection | SplitPassage]:
        """The end of the file: flush the last line, passage and section."""
        if self._finished:
            return []
        self._finished = True
        if self._tail:
            self._take(self._tail)
            self._tail = b""
        self._release_pending()
        self._close_section(self._offset, self._line_no)
        return self._drain()

    def _drain(self) -> list[SplitSection | SplitPassage]:
        out, self._out = self._out, []
        return out

    # line classification -----------------------------------------------------------------

    def _take(self, data: bytes) -> None:
        if len(data) > self.max_line_bytes:
            raise LineTooLongError(self._line_no + 1, self.max_line_bytes)
        self._line_no += 1
        line = _Line(data, self._line_no, self._offset)
        self._offset += len(data)
        if self.fmt is Format.MARKDOWN:
            self._markdown(line)
        elif self.fmt is Format.RST:
            self._rst(line)
        else:
            self._body(line, blank=not data.strip())

    def _markdown(self, line: _Line) -> None:
        data = line.data
        if self._fence is not None:
            stripped = data.strip()
            if stripped.startswith(self._fence[:1] * len(self._fence)) and not stripped.strip(
                self._fence[:1]
            ):
                self._fence = None
            self._body(line, blank=False)  # blank lines inside a code block do not break it
            return
        blank = not data.strip()
        first = data.lstrip(b" ")[:1]
        if self._pending:
            title = self._pending[0]
            if not blank and first in (b"=", b"-") and (m := _SETEXT.match(data)):
                self._pending = []
                level = 1 if m.group(1)[:1] == b"=" else 2
                self._heading([title, line], level, _decode(title.data).strip())
                return
            self._release_pending()
        if blank:
            self._body(line, blank=True)
            return
        if first == b"#" and (m := _ATX.match(data)):
            self._heading([line], len(m.group(1)), _decode(m.group(2) or b"").strip())
            return
        if first in (b"`", b"~") and (m := _FENCE.match(data)):
            self._fence = m.group(1)
            self._body(line, blank=False)
            return
        if self._last != "text" and not (first in (b"=", b"-") and _SETEXT.match(data)):
            self._pending = [line]  # a one-line paragraph may turn out to be a setext title
            return
        self._body(line, blank=False)

    def _rst(self, line: _Line) -> None:
        data = line.data
        blank = not data.strip()
        adornment = not blank and data[0] in _RST_MARKS and _ADORNMENT.match(data) is not None
        pending = self._pending
        if len(pending) == 1:
            first = pending[0]
            if _is_adornment(first.data):
                if not blank and not adornment:
                    pending.append(line)  # overline + title text; the underline decides
                    return
            elif adornment and _adornment_len(data) >= _title_len(first.data):
                self._pending = []
                self._rst_heading([first, line], data[0], overlined=False, title=first.data)
                return
            self._release_pending()
        elif len(pending) == 2:
            over, title = pending
            if (
                adornment
                and data[0] == over.data[0]
                and _adornment_len(data) >= _title_len(title.data)
            ):
                self._pending = []
                self._rst_heading([over, title, line], data[0], overlined=True, title=title.data)
                return
            self._release_pending()
        if blank:
            self._body(line, blank=True)
        elif self._last != "text" and (adornment or data[:1] not in (b" ", b"\t")):
            self._pending = [line]
        else:
            self._body(line, blank=False)

    def _rst_heading(self, lines: list[_Line], char: int, *, overlined: bool, title: bytes) -> None:
        style = (char, overlined)
        level = self._rst_styles.setdefault(style, len(self._rst_styles) + 1)
        self._heading(lines, level, _decode(title).strip())

    def _release_pending(self) -> None:
        pending, self._pending = self._pending, []
        for line in pending:
            self._body(line, blank=False)

    # sections ----------------------------------------------------------------------------

    def _heading(self, lines: list[_Line], level: int, title: str) -> None:
        first = lines[0]
        self._close_section(first.start, first.no - 1)
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, title))
        self._sec_path = tuple(t for _, t in self._stack)
        self._sec_open = True
        self._sec_start = first.start
        self._sec_line = first.no
        self._last = "heading"

    def _close_section(self, end: int, end_line: int) -> None:
        self._flush_passage()
        self._gap = []
        self._in_para = False
        if self._sec_open:
            body = "".join(self._summary)[: self.summary_chars]
            head = " > ".join(self._sec_path)
            summary = f"{head}\n\n{body}" if head and body else head or body
            self._out.append(
                SplitSection(
                    ordinal=self._sec_ordinal,
                    heading_path=self._sec_path,
                    span=Span(self._sec_line, end_line, self._sec_start, end),
                    summary_text=summary,
                )
            )
            self._sec_ordinal += 1
        self._sec_open = False
        self._summary = []
        self._summary_len = 0
        self._sec_start = end
        self._sec_line = end_line + 1

    # passages ----------------------------------------------------------------------------

    def _body(self, line: _Line, *, blank: bool) -> None:
        if blank:
            self._last = "blank"
            self._in_para = False
            if self._p_lines:
                self._gap.append(line.data)
            return
        self._last = "text"
        if not self._sec_open:
            self._sec_open = True
        data = line.data
        size = _content_len(data)
        if self._summary_len < self.summary_chars:
            text = _decode(data[:size]).strip()
            if text:
                self._summary.append(text + "\n")
                self._summary_len += len(text) + 1
        limit = self.max_passage_bytes
        if size > limit:
            self._flush_passage()
            self._long_line(line, size)
            self._in_para = True
            return
        new_para = not self._in_para
        self._in_para = True
        if not self._p_lines:
            self._open_passage(line, size)
            return
        end = line.start + size
        if end - self._p_start <= limit:
            if new_para:
                self._mark_paragraph(line)
            self._append(line, size)
            return
        if new_para:
            self._flush_passage()
            self._open_passage(line, size)
            return
        if self._para_idx > 0:
            # Emit the earlier paragraphs alone and keep the current one whole if it fits.
            rest = self._p_lines[self._para_idx :]
            self._emit(self._p_start, self._p_line, self._prev_end, self._prev_end_line)
            self._p_lines = rest
            self._p_start, self._p_line = self._para_start, self._para_line
            self._para_idx = 0
            if end - self._p_start <= limit:
                self._append(line, size)
                return
        self._flush_passage()
        self._open_passage(line, size)

    def _open_passage(self, line: _Line, size: int) -> None:
        self._p_lines = [line.data]
        self._p_start = line.start
        self._p_line = line.no
        self._p_end = line.start + size
        self._p_end_line = line.no
        self._gap = []
        self._para_idx = 0

    def _mark_paragraph(self, line: _Line) -> None:
        self._prev_end, self._prev_end_line = self._p_end, self._p_end_line
        self._para_idx = len(self._p_lines) + len(self._gap)
        self._para_start, self._para_line = line.start, line.no

    def _append(self, line: _Line, size: int) -> None:
        if self._gap:
            self._p_lines.extend(self._gap)
            self._gap = []
        self._p_lines.append(line.data)
        self._p_end = line.start + size
        self._p_end_line = line.no

    def _flush_passage(self) -> None:
        if self._p_lines:
            self._emit(self._p_start, self._p_line, self._p_end, self._p_end_line)
        self._p_lines = []
        self._gap = []
        self._para_idx = 0

    def _emit(self, start: int, line_start: int, end: int, line_end: int) -> None:
        raw = b"".join(self._p_lines)[: end - start]
        self._passage(_decode(raw), Span(line_start, line_end, start, end))

    def _long_line(self, line: _Line, size: int) -> None:
        data = line.data
        pos = 0
        while pos < size:
            cut = min(_utf8_cut(data, pos, self.max_passage_bytes), size)
            self._passage(
                _decode(data[pos:cut]), Span(line.no, line.no, line.start + pos, line.start + cut)
            )
            pos = cut

    def _passage(self, text: str, span: Span) -> None:
        self._out.append(SplitPassage(self._p_ordinal, self._sec_ordinal, text, span))
        self._p_ordinal += 1


def _decode(data: bytes) -> str:
    # The reader validated the file as UTF-8; "replace" only guards against a file that
    # changed between validation and splitting (the job detects that by its hash).
    return data.decode("utf-8", errors="replace")


def _is_adornment(data: bytes) -> bool:
    return bool(data) and data[0] in _RST_MARKS and _ADORNMENT.match(data) is not None


def _adornment_len(data: bytes) -> int:
    return len(data.rstrip())


def _title_len(data: bytes) -> int:
    # docutils compares column widths; characters are a close, cheap stand-in.
    return len(_decode(data).strip())


def split_stream(
    chunks: Iterable[bytes],
    fmt: Format,
    *,
    max_passage_bytes: int = DEFAULT_MAX_PASSAGE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    summary_chars: int = DEFAULT_SUMMARY_CHARS,
) -> Iterator[SplitSection | SplitPassage]:
    """Split a document given as byte chunks; yields records as they complete."""
    splitter = Splitter(
        fmt,
        max_passage_bytes=max_passage_bytes,
        max_line_bytes=max_line_bytes,
        summary_chars=summary_chars,
    )
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.finish()


def split_bytes(
    data: bytes, fmt: Format, *, max_passage_bytes: int = DEFAULT_MAX_PASSAGE_BYTES
) -> list[SplitSection | SplitPassage]:
    """Split a whole document held in memory (tests, small inputs)."""
    return list(split_stream([data], fmt, max_passage_bytes=max_passage_bytes))
