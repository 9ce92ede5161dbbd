"""``cortex-ray graph`` and ``cortex-ray sources``, run as real subprocesses: facts added and
searched, a contradicting fact closing the older one, and bad input refused with one line
naming what was wrong (exit 2), nothing stored; ``graph extract`` and ``graph project`` hand
the jobs (``python -m jobs.graph_extract``, ``jobs.graph_project``) the same arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import pytest
import typer
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


def _options(command: Any) -> set[str]:
    # typer carries its own click (typer._click): its parameters are told by their kind.
    return {o for p in command.params if p.param_type_name == "option" for o in p.opts}


def _job_command(main: Callable[..., Any]) -> Any:
    job = typer.Typer(add_completion=False)  # as typer.run makes it
    job.command()(main)
    return typer.main.get_command(job)


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from cortex_ray.cli import app

    return CliRunner().invoke(app, list(args))


def test_graph_extract_runs_the_model_extraction_job_with_its_arguments(
    cli_env: dict[str, str],  # noqa: F811
) -> None:
    """``cortex-ray graph extract`` takes the job's options (same names, --org the global
    one), hands the given ones on, and refuses bad ones naming them."""
    from cortex_ray.cli import app
    from jobs.graph_extract import main

    job = _job_command(main)
    extract = typer.main.get_command(app).commands["graph"].commands["extract"]  # type: ignore[attr-defined]
    assert _options(extract) == _options(job) - {"--org"} | {"--print-command"}

    a, b = str(uuid4()), str(uuid4())
    printed = _cli(
        "--org", "acme", "graph", "extract", "--collection", "handbook", "--source", a,
        "--source", b, "--since-version", "3", "--batch", "4", "--print-command",
    )  # fmt: skip
    assert printed.exit_code == 0, printed.output
    argv = printed.stdout.split()
    assert argv[:3] == ["python", "-m", "jobs.graph_extract"]
    assert argv[3:] == [
        "--org", "acme", "--collection", "handbook", "--source", a, "--source", b,
        "--since-version", "3", "--batch", "4",
    ]  # fmt: skip
    parsed = job.make_context("graph_extract", argv[3:]).params  # the job takes them as given
    assert (parsed["org"], parsed["source"], parsed["since_version"]) == ("acme", [a, b], 3)

    for args, text in (
        ([], "give --collection or --source (what to extract)"),
        (["--source", "nope"], "--source: not a source id: 'nope'"),
    ):
        refused = _cli("graph", "extract", *args)
        assert (refused.exit_code, refused.stderr.strip()) == (2, f"error: {text}")
    refused = _cli("graph", "extract", "--collection", "c", "--since-version", "0")
    assert refused.exit_code == 2 and "'--since-version'" in refused.stderr

    # For real: the job runs in this process's place and refuses an option out of range
    # (before it starts Ray), which it names.
    ran = cortex(
        cli_env, "--org", "acme", "graph", "extract", "--collection", "c", "--batch", "0",
        timeout=120,
    )  # fmt: skip
    assert_one_line_error(ran, 2, "invalid option --batch: Input should be greater than")


def test_graph_project_runs_the_projection_job_with_its_arguments(
    cli_env: dict[str, str],  # noqa: F811
) -> None:
    """``cortex-ray graph project`` takes the projection job's options and hands them on."""
    from cortex_ray.cli import app
    from jobs.graph_project import main

    job = _job_command(main)
    project = typer.main.get_command(app).commands["graph"].commands["project"]  # type: ignore[attr-defined]
    assert _options(project) == _options(job) | {"--print-command"}

    printed = _cli(
        "graph", "project", "--uri", "bolt://graph:7687", "--batch", "500", "--rebuild",
        "--wipe", "--print-command",
    )  # fmt: skip
    assert printed.exit_code == 0, printed.output
    argv = printed.stdout.split()
    assert argv == [
        "python", "-m", "jobs.graph_project", "--uri", "bolt://graph:7687", "--batch", "500",
        "--rebuild", "--wipe",
    ]  # fmt: skip
    parsed = job.make_context("graph_project", argv[3:]).params
    assert (parsed["uri"], parsed["batch"], parsed["rebuild"], parsed["wipe"]) == (
        "bolt://graph:7687", 500, True, True,
    )  # fmt: skip

    refused = _cli("graph", "project", "--wipe")
    assert (refused.exit_code, refused.stderr.strip()) == (
        2,
        "error: --wipe only goes with --rebuild",
    )
    refused = _cli("graph", "project", "--batch", "0")
    assert refused.exit_code == 2 and "'--batch'" in refused.stderr

    # For real: the job runs and, with no Bolt server configured, says which option is missing.
    ran = cortex(cli_env, "graph", "project", "--follow", timeout=120)
    assert_one_line_error(ran, 2, "no Bolt server: give --uri or set CORTEX_GRAPH__URI")
