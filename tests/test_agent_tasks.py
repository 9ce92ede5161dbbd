"""The whole-task suite of the agent benchmark (bench/_tasks.py): its verifiers and tools,
and one real run through ``agent_eval.py tasks`` (the packaged test model, the embedded
PostgreSQL, the real cycle): the suite must run and report; its success rate is measured,
not asserted (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bench_modules import load_bench

from cortex_ray.models import TEST_MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]


tasks = load_bench("_tasks")
WHEN = datetime(2026, 12, 1, 15, 2, tzinfo=UTC)


def by_name(name: str):  # type: ignore[no-untyped-def]
    return next(t for t in tasks.TASKS if t.name == name)


def test_the_calculator_does_arithmetic_only() -> None:
    assert tasks.evaluate("(17 * 23) + 4") == 395
    assert tasks.evaluate("2 ^ 3") == 8
    for bad in ("__import__('os')", "x + 1", "9 ** 999"):
        with pytest.raises((ValueError, SyntaxError)):
            tasks.evaluate(bad)


def test_the_unit_tool_converts_and_names_what_it_knows() -> None:
    out = asyncio.run(
        tasks._convert(None, {"value": 42, "from_unit": "kilometres", "to_unit": "mi"})
    )
    assert out == {"value": 26.0976, "unit": "mi"}
    bad = asyncio.run(tasks._convert(None, {"value": 1, "from_unit": "km", "to_unit": "kg"}))
    assert "cannot convert" in bad["error"]


def test_the_verifiers_check_the_end_state() -> None:
    demo = by_name("demo").verify
    good = tasks.Outcome(
        "It is 15:02 UTC on 2026-12-01.",
        ["current_time", "remember_fact"],
        ["current time: 2026-12-01T15:02:11+00:00"],
        WHEN,
    )
    assert demo(good) is None
    assert "no stored fact" in demo(tasks.Outcome(good.result, good.tools_called, [], WHEN))
    assert "current_time was never called" in demo(
        tasks.Outcome(good.result, ["remember_fact"], good.facts, WHEN)
    )
    remember = by_name("remember").verify
    # The subject counts: "orion project": "launch date: 2027-03-14" holds both.
    assert remember(tasks.Outcome("", [], ["orion project: launch date: 2027-03-14"], WHEN)) is None
    assert remember(tasks.Outcome("", [], ["launch date: 2027-03-14"], WHEN)) is not None
    price = by_name("price_total").verify
    assert price(tasks.Outcome("37.5 euros", ["lookup_price"], [], WHEN)) is None
    assert "lookup_price was never called" in price(tasks.Outcome("37.5 euros", [], [], WHEN))


def test_the_corpus_is_fictional_and_holds_the_answer() -> None:
    text = (ROOT / "bench" / "data" / "agent_corpus" / "observatories.md").read_text()
    assert "Veltran Observatory" in text and "Marrowick" in text


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_suite_runs_through_the_real_cycle(tmp_path: Path) -> None:
    out = tmp_path / "tasks.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    data = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "agent_eval.py"),
            "tasks",
            "--model",
            TEST_MODEL_NAME,
            "--tasks",
            # one autonomous and one interactive task: the knowledge task adds 3-4 steps of
            # the test model (100-460 s measured) and no path the other two do not take
            "arithmetic,chat_calc",
            "--variants",
            "first",
            "--quiet",
            "--json",
            str(out),
        ],
        env={
            **env,
            "HF_HUB_OFFLINE": "1",
            "CORTEX_DATA_DIR": str(data),
            # Bounds each model call (768 by default: SmolLM2 may ramble to the limit, and a
            # cut-off answer is retried); a run still ends in a reported result either way.
            "CORTEX_MODEL_MAX_TOKENS": "256",
        },
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["task"] for r in results] == ["arithmetic", "chat_calc"]
    for r in results:
        assert r["variant"] == "first" and r["steps"] >= 1 and r["seconds"] > 0
        assert r["ok"] == (r["why"] is None)
    assert "| first | " in proc.stdout and "model SmolLM2" in proc.stdout
