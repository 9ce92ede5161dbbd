"""cortex-ray's metrics through a real Prometheus scraping Ray's metrics endpoint.

A task and a conversation through session actors, a denied tool call, a turn refused on an
ended session, a knowledge search and an ingestion job; then every cortex-ray series is read
back through Prometheus's HTTP API, and every panel of the shipped Grafana dashboard is
checked to query only series that appeared here.

Prometheus is Debian's build, which ``./dev setup`` unpacks into .venv/tools/prometheus
(``apt-get download``, no root); where it is absent the test is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cortex_ray import AgentMode, ConflictError, Grant, Principal, Settings
from cortex_ray.observability import metrics
from cortex_ray.storage import Database

pytest.importorskip("ray")

from test_api import open_test_runtime

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "cluster" / "grafana" / "cortex-ray.json"


def _prometheus() -> str | None:
    shipped = ROOT / ".venv" / "tools" / "prometheus" / "usr" / "bin" / "prometheus"
    return str(shipped) if shipped.exists() else shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def prometheus(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping this Ray's metrics endpoint every second; its base URL."""
    import ray

    binary = _prometheus()
    if binary is None:
        pytest.skip(
            "no Prometheus: ./dev setup unpacks Debian's into .venv/tools/prometheus "
            "(apt-get download prometheus), and none is on PATH"
        )
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    target = f"127.0.0.1:{node['MetricsExportPort']}"
    home = tmp_path_factory.mktemp("prometheus")
    config = home / "prometheus.yml"
    # Ray's endpoint carries every series of the whole test run (each worker process its
    # own, by WorkerId): late in the suite it is megabytes and takes seconds to render, so
    # the scrape timeout is generous (a scrape past it fails whole and stores nothing).
    config.write_text(
        "global: {scrape_interval: 20s, scrape_timeout: 20s, evaluation_interval: 20s}\n"
        "scrape_configs:\n"
        f"  - job_name: ray\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    log = (home / "log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((home / "log").read_text()[-2000:]) from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    body = _get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _value(prometheus: str, expr: str) -> float:
    found = _query(prometheus, expr)
    return sum(float(r["value"][1]) for r in found)


def _scrape_health(prometheus: str) -> list[dict[str, Any]]:
    """What Prometheus says of its scrapes of Ray (health, last error, how long the last
    one took): the first thing to read when a series is missing."""
    targets = _get(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
    keys = ("health", "lastError", "lastScrapeDuration")
    return [{k: t.get(k) for k in keys} for t in targets]


def _wait_for(prometheus: str, exprs: list[str], timeout_s: float = 150) -> dict[str, float]:
    """Each query's value once every one is above zero (Ray's agent reports every 2 s
    here; Prometheus scrapes every 20 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = {e: _value(prometheus, e) for e in exprs}
        if all(v > 0 for v in values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(1)


async def test_cortex_series_reach_prometheus_and_the_dashboard_reads_only_them(
    prometheus: str, settings: Settings, db: Database, org: str, tmp_path: Path
) -> None:
    from actors import SessionManager, SessionPolicy, install_ray_metrics
    from jobs.ingest import run_ingest

    install_ray_metrics()  # this process (a Ray driver) records too: the search, the denial
    served = settings.model_copy(update={"database_url": db.dsn})
    runtime = await open_test_runtime(served)
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    manager = SessionManager(
        served.model_copy(update={"pool_max_size": 2}),
        factory=open_test_runtime,
        policy=SessionPolicy(namespace=namespace, idle_timeout_s=1.0, warm_actors=0),
    )
    try:
        await runtime.store.ensure_org(org)
        ada = Principal(id="ada", org_id=org, grant=Grant(tools=frozenset({"*"})))
        worker = await runtime.create_agent(org, "metered", mode=AgentMode.AUTONOMOUS)
        run = await runtime.start_run(org, worker.id, "Tell me the time", principal=ada)
        await manager.start_run(org, run.id)
        assert (await manager.wait_run(org, run.id)).value == "COMPLETED"

        chat = await runtime.create_agent(org, "chatty")
        session = await runtime.open_session(org, chat.id, ada)
        turn = await runtime.accept_turn(org, session.id, "what time is it?", principal=ada)
        await manager.turn(org, session.id, ada, "what time is it?", turn_id=turn.id)
        # Its actor passivates after a second idle; the next turn brings it back.
        deadline = time.monotonic() + 20
        while await manager.session_actor(org, session.id) is not None:
            assert time.monotonic() < deadline, "the idle session actor never passivated"
            await asyncio.sleep(0.2)
        again = await runtime.accept_turn(org, session.id, "and now?", principal=ada)
        await manager.turn(org, session.id, ada, "and now?", turn_id=again.id)
        await manager.end_session(org, session.id)
        with pytest.raises(ConflictError):
            await runtime.accept_turn(org, session.id, "still there?", principal=ada)

        limited = Principal(id="bob", org_id=org, grant=Grant(tools=frozenset({"reply"})))
        denied = await runtime.invoke_tool(org, chat.id, limited, "current_time", {})
        assert denied.status.value == "REFUSED"

        corpus = tmp_path / "corpus"
        corpus.mkdir()
        (corpus / "guide.md").write_text("# Guide\n\nRun the installer, then restart.\n")
        report = run_ingest(org, "handbook", [corpus], dsn=db.dsn, embed=False)
        assert report.read == 1
        await runtime.search_knowledge(org, "installer", collection="handbook", principal=ada)
    finally:
        await runtime.close(close_db=False)

    o = f'org="{org}"'
    values = _wait_for(
        prometheus,
        [
            f'ray_cortex_runs_started_total{{{o},agent="metered"}}',
            f'ray_cortex_runs_finished_total{{{o},agent="metered",outcome="COMPLETED"}}',
            f'ray_cortex_steps_total{{{o},decision="ACT"}}',
            f'ray_cortex_steps_total{{{o},decision="FINISH"}}',
            f'ray_cortex_tool_calls_total{{{o},tool="current_time",category="GROUNDING",outcome="OK"}}',
            f'ray_cortex_access_denials_total{{{o},tool="current_time"}}',
            f'ray_cortex_phase_duration_seconds_count{{{o},phase="perceive"}}',
            f'ray_cortex_phase_duration_seconds_count{{{o},phase="learn"}}',
            f'ray_cortex_tool_duration_seconds_count{{{o},tool="current_time"}}',
            'ray_gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="chat",'
            'gen_ai_request_model="scripted"}',
            'ray_gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="embeddings"}',
            'ray_gen_ai_client_token_usage_count{gen_ai_token_type="input"}',
            f'ray_cortex_turns_finished_total{{{o},agent="chatty",outcome="replied"}}',
            f'ray_cortex_turns_rejected_total{{{o},reason="ended"}}',
            f'ray_cortex_session_passivations_total{{namespace="{namespace}"}}',
            f'ray_cortex_session_reactivations_total{{namespace="{namespace}"}}',
            f'ray_cortex_ingest_files_total{{{o},collection="handbook",outcome="written"}}',
            f'ray_cortex_ingest_passages_total{{{o},collection="handbook"}}',
            f'ray_cortex_ingest_bytes_total{{{o},collection="handbook"}}',
            f'ray_cortex_knowledge_search_duration_seconds_count{{{o},outcome="ok"}}',
            # the gauge may read 0 live sessions by now: its series being there is what
            # counts (count() is 1 then, and no result while it is absent)
            f'count(ray_cortex_session_actors{{namespace="{namespace}",state="live"}})',
        ],
    )
    missing = [e for e, v in values.items() if v <= 0]
    assert missing == [], (missing, _scrape_health(prometheus))
    assert values[f'ray_cortex_runs_started_total{{{o},agent="metered"}}'] == 1
    assert values[f'ray_cortex_steps_total{{{o},decision="ACT"}}'] == 1
    assert values[f'ray_cortex_access_denials_total{{{o},tool="current_time"}}'] == 1
    # Low cardinality: no series carries a run, session or turn id.
    labels = set(_get(f"{prometheus}/api/v1/labels")["data"])
    assert not labels & {"run_id", "session_id", "turn_id", "run", "session"}

    # Every panel of the dashboard queries series this test saw.
    seen = set(_get(f"{prometheus}/api/v1/label/__name__/values")["data"])
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\b(ray_(?:cortex|gen_ai)_[a-z_]+)", target["expr"])
    }
    assert queried, "the dashboard queries no cortex-ray series"
    assert queried - seen == set()
    named = {s.prometheus_name for s in metrics.METRICS if s.kind != "histogram"} | {
        f"{s.prometheus_name}_{part}"
        for s in metrics.METRICS
        if s.kind == "histogram"
        for part in ("bucket", "count", "sum")
    }
    assert queried <= named  # and each is one the core names
