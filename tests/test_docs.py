"""The docs stay true to the code: every `name` `file:line` reference in the CoALA scorecard
still points at the named thing, the README's test command is what CI runs, and
docs/operations.md lists every setting with its default."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF = re.compile(r"`([^`]+)` `([\w/.]+\.py):(\d+)`")
ANY_REF = re.compile(r"`([\w/.]+\.py):(\d+)`")


def test_scorecard_references_point_at_what_they_name() -> None:
    text = (ROOT / "docs" / "COALA_VALIDATION.md").read_text()
    named = REF.findall(text)
    assert len(named) >= 30
    stale = []
    for name, path, line in named:
        lines = (ROOT / path).read_text().splitlines()
        token = name.split(".")[-1]
        if int(line) > len(lines) or token not in lines[int(line) - 1]:
            stale.append(f"{name} → {path}:{line}")
    assert stale == []
    for path, line in ANY_REF.findall(text):
        assert int(line) <= len((ROOT / path).read_text().splitlines()), f"{path}:{line}"


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "./dev test"
    assert "./dev test" in (ROOT / "README.md").read_text()


def test_operations_lists_every_setting_with_its_default() -> None:
    from cortex_ray._settings import setting_variables, settings_table

    text = (ROOT / "docs" / "operations.md").read_text()
    table = settings_table()
    missing = [v for v in setting_variables() if f"`{v}`" not in text and f"`{v}__*`" not in text]
    assert missing == [], "regenerate the table in docs/operations.md from settings_table()"
    assert table in text, (
        "the settings table in docs/operations.md differs from the code; replace it with:\n" + table
    )
