"""``cortex-ray connectors|grants|audit`` as a real subprocess (issue 18, point 8), with a
connector that an installed package offers through the ``cortex_ray.connectors`` entry
point group (a real distribution on the subprocess's path)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli_env, cortex

__all__ = ["cli_env"]  # the fixture, imported

PACKAGE = """
from cortex_ray import CapabilityTier
from cortex_ray.act import Tool
from cortex_ray.governance import Connector


async def _lookup(ctx, args):
    return {"name": args["name"], "email": "x@example.com"}


connector = Connector(name="crm", description="The CRM.", sensitive_fields=("email",))
tools = [
    Tool(name="crm_lookup", description="Look up.", handler=_lookup,
         parameters={"type": "object", "properties": {"name": {"type": "string"}}},
         tier=CapabilityTier.READ, connector="crm"),
    Tool(name="crm_update", description="Change.", handler=_lookup, connector="crm"),
]
"""


@pytest.fixture(scope="module")
def env(
    cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    site = tmp_path_factory.mktemp("site")
    (site / "fake_crm.py").write_text(PACKAGE)
    info = site / "fake_crm-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-crm\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[cortex_ray.connectors]\ncrm = fake_crm\n")
    path = ":".join(p for p in (str(site), cli_env.get("PYTHONPATH", "")) if p)
    yield {**cli_env, "PYTHONPATH": path}


def test_connectors_and_grants_from_the_command_line(env: dict[str, str]) -> None:
    org = f"cli-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        result = cortex(env, "--org", org, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    listed = run("connectors", "list")
    assert re.search(r"crm\s+no\s+crm_lookup, crm_update", listed), listed
    assert_one_line_error(
        cortex(env, "--org", org, "grants", "create", "*", "crm"), 1, "not installed"
    )
    assert_one_line_error(
        cortex(
            env, "--org", org, "connectors", "install", "crm", "--config", '{"password": "hunter2"}'
        ),
        2,
        "credential",
    )
    assert_one_line_error(
        cortex(env, "--org", org, "connectors", "install", "crm", "--config", "[1]"),
        2,
        "--config must be a JSON object",
    )
    assert "installed" in run("connectors", "install", "crm", "--config", '{"region": "eu"}')
    assert "crm: unknown" in run("connectors", "check", "crm")
    for args, code, why in [
        (("--tool", "crm_delete"), 2, "not tools of connector 'crm': crm_delete"),
        (("--constraint", "region=nope"), 2, "--constraint region is not JSON"),
        (("--constraint", 'region={"format": "x"}'), 2, "'format' is not supported"),
        (("--tier", "root"), 2, ""),
    ]:
        result = cortex(env, "--org", org, "grants", "create", "*", "crm", *args)
        assert result.returncode == code, (args, result.stderr)
        assert why in result.stderr
    made = run(
        "grants", "create", "bob", "crm", "--tool", "crm_update", "--tier", "write",
        "--constraint", 'region={"enum": ["eu"]}', "--approval", "writes",
    )  # fmt: skip
    grant_id = re.search(r"grant ([0-9a-f-]{36})", made)
    assert grant_id, made
    assert grant_id.group(1) in run("grants", "list")
    assert "revoked" in run("grants", "revoke", grant_id.group(1))
    assert grant_id.group(1) not in run("grants", "list")
    assert "revoked" in run("grants", "list", "--all")
    assert_one_line_error(
        cortex(env, "--org", org, "grants", "revoke", "nope"), 2, "not a grant id"
    )
    audit = run("audit")
    for label in ("connectors.install", "grants.create", "grants.revoke"):
        assert label in audit


async def test_run_reports_labels_and_acceptance_from_the_command_line(
    env: dict[str, str],
) -> None:
    """A shadow run made in this process (scripted planner) is read, labelled and counted
    by the CLI in another; bad input is one line naming what was wrong."""
    from cortex_ray import RunMode, Runtime, Settings
    from cortex_ray.memory import HeuristicImportanceScorer
    from cortex_ray.models import HashEmbedder, ScriptedModelClient
    from tests.test_connector_grants import CRM, TOOLS
    from tests.test_run_modes import plan, setup

    org = f"cli-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=Path(env["CORTEX_DATA_DIR"]),
        database_url=env.get("CORTEX_DATABASE_URL"),
        embedding_backend="hash",
        candidates=1,
    )
    runtime = await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=TOOLS,
        connectors=[CRM],
    )
    try:
        agent = await setup(runtime, org)
        run = await runtime.run_autonomous(org, agent, "g", max_steps=4, run_mode=RunMode.SHADOW)
    finally:
        await runtime.close()

    def run_cli(*args: str) -> str:
        result = cortex(env, "--org", org, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    report = run_cli("runs", "report", str(run.id))
    assert re.search(r"2\s+proposed\s+crm_update\s+write", report), report
    assert re.search(r"1\s+executed\s+crm_lookup\s+read", report), report
    bad = cortex(env, "--org", org, "runs", "label", str(run.id), "great")
    assert bad.returncode == 2 and "great" in bad.stderr
    assert "accepted" in run_cli("runs", "label", str(run.id), "accepted", "--note", "fine")
    assert "label: accepted by operator" in run_cli("runs", "report", str(run.id))
    assert re.search(r"clerk\s+1\s+1\s+1\s+0\s+0\s+100%", run_cli("runs", "acceptance"))
    assert_one_line_error(
        cortex(env, "--org", org, "runs", "report", str(uuid.uuid4())), 1, "not found"
    )


async def test_approvals_from_the_command_line_across_processes(env: dict[str, str]) -> None:
    """A run paused in one process is approved by the CLI in another and finished by a
    third runtime: the request is a row, nothing waits in memory."""
    from cortex_ray import RunStatus, Runtime, Settings
    from cortex_ray.memory import HeuristicImportanceScorer
    from cortex_ray.models import HashEmbedder, ScriptedModelClient
    from tests.test_approvals import paused_run, plan
    from tests.test_connector_grants import CRM, TOOLS, ran

    org = f"cli-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=Path(env["CORTEX_DATA_DIR"]),
        database_url=env.get("CORTEX_DATABASE_URL"),
        embedding_backend="hash",
        candidates=1,
    )

    async def opened() -> Runtime:
        return await Runtime.open(
            settings,
            model=ScriptedModelClient(responder=plan),
            embedder=HashEmbedder(384),
            importance=HeuristicImportanceScorer(),
            tools=TOOLS,
            connectors=[CRM],
        )

    first = await opened()
    try:
        run = await paused_run(first, org)
        assert run.status is RunStatus.AWAITING_APPROVAL
    finally:
        await first.close()

    listed = cortex(env, "--org", org, "approvals", "list", "--pending")
    assert listed.returncode == 0, listed.stderr
    found = re.search(r"([0-9a-f-]{36})\s+PENDING\s+" + str(run.id), listed.stdout)
    assert found, listed.stdout
    approval_id = found.group(1)
    assert_one_line_error(
        cortex(env, "--org", org, "approvals", "approve", "nope"), 2, "not a request id"
    )
    approved = cortex(env, "--org", org, "approvals", "approve", approval_id, "--note", "ok")
    assert approved.returncode == 0, approved.stderr
    assert "APPROVED" in approved.stdout and "RUNNING again" in approved.stdout
    assert_one_line_error(
        cortex(env, "--org", org, "approvals", "reject", approval_id), 1, "already APPROVED"
    )

    third = await opened()
    try:
        final = await third.drive_run(org, run.id)
        assert final.status is RunStatus.COMPLETED
        assert [t for t, _ in ran] == ["crm_lookup", "crm_update"]
    finally:
        await third.close()


def test_secrets_from_the_command_line(env: dict[str, str]) -> None:
    """The value comes from standard input, never the command line, and never comes back."""
    import subprocess

    from tests.test_cli import CLI

    org = f"cli-{uuid.uuid4().hex[:8]}"

    def with_input(*args: str, value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "--org", org, *args],
            env=env,
            input=value,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    made = with_input("secrets", "set", "crm_token", "--connector", "crm", value="hunter2-x\n")
    assert made.returncode == 0, made.stderr
    assert "hunter2-x" not in made.stdout + made.stderr
    bad = with_input("secrets", "set", "bad name", value="v")
    assert_one_line_error(bad, 2, "a secret's name")
    listed = cortex(env, "--org", org, "secrets", "list")
    assert re.search(r"crm_token\s+crm\s+operator", listed.stdout), listed.stdout
    assert "hunter2-x" not in listed.stdout
    assert cortex(env, "--org", org, "secrets", "delete", "crm_token").returncode == 0
    assert_one_line_error(
        cortex(env, "--org", org, "secrets", "delete", "crm_token"), 1, "no secret 'crm_token'"
    )
    audit = cortex(env, "--org", org, "audit")
    assert "secrets.put" in audit.stdout and "hunter2-x" not in audit.stdout


def test_rotating_the_secret_key_from_the_command_line(env: dict[str, str]) -> None:
    """Set under the key file's key; rotated to a new key with the old one accepted for
    reading; afterwards the new key alone opens it, and the old one alone does not."""
    import base64
    import subprocess

    from tests.test_cli import CLI

    org = f"cli-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(
        [*CLI, "--org", org, "secrets", "set", "crm_token"],
        env=env, input="hunter2-y\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    old = (Path(env["CORTEX_DATA_DIR"]) / "secret.key").read_text().strip()
    new = base64.urlsafe_b64encode(b"n" * 32).decode()
    mine = f"crm_token in {org}"
    rotated = cortex(
        env, "secrets", "rotate", CORTEX_SECRET_KEY=new, CORTEX_SECRET_PREVIOUS_KEYS=old
    )
    assert re.search(r"re-sealed under the current key: [1-9]", rotated.stdout), rotated.stdout
    assert mine not in rotated.stdout
    after = cortex(env, "secrets", "rotate", CORTEX_SECRET_KEY=new)
    assert "re-sealed under the current key: 0" in after.stdout and mine not in after.stdout
    stale = cortex(env, "secrets", "rotate")  # the key file's old key alone
    assert stale.returncode == 1 and f"not opened by any key: {mine}" in stale.stdout
    assert "hunter2-y" not in rotated.stdout + after.stdout + stale.stdout
    cortex(env, "--org", org, "secrets", "delete", "crm_token")


def test_schedules_from_the_command_line(env: dict[str, str]) -> None:
    org = f"cli-{uuid.uuid4().hex[:8]}"
    made_agent = cortex(env, "--org", org, "agents", "create", "nightly", "--mode", "autonomous")
    assert made_agent.returncode == 0, made_agent.stderr
    assert_one_line_error(
        cortex(env, "--org", org, "schedules", "create", "nightly", "g", "--cron", "nope"),
        2,
        "invalid cron expression",
    )
    made = cortex(
        env, "--org", org, "schedules", "create", "nightly", "check the clock",
        "--cron", "0 9 * * *", "--tz", "Europe/Paris",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    found = re.search(r"schedule ([0-9a-f-]{36}): next run", made.stdout)
    assert found, made.stdout
    sid = found.group(1)
    listed = cortex(env, "--org", org, "schedules", "list").stdout
    assert sid in listed and "ACTIVE" in listed and "Europe/Paris" in listed
    for action, status in (("suspend", "SUSPENDED"), ("resume", "ACTIVE"), ("cancel", "CANCELLED")):
        done = cortex(env, "--org", org, "schedules", action, sid)
        assert done.returncode == 0 and status in done.stdout, done.stderr
    assert_one_line_error(cortex(env, "--org", org, "schedules", "resume", sid), 1, "CANCELLED")


async def test_workflow_ledger_and_acceptance_from_the_command_line(
    env: dict[str, str],
) -> None:
    """A shadow workflow run made in this process (scripted planner) is read as a ledger
    and counted per workflow by the CLI in another; a bad version is one line."""
    from cortex_ray import RunMode, Runtime, Settings
    from cortex_ray.governance import RunLabel
    from cortex_ray.memory import HeuristicImportanceScorer
    from cortex_ray.models import HashEmbedder, ScriptedModelClient
    from tests.test_connector_grants import CRM, TOOLS
    from tests.test_workflows import EXTRA_TOOLS, inputs, plan, setup, spec

    org = f"cli-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=Path(env["CORTEX_DATA_DIR"]),
        database_url=env.get("CORTEX_DATABASE_URL"),
        embedding_backend="hash",
        candidates=1,
    )
    runtime = await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=plan),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[*TOOLS, *EXTRA_TOOLS],
        connectors=[CRM],
    )
    try:
        await setup(runtime, org)
        await runtime.workflows.create(org, "triage")
        await runtime.workflows.publish(
            org, "triage", spec(tools=("crm_lookup", "crm_update"), default_mode=RunMode.SHADOW)
        )
        made = await runtime.workflows.start_run(org, "triage", "clerk", inputs("update"))
        run = await runtime.drive_run(org, made.id)
        await runtime.governance.label_run(org, run.id, RunLabel.ACCEPTED)
    finally:
        await runtime.close()

    assert_one_line_error(
        cortex(env, "--org", org, "workflow", "publish", "triage",
               '{"instructions": "x", "input_schema": {"type": 5}}'),
        2,
        "input_schema is not a valid JSON schema",
    )  # fmt: skip
    ledger = cortex(env, "--org", org, "workflow", "ledger", str(run.id))
    assert ledger.returncode == 0, ledger.stderr
    assert "triage v1, shadow, COMPLETED" in ledger.stdout
    assert re.search(r"2\s+call\s+crm_update\s+proposed", ledger.stdout), ledger.stdout
    assert re.search(r"labelled\s+accepted", ledger.stdout), ledger.stdout
    acceptance = cortex(env, "--org", org, "workflow", "acceptance")
    assert re.search(r"triage\s+v1\s+1\s+1\s+1\s+1\s+100%", acceptance.stdout), acceptance.stdout
    # A page at a time: the cursor printed at the end reads the next page.
    first = cortex(env, "--org", org, "workflow", "ledger", str(run.id), "--limit", "3")
    assert first.returncode == 0, first.stderr
    found = re.search(r"more events: --after (\S+)", first.stderr)
    assert found, first.stderr
    assert "labelled" not in first.stdout and re.search(r"\b2\s+call", first.stdout) is None
    rest = cortex(
        env, "--org", org, "workflow", "ledger", str(run.id), "--after", found.group(1), "--json"
    )
    page = json.loads(rest.stdout)
    assert page["events"][0]["seq"] == 3 and page["events"][-1]["kind"] == "labelled"
    assert page["next_after"] is None
    assert_one_line_error(
        cortex(env, "--org", org, "workflow", "ledger", str(run.id), "--after", "nope"),
        2,
        "not a ledger cursor",
    )
    # A schedule of the workflow: its inputs checked when it is made.
    assert_one_line_error(
        cortex(env, "--org", org, "schedules", "create", "clerk", "--workflow", "triage",
               "--inputs", '{"plan": 5}', "--every", "3600"),
        2,
        "inputs: ",
    )  # fmt: skip
    assert_one_line_error(
        cortex(env, "--org", org, "schedules", "create", "clerk", "a goal", "--workflow",
               "triage", "--inputs", "{}", "--every", "3600"),
        2,
        "GOAL or --workflow",
    )  # fmt: skip
    made_schedule = cortex(
        env, "--org", org, "schedules", "create", "clerk", "--workflow", "triage",
        "--inputs", json.dumps(inputs("update")), "--every", "3600", "--mode", "dry_run",
    )  # fmt: skip
    assert made_schedule.returncode == 0, made_schedule.stderr
    listed = cortex(env, "--org", org, "schedules", "list").stdout
    assert "workflow triage (latest)" in listed, listed


def test_mcp_servers_from_the_command_line(env: dict[str, str]) -> None:
    """``cortex-ray connectors mcp``: the local operator may register a stdio server (its
    secret is not set, so its health says why nothing was listed); bad input is one line
    naming what was wrong; the registration is listed, audited and removed."""
    org = f"cli-{uuid.uuid4().hex[:8]}"

    def run(*args: str, code: int = 0) -> str:
        result = cortex(env, "--org", org, "connectors", "mcp", *args)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        return result.stdout

    assert_one_line_error(
        cortex(env, "--org", org, "connectors", "mcp", "add", "x", "--url", "https://a/",
               "--command", "b"),
        2,
        "either --url (HTTP) or --command (stdio)",
    )  # fmt: skip
    assert_one_line_error(
        cortex(env, "--org", org, "connectors", "mcp", "add", "x", "--url",
               "https://me:pw@mcp.example.com/"),
        2,
        "holds no credentials",
    )  # fmt: skip
    added = run("add", "local", "--command", "mcp-server-time", "--env", "TZ=tz_secret", code=1)
    # Registered all the same; its health says why nothing was listed yet.
    assert "MCP server local registered" in added and "no secret 'tz_secret'" in added, added
    listed = run("list")
    assert re.search(r"local\s+stdio\s+mcp-server-time\s+failing", listed), listed
    assert_one_line_error(
        cortex(env, "--org", org, "connectors", "mcp", "approve", "local", "nope"),
        1,
        "has no tool 'nope'",
    )
    assert "removed" in run("remove", "local")
    assert "local" not in run("list")
    audit = cortex(env, "--org", org, "audit").stdout
    for label in ("connectors.mcp.register", "connectors.mcp.remove"):
        assert label in audit
