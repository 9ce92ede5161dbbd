"""What the Ray entry points (``python -m serve``, ``python -m serve.models``, the demo) print
when their output is not a terminal: clean lines (``serve._lifecycle.plain_output``). The
whole stack's output is checked in tests/test_demo.py (``python -m serve`` to a file)."""

from __future__ import annotations

import io
import logging
import os
import sys

import pytest

pytest.importorskip("ray")

import ray._private.ray_logging as ray_logging

from serve._lifecycle import plain_output


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Ray's variables unset; what plain_output changes is put back after the test (the
    variables, Ray's dedup constant; the streams: see :func:`files_for_output`)."""
    monkeypatch.delenv("RAY_DEDUP_LOGS", raising=False)
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.setattr(ray_logging, "RAY_DEDUP_LOGS", True)
    return monkeypatch


def files_for_output(monkeypatch: pytest.MonkeyPatch) -> tuple[io.StringIO, io.StringIO]:
    """stdout and stderr are files (set in the test itself: pytest's capture swaps the
    streams between a fixture's set-up and the test)."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


def test_off_a_terminal_lines_lose_their_colour_codes(not_a_terminal: pytest.MonkeyPatch) -> None:
    out, err = files_for_output(not_a_terminal)
    # A handler that took stderr before (Ray's own does, when Ray is imported).
    early = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("test_serve_output.early")
    logger.addHandler(early)
    not_a_terminal.setattr(logger, "propagate", False)
    try:
        plain_output()
        plain_output()  # idempotent: the streams are wrapped once
        logger.warning("Started. View the dashboard at \x1b[1m\x1b[32mhttp://h:1\x1b[39m")
    finally:
        logger.removeHandler(early)
    # What Ray printed: a worker's coloured prefix, ray.init's bold green dashboard URL.
    print("\x1b[36m(ProxyActor pid=2834)\x1b[0m INFO proxy -- Proxy starting")
    sys.stderr.write(
        "View the dashboard at \x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m\n"
    )
    assert out.getvalue() == "(ProxyActor pid=2834) INFO proxy -- Proxy starting\n"
    assert err.getvalue() == (
        "Started. View the dashboard at http://h:1\nView the dashboard at http://127.0.0.1:8265 \n"
    )
    assert sys.stdout.isatty() is False and sys.stdout.plain is out  # type: ignore[attr-defined]


def test_off_a_terminal_ray_neither_colours_nor_deduplicates(
    not_a_terminal: pytest.MonkeyPatch,
) -> None:
    files_for_output(not_a_terminal)

    def batch(pid: int) -> dict[str, object]:
        line = "WARNING run 1 (org a): nobody was driving it; resumed (attempt 2)"
        return {"ip": "10.0.0.1", "pid": pid, "lines": [line], "localhost": "10.0.0.1"}

    plain_output()
    assert os.environ["RAY_COLOR_PREFIX"] == "0"  # Ray's own switch, read at each line
    assert os.environ["RAY_DEDUP_LOGS"] == "0"
    # Ray's own deduplicator (the driver's): the same line from two workers both print,
    # without a "[repeated 2x across cluster]" summary or its hint.
    dedup = ray_logging.LogDeduplicator(5, None, None)
    assert dedup.deduplicate(batch(1)) == [batch(1)]
    assert dedup.deduplicate(batch(2)) == [batch(2)]
    assert dedup.flush() == []


def test_a_variable_the_user_set_is_kept(not_a_terminal: pytest.MonkeyPatch) -> None:
    files_for_output(not_a_terminal)
    not_a_terminal.setenv("RAY_DEDUP_LOGS", "1")
    not_a_terminal.setenv("RAY_COLOR_PREFIX", "1")
    plain_output()
    assert (os.environ["RAY_DEDUP_LOGS"], os.environ["RAY_COLOR_PREFIX"]) == ("1", "1")
    assert ray_logging.RAY_DEDUP_LOGS is True
