"""Reading sources for ingestion: listing, format detection, a checking pass, streamed chunks.

Nothing here holds a whole file in memory: :func:`scan_file` and :func:`read_chunks` read
fixed-size chunks, so a multi-gigabyte file costs one chunk (plus a decoded copy of it
while validating).

The checking pass (:func:`scan_file`) runs before a file is split. In one streamed read it
computes the SHA-256 of the content (the source's version), checks the first block for NUL
bytes (binary), validates UTF-8 with an incremental decoder (a character cut by a chunk
boundary is fine; an invalid sequence anywhere is not) and measures the longest line.
A file that fails is skipped, with a :class:`SkipReason` for the source registry's health
events and the job's counts.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from cortex_ray.knowledge._split import DEFAULT_MAX_LINE_BYTES, Format

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "SCAN_BLOCK_BYTES",
    "ListedFile",
    "ScanResult",
    "SkipReason",
    "detect_format",
    "list_files",
    "read_chunks",
    "scan_file",
]

DEFAULT_CHUNK_BYTES = 1 << 20
SCAN_BLOCK_BYTES = 8192  # the first block, checked for NUL bytes

_SUFFIXES = {
    ".md": Format.MARKDOWN,
    ".markdown": Format.MARKDOWN,
    ".rst": Format.RST,
    ".rest": Format.RST,
    ".txt": Format.TEXT,
    ".text": Format.TEXT,
}


class SkipReason(StrEnum):
    """Why a file was not split. ``UNREADABLE`` is a read failure; the others are content."""

    UNSUPPORTED = "unsupported_type"  # an extension we do not split (not a source)
    EMPTY = "empty"
    BINARY = "binary"  # NUL bytes in the first block
    INVALID_UTF8 = "invalid_utf8"
    LINE_TOO_LONG = "line_too_long"
    UNREADABLE = "unreadable"  # permission denied, I/O error, vanished while reading

    @property
    def is_read_failure(self) -> bool:
        return self is SkipReason.UNREADABLE


def detect_format(path: Path) -> Format | None:
    """The format by extension; a file with no extension is plain text (if the scan agrees)."""
    suffix = path.suffix.lower()
    if not suffix or (suffix == path.name.lower()):
        return Format.TEXT
    return _SUFFIXES.get(suffix)


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file found under one of the job's roots."""

    path: str  # the absolute path read from
    key: str  # the registry path: relative to the root's parent, POSIX separators
    size: int


def list_files(roots: Iterable[Path]) -> Iterator[ListedFile]:
    """Every regular file under ``roots`` (files or folders), in a stable order.

    Hidden entries (names starting with ``.``) are left out; symbolic links to folders are
    not followed (no cycles). Registry keys are relative to each root's parent, so that
    ``/data/docs`` gives keys ``docs/...`` wherever the corpus is mounted.
    """
    for root in roots:
        root = root.absolute()
        base = root.parent
        if not root.is_dir():
            yield _listed(root, base)
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if not name.startswith("."):
                    yield _listed(Path(folder, name), base)


def _listed(path: Path, base: Path) -> ListedFile:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # the scan reports it as unreadable
    return ListedFile(str(path), path.relative_to(base).as_posix(), size)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What the checking pass found."""

    fmt: Format | None
    size: int
    sha256: str
    skip: SkipReason | None = None
    detail: str = ""


def read_chunks(path: str | Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes in chunks of ``chunk_bytes`` (the last may be shorter)."""
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(chunk_bytes):
            yield chunk


def scan_file(
    path: str | Path,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> ScanResult:
    """Hash and check one file in a single streamed read."""
    fmt = detect_format(Path(path))
    if fmt is None:
        return ScanResult(None, 0, "", SkipReason.UNSUPPORTED, Path(path).suffix)
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    size = 0
    line = 0  # length of the line in progress
    longest = 0
    try:
        for chunk in read_chunks(path, chunk_bytes):
            if size == 0 and b"\0" in chunk[:SCAN_BLOCK_BYTES]:
                return ScanResult(fmt, _size(path), "", SkipReason.BINARY, "NUL byte")
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                where = size + exc.start
                return ScanResult(fmt, _size(path), "", SkipReason.INVALID_UTF8, f"at byte {where}")
            digest.update(chunk)
            line, longest = _line_lengths(chunk, line, longest)
            size += len(chunk)
            if longest > max_line_bytes:
                return ScanResult(
                    fmt,
                    _size(path),
                    "",
                    SkipReason.LINE_TOO_LONG,
                    f"a line longer than {max_line_bytes} bytes",
                )
        decoder.decode(b"", final=True)
        if max(longest, line) > max_line_bytes:  # an unterminated last line
            return ScanResult(
                fmt,
                size,
                "",
                SkipReason.LINE_TOO_LONG,
                f"a line longer than {max_line_bytes} bytes",
            )
    except UnicodeDecodeError:
        return ScanResult(fmt, size, "", SkipReason.INVALID_UTF8, "truncated at end of file")
    except OSError as exc:
        return ScanResult(fmt, size, "", SkipReason.UNREADABLE, exc.strerror or str(exc))
    if size == 0:
        return ScanResult(fmt, 0, digest.hexdigest(), SkipReason.EMPTY)
    return ScanResult(fmt, size, digest.hexdigest())


def _line_lengths(chunk: bytes, line: int, longest: int) -> tuple[int, int]:
    """(length of the line in progress after ``chunk``, longest line so far), terminators
    included. numpy finds the newlines: a Python loop per line would dominate the pass."""
    newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A)
    if newlines.size == 0:
        line += len(chunk)
        return line, max(longest, line)
    first = line + int(newlines[0]) + 1
    inner = int(np.diff(newlines).max()) if newlines.size > 1 else 0
    return len(chunk) - int(newlines[-1]) - 1, max(longest, first, inner)


def _size(path: str | Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
