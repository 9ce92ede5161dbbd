"""The docs stay true to the code: every `name` `file:line` reference in the CoALA scorecard
still points at the named thing, the README's test command is what CI runs, the README's
configuration table gives the code's defaults, and docs/operations.md lists every setting
with its default."""

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
    from cortex_ray.settings import setting_variables, settings_table

    text = (ROOT / "docs" / "operations.md").read_text()
    table = settings_table()
    missing = [v for v in setting_variables() if f"`{v}`" not in text and f"`{v}__*`" not in text]
    assert missing == [], "regenerate the table in docs/operations.md from settings_table()"
    assert table in text, (
        "the settings table in docs/operations.md differs from the code; replace it with:\n" + table
    )


def test_the_readmes_configuration_defaults_are_the_codes() -> None:
    """Each README configuration row that names settings and gives one default per name
    (``| `A`, `B`, … | a, b | ...``) gives the code's defaults, in order; "3000 postings per
    term" beside a code default of 10,000 is what this catches (issue 15, point 6)."""
    from cortex_ray.settings import settings_table

    defaults = {}
    for row in settings_table().splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        defaults[cells[0].strip("`")] = cells[1].strip("`")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    checked = 0
    wrong = []
    for row in section.splitlines():
        if not row.startswith("| `CORTEX_"):
            continue
        names_cell, default_cell = (c.strip() for c in row.strip("|").split("|")[:2])
        names = [n for n in re.findall(r"`(CORTEX_\w+)`", names_cell) if n in defaults]
        values = [v.strip() for v in default_cell.split(",")]
        if not names or len(names) != len(values):
            continue  # a prose default ("unset → embedded PostgreSQL"): read by people
        for name, value in zip(names, values, strict=True):
            value = value.removesuffix(" s")
            if defaults[name] in ("unset", "(computed)") or not re.fullmatch(r"[\w.]+", value):
                continue  # prose, or several values in one ("1/1/1")
            checked += 1
            if value != defaults[name].replace("_", "").removesuffix(".0"):
                wrong.append(f"{name}: README {value!r}, code {defaults[name]!r}")
    assert checked >= 8
    assert wrong == []
