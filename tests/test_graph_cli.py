"""``cortex-ray graph`` and ``cortex-ray sources``, run as real subprocesses: facts added and
searched, a contradicting fact closing the older one, and bad input refused with one line
naming what was wrong (exit 2), nothing stored."""

from __future__ import annotations

import json
import subprocess
import sys
from uuid import uuid4

import pytest
from test_cli import assert_one_line_error, cli_env, cortex  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_facts_are_added_searched_and_closed_from_the_command_line(
    cli_env: dict[str, str],  # noqa: F811
) -> None:
    org = f"cli-{uuid4().hex[:8]}"
    add = ["--org", org, "graph", "add"]
    first = cortex(
        cli_env, *add, "service:billing-api", "owned_by", "team:payments", "--functional"
    )
    assert first.returncode == 0, first.stderr
    assert "1 new fact(s), 2 new entities, 0 closed" in first.stdout
    second = cortex(
        cli_env, *add, "service:billing-api", "owned_by", "team:platform", "--functional"
    )
    assert "1 closed" in second.stdout, second.stdout + second.stderr
    found = cortex(cli_env, "--org", org, "graph", "search", "billing-api", "--json")
    assert found.returncode == 0, found.stderr
    facts = json.loads(found.stdout)["facts"]
    assert [f["object"]["name"] for f in facts] == ["platform"]
    assert facts[0]["citation"] == "submitted by operator"
    table = cortex(cli_env, "--org", org, "graph", "search", "billing-api")
    assert "service:billing-api owned_by team:platform" in table.stdout

    for args, text in (
        ([*add, "billing-api", "owned_by", "team:x"], "subject: expected TYPE:NAME"),
        ([*add, "service:a", "Owned By", "team:x"], "predicate"),
        ([*add, "service:a", "owned_by", "team:x", "--confidence", "2"], "confidence"),
        ([*add, "service:a", "owned_by", "team:x", "--valid-from", "soon"], "--valid-from"),
        (["--org", org, "graph", "search", "billing-api", "--depth", "9"], "depth: 1 to 4"),
    ):
        assert_one_line_error(cortex(cli_env, *args), 2, text)
    again = cortex(cli_env, "--org", org, "graph", "search", "billing-api", "--json")
    assert json.loads(again.stdout)["facts"] == facts  # nothing stored by the refusals

    missing = cortex(cli_env, "--org", org, "sources", "check", "nope")
    assert_one_line_error(missing, 1, "no collection 'nope'")


def test_the_commands_are_listed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cortex_ray.cli", "graph", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "search" in out and "add" in out
