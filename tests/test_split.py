"""The streaming splitter: headings per format, exact ranges, bounded passages, chunk-invariance,
and memory that does not grow with the document."""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Iterator

import pytest

from cortex_ray.knowledge import (
    Format,
    LineTooLongError,
    SplitPassage,
    SplitSection,
    split_bytes,
    split_stream,
)

pytestmark = pytest.mark.unit

MD = b"""Preamble line
still preamble

# Guide

Intro paragraph
over two lines.

Install
-------

Run it.

```sh
# a comment, not a heading

make
```

### Deep ###
Text under deep.

## Second

Last words.
"""

RST = b"""=========
The Title
=========

Opening words.

First
=====

Body one.

Sub
---

Body sub.

----

After a transition.

Second
======

x
"""


def sections(records: list[SplitSection | SplitPassage]) -> list[SplitSection]:
    return [r for r in records if isinstance(r, SplitSection)]


def passages(records: list[SplitSection | SplitPassage]) -> list[SplitPassage]:
    return [r for r in records if isinstance(r, SplitPassage)]


def check_ranges(data: bytes, records: list[SplitSection | SplitPassage]) -> None:
    """Every range is exact: text is the byte slice, line numbers match the byte offsets,
    ordinals run from 0, a section comes after its passages."""
    line_starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]

    def line_of(offset: int) -> int:
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    seen_sections: set[int] = set()
    for record in records:
        span = record.span
        assert 0 <= span.byte_start <= span.byte_end <= len(data)
        assert line_of(span.byte_start) == span.line_start
        if isinstance(record, SplitPassage):
            assert data[span.byte_start : span.byte_end].decode("utf-8") == record.text
            assert line_of(max(span.byte_end - 1, span.byte_start)) == span.line_end
            assert record.section_ordinal not in seen_sections
        else:
            seen_sections.add(record.ordinal)
            assert span.line_end == line_of(span.byte_end - 1)
    assert [p.ordinal for p in passages(records)] == list(range(len(passages(records))))
    assert [s.ordinal for s in sections(records)] == list(range(len(sections(records))))


def test_markdown_headings_paths_and_ranges() -> None:
    records = split_bytes(MD, Format.MARKDOWN)
    check_ranges(MD, records)
    assert [s.heading_path for s in sections(records)] == [
        (),
        ("Guide",),
        ("Guide", "Install"),
        ("Guide", "Install", "Deep"),
        ("Guide", "Second"),
    ]
    by_section = {
        s.ordinal: [p.text for p in passages(records) if p.section_ordinal == s.ordinal]
        for s in sections(records)
    }
    assert by_section[0] == ["Preamble line\nstill preamble"]
    assert by_section[1] == ["Intro paragraph\nover two lines."]
    # the fenced block keeps its '#' line and its blank line; it joins "Run it." (fits)
    assert by_section[2] == ["Run it.\n\n```sh\n# a comment, not a heading\n\nmake\n```"]
    assert by_section[3] == ["Text under deep."]
    # sections tile the document from the first line to the last
    secs = sections(records)
    assert secs[0].span.byte_start == 0 and secs[-1].span.byte_end == len(MD)
    for before, after in itertools.pairwise(secs):
        assert before.span.byte_end == after.span.byte_start
        assert before.span.line_end + 1 == after.span.line_start
    assert secs[1].summary_text == "Guide\n\nIntro paragraph\nover two lines.\n"
    assert secs[2].span.line_start == 9  # the setext title line, not its underline


def test_markdown_thematic_break_and_multiline_paragraph_are_not_headings() -> None:
    data = b"Para one\ncontinues\n---\n\n---\n\ntext\n"
    records = split_bytes(data, Format.MARKDOWN)
    check_ranges(data, records)
    assert [s.heading_path for s in sections(records)] == [()]


def test_rst_titles_levels_by_first_appearance() -> None:
    records = split_bytes(RST, Format.RST)
    check_ranges(RST, records)
    assert [s.heading_path for s in sections(records)] == [
        ("The Title",),
        ("The Title", "First"),
        ("The Title", "First", "Sub"),
        ("The Title", "Second"),
    ]
    texts = [p.text for p in passages(records)]
    assert "Body sub.\n\n----\n\nAfter a transition." in texts  # a transition is body text
    assert sections(records)[0].span.line_start == 1  # the overline belongs to the title


def test_rst_short_underline_and_indented_text_are_not_titles() -> None:
    data = b"A long title here\n---\n\n   indented\n   ========\n"
    records = split_bytes(data, Format.RST)
    check_ranges(data, records)
    assert [s.heading_path for s in sections(records)] == [()]


def test_plain_text_paragraphs_and_no_headings() -> None:
    data = b"# not a heading\n\nsecond para\n\n\n\nthird\r\nline\r\n"
    records = split_bytes(data, Format.TEXT, max_passage_bytes=20)
    check_ranges(data, records)
    assert [s.heading_path for s in sections(records)] == [()]
    assert [p.text for p in passages(records)] == [
        "# not a heading",
        "second para",
        "third\r\nline",
    ]


def test_small_paragraphs_are_packed_up_to_the_bound() -> None:
    data = b"".join(b"p%02d\n\n" % i for i in range(20))
    records = split_bytes(data, Format.TEXT, max_passage_bytes=30)
    check_ranges(data, records)
    texts = [p.text for p in passages(records)]
    assert all(len(t.encode()) <= 30 for t in texts)
    assert texts[0] == "p00\n\np01\n\np02\n\np03\n\np04\n\np05"
    assert "".join(t.replace("\n", "") for t in texts) == "".join(f"p{i:02d}" for i in range(20))


def test_long_paragraph_is_split_at_line_boundaries() -> None:
    lines = [f"line {i:03d} of a long paragraph" for i in range(100)]
    data = ("\n".join(lines) + "\n").encode()
    records = split_bytes(data, Format.MARKDOWN, max_passage_bytes=200)
    check_ranges(data, records)
    for p in passages(records):
        assert len(p.text.encode()) <= 200
        assert p.text.startswith("line ")  # never cut inside a line
    assert sum(p.text.count("\n") + 1 for p in passages(records)) == 100


def test_enormous_line_is_split_at_utf8_boundaries() -> None:
    line = "αβγ€😀x" * 3000  # 1-, 2-, 3- and 4-byte characters
    data = ("before\n\n" + line + "\nafter\n").encode()
    records = split_bytes(data, Format.TEXT, max_passage_bytes=100)
    check_ranges(data, records)
    pieces = [p for p in passages(records) if p.span.line_start == 3]
    assert len(pieces) > 100
    assert all(len(p.text.encode()) <= 100 for p in pieces)
    assert "".join(p.text for p in pieces) == line
    assert passages(records)[-1].text == "after"


def test_line_longer_than_the_limit_raises() -> None:
    with pytest.raises(LineTooLongError, match="line 2"):
        list(split_stream([b"ok\n", b"x" * 5000], Format.TEXT, max_line_bytes=4096))


@pytest.mark.parametrize("fmt", list(Format))
def test_any_chunking_gives_the_same_records(fmt: Format) -> None:
    data = MD + RST + "ünïcødé ☃ paragraph\n\n".encode() * 50
    whole = split_bytes(data, fmt, max_passage_bytes=64)
    check_ranges(data, whole)
    rng = random.Random(7)
    for sizes in ([1], [2, 3], [7, 64, 1], [1000]):
        chunks, pos = [], 0
        while pos < len(data):
            step = rng.choice(sizes)
            chunks.append(data[pos : pos + step])
            pos += step
        assert list(split_stream(chunks, fmt, max_passage_bytes=64)) == whole


def test_empty_and_blank_documents() -> None:
    assert split_bytes(b"", Format.MARKDOWN) == []
    assert split_bytes(b"\n\n  \n", Format.TEXT) == []
    records = split_bytes(b"# Only a title", Format.MARKDOWN)
    assert passages(records) == []
    assert sections(records)[0].heading_path == ("Only a title",)
    assert sections(records)[0].span.byte_end == 14  # no final newline


def _big_markdown(sections_n: int, section_bytes: int) -> Iterator[bytes]:
    para = b"Some prose that goes on for a while, sentence after sentence. " * 6 + b"\n\n"
    for i in range(sections_n):
        chunk = [b"## Part %d\n\n" % i]
        size = 0
        while size < section_bytes:
            chunk.append(para)
            size += len(para)
        yield b"".join(chunk)


def test_memory_does_not_grow_with_the_document() -> None:
    """20 MB streamed through the splitter: peak traced memory stays at a few chunks."""

    def peak(total_sections: int) -> tuple[int, int]:
        tracemalloc.start()
        n = 0
        for record in split_stream(_big_markdown(total_sections, 256 << 10), Format.MARKDOWN):
            n += 1
            del record
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, n

    small, n_small = peak(8)  # 2 MB
    large, n_large = peak(80)  # 20 MB
    assert n_large > 9 * n_small
    assert large < 4 << 20
    assert large < small * 1.5 + (256 << 10)
