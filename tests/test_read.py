"""Reading sources: format detection, listing, and the checking pass over bad input."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from cortex_ray.knowledge import (
    Format,
    SkipReason,
    detect_format,
    list_files,
    read_chunks,
    scan_file,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.md", Format.MARKDOWN),
        ("a.MARKDOWN", Format.MARKDOWN),
        ("a.rst", Format.RST),
        ("a.txt", Format.TEXT),
        ("a.text", Format.TEXT),
        ("Makefile", Format.TEXT),
        (".bashrc", Format.TEXT),
        ("a.png", None),
        ("a.py", None),
    ],
)
def test_detect_format(name: str, fmt: Format | None) -> None:
    assert detect_format(Path(name)) is fmt


def test_scan_hashes_the_content_in_chunks(tmp_path: Path) -> None:
    content = "héllo wörld ☃\n".encode() * 1000
    path = tmp_path / "doc.md"
    path.write_bytes(content)
    # 7-byte chunks cut multi-byte characters: still valid UTF-8
    result = scan_file(path, chunk_bytes=7)
    assert result.skip is None
    assert result.fmt is Format.MARKDOWN
    assert result.size == len(content)
    assert result.sha256 == hashlib.sha256(content).hexdigest()
    assert b"".join(read_chunks(path, 7)) == content


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", SkipReason.EMPTY),
        (b"PNG\x00\x01\x02 binary", SkipReason.BINARY),
        (b"fine\n" * 100 + b"\xff\xfe bad\n", SkipReason.INVALID_UTF8),
        (b"ends in half a character \xe2\x98", SkipReason.INVALID_UTF8),
        (b"short\n" + b"x" * 5000 + b"\nshort\n", SkipReason.LINE_TOO_LONG),
        (b"x" * 5000, SkipReason.LINE_TOO_LONG),  # unterminated last line
    ],
)
def test_scan_skips_bad_input(tmp_path: Path, content: bytes, reason: SkipReason) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    result = scan_file(path, chunk_bytes=64, max_line_bytes=4096)
    assert result.skip is reason
    assert not reason.is_read_failure


def test_scan_accepts_lines_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_bytes(b"a" * 4095 + b"\n" + b"b" * 4096)
    assert scan_file(path, chunk_bytes=1000, max_line_bytes=4096).skip is None


def test_scan_reports_missing_files_and_folders_as_unreadable(tmp_path: Path) -> None:
    for path in (tmp_path / "gone.md", tmp_path):
        result = scan_file(path)
        assert result.skip is SkipReason.UNREADABLE
        assert result.skip.is_read_failure


def _scan_as(uid: int | None, path: Path) -> str:
    """The skip reason of ``scan_file(path)``, run as ``uid`` in a forked child if given.

    As root, chmod 000 does not stop reads: the child drops to an unprivileged user first."""
    if uid is None:
        result = scan_file(path)
        return result.skip.value if result.skip else "ok"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            result = scan_file(path)
            os.write(write_end, (result.skip.value if result.skip else "ok").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_scan_reports_a_file_without_read_permission() -> None:
    folder = Path(tempfile.mkdtemp(prefix="cortex-ray-read-", dir="/tmp"))
    try:
        folder.chmod(0o755)  # reachable by the unprivileged user below
        locked = folder / "locked.md"
        locked.write_text("secret\n")
        locked.chmod(0)
        uid = 65534 if os.geteuid() == 0 else None  # nobody
        assert _scan_as(uid, locked) == SkipReason.UNREADABLE.value
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_scan_skips_unsupported_types_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "picture.png"
    path.write_bytes(b"\x89PNG\x00")
    result = scan_file(path)
    assert result.skip is SkipReason.UNSUPPORTED
    assert result.fmt is None


def test_list_files_is_stable_and_keys_are_relative(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    (root / "b").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.md").write_text("a\n")
    (root / "b" / "c.rst").write_text("c\n")
    (root / ".hidden.md").write_text("h\n")
    (root / ".git" / "config").write_text("x\n")
    single = tmp_path / "one.txt"
    single.write_text("one\n")
    listed = list(list_files([root, single]))
    assert [f.key for f in listed] == ["corpus/a.md", "corpus/b/c.rst", "one.txt"]
    assert [f.size for f in listed] == [2, 2, 4]
    assert all(Path(f.path).is_absolute() for f in listed)
