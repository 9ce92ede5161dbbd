"""Two Ray nodes on this machine, for real: the CPU Serve config file deployed across them.

A head (``ray start --head``: 2 CPUs, node label ``cortex-ray.io/pool=cpu``) and a second
node (``ray start --address``: 1 CPU, 2 of a custom ``gpu_like`` resource standing in for a
GPU, label ``cortex-ray.io/pool=gpu``), each with its own temp dir and ports, token
authentication on (one token in every process's environment, as KubeRay hands it out). The
database and every other setting reach the replicas and actors from the nodes' environment,
as a Secret would on KubeRay; the file itself is deployed with ``serve deploy``, with only
the placement a GPU cluster would have: the embedder and the LLM ask for ``gpu_like`` (so
they can only run on the second node) and the session actors for the ``cpu`` label.

One test, several checks (each start of a cluster costs tens of seconds): a task through
HTTP whose run actor is on the head while the model replicas it called are on the second
node (Ray's state API), an ingestion job from ``ray job submit --working-dir .``, then the
second node killed under a running task, which still ends in a terminal state. Every
process the test started is killed at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
import yaml

from cortex_ray import Grant, Principal
from cortex_ray.storage import Database, Store

pytest.importorskip("ray")

from actors import ActorKey

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "cluster" / "serve-cpu.yaml"
RAY = Path(sys.executable).with_name("ray")
SERVE = Path(sys.executable).with_name("serve")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
POOL = "cortex-ray.io/pool"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_of(temp_dir: Path) -> list[int]:
    """Processes of one node this test started: their command lines name its temp dir."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if str(temp_dir).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
    return pids


class Node:
    """``ray start --block`` for one node, in its own process group and temp dir."""

    def __init__(self, args: list[str], env: dict[str, str], temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        ports = [
            f"--{name}={_free_port()}"
            for name in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
            )
        ]
        self.log = temp_dir.with_suffix(".log").open("w")
        self.process = subprocess.Popen(
            [str(RAY), "start", "--block", "--temp-dir", str(temp_dir), *ports, *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """Every process of the node at once (SIGKILL): the node dies, as a lost machine."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in _pids_of(self.temp_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self.kill()
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.temp_dir.with_suffix(".log").unlink(missing_ok=True)


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args[:3]}: {(done.stdout + done.stderr)[-4000:]}"
    return done.stdout


def _state(kind: str, address: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Ray's state API (``ray list KIND --detail``), as JSON."""
    out = _run(
        [str(RAY), "list", kind, "--address", address, "--detail", "--format", "json",
         "--limit", "10000"],
        env,
    )  # fmt: skip
    if not out.lstrip().startswith("["):
        return []  # "No resource in the cluster" (not yet registered)
    listed: list[dict[str, Any]] = json.loads(out)
    return listed


def _wait(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {within:.0f} s")


def _status(url: str) -> int | None:
    try:
        return httpx2.get(url, timeout=5).status_code
    except httpx2.HTTPError:
        return None


def _answers(url: str) -> bool:
    return _status(url) == 200


def _placed(config: dict[str, Any], http_port: int) -> dict[str, Any]:
    """serve-cpu.yaml as shipped, with the placement a GPU cluster's file has: the embedder
    and the LLM on ``gpu_like`` (one replica each: two units exist)."""
    from ray.serve.schema import ServeDeploySchema

    config = json.loads(json.dumps(config))
    config["http_options"]["port"] = http_port
    (models,) = [a for a in config["applications"] if a["import_path"] == "serve.models:build_app"]
    for part in ("embedder", "llm"):
        deployment = models["args"][part]["deployment"]
        deployment.pop("autoscaling_config", None)
        deployment["num_replicas"] = 1
        deployment["ray_actor_options"]["resources"] = {"gpu_like": 1}
    ServeDeploySchema.model_validate(config)
    return config


@pytest.fixture
def cluster_env(db: Database, tmp_path: Path) -> Iterator[dict[str, str]]:
    token = secrets.token_hex(32)
    namespace = f"cluster-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        # token auth, one token everywhere (KubeRay: authOptions, a Secret per cluster)
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        # an activated venv: `python` in a job's entrypoint is this one, as on a cluster image
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        # this checkout first on every worker's path (the shared venv may point elsewhere)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # the settings, from the nodes' environment (KubeRay: env from a Secret / ConfigMap)
        "CORTEX_DATABASE_URL": db.dsn,
        "CORTEX_DATA_DIR": str(tmp_path / "data"),
        "CORTEX_SESSIONS__NAMESPACE": namespace,
        "CORTEX_SESSIONS__LABEL_SELECTOR": json.dumps({POOL: "cpu"}),
        "CORTEX_SESSIONS__WARM_ACTORS": "0",
        "CORTEX_SESSIONS__RUN_RETRY_LIMIT": "1",
        "CORTEX_CANDIDATES": "1",
        "CORTEX_IMPORTANCE_SCORING": "heuristic",
        "CORTEX_MODEL_MAX_TOKENS": "128",
        "CORTEX_MODEL_TIMEOUT_S": "15",
        "CORTEX_STRUCTURED_RETRIES": "0",
        # Test pace, not what is tested. SIGTERM to `ray start --block` drains the node for
        # up to 30 s first (for Serve's proxies on a live cluster): the teardown kills
        # everything anyway.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        # A session actor whose start failed (no model replica left) exits only once its
        # Serve handles' long polls to the controller return, 30–60 s each by default; the
        # run's next attempt waits for that exit. Shorter polls, the same attempts.
        "LISTEN_FOR_CHANGE_REQUEST_TIMEOUT_S_LOWER_BOUND": "2",
        "LISTEN_FOR_CHANGE_REQUEST_TIMEOUT_S_UPPER_BOUND": "4",
    }
    yield env


@pytest.mark.timeout(900)
async def test_two_nodes_serve_the_cpu_config_and_survive_losing_one(
    cluster_env: dict[str, str], store: Store, org: str, db: Database, tmp_path: Path
) -> None:
    env = cluster_env
    gcs, dashboard, http_port = _free_port(), _free_port(), _free_port()
    tag = uuid.uuid4().hex[:8]
    head = Node(
        ["--head", f"--port={gcs}", f"--ray-client-server-port={_free_port()}",
         "--num-cpus", "2", "--labels", f"{POOL}=cpu", "--include-dashboard", "true",
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
         "--disable-usage-stats"],
        env, Path("/tmp") / f"rc-{tag}-h",
    )  # fmt: skip
    second: Node | None = None
    client: httpx2.Client | None = None
    address = f"http://127.0.0.1:{dashboard}"
    url = f"http://127.0.0.1:{http_port}"
    try:
        # the dashboard answers (401 without the token: it is up)
        _wait(lambda: _status(f"{address}/api/version") or head.process.poll(), 90, "the head")
        assert head.process.poll() is None, "ray start --head exited"
        second = Node(
            [f"--address=127.0.0.1:{gcs}", "--num-cpus", "1",
             "--resources", json.dumps({"gpu_like": 2}), "--labels", f"{POOL}=gpu"],
            env, Path("/tmp") / f"rc-{tag}-w",
        )  # fmt: skip

        def two_alive() -> list[dict[str, Any]] | None:
            alive = [n for n in _state("nodes", address, env) if n["state"] == "ALIVE"]
            return alive if len(alive) == 2 else None

        nodes = _wait(two_alive, 90, "two live nodes")
        by_pool = {n["labels"].get(POOL): n["node_id"] for n in nodes}
        head_id, gpu_id = by_pool["cpu"], by_pool["gpu"]

        # --- the CPU Serve config, deployed with `serve deploy` ------------------------------
        path = tmp_path / "serve-cpu.yaml"
        path.write_text(yaml.safe_dump(_placed(yaml.safe_load(CONFIG.read_text()), http_port)))
        _run([str(SERVE), "deploy", "--address", address, str(path)], env)
        _wait(lambda: _answers(f"{url}/healthz") and _answers(f"{url}/models/health"), 300,
              "the API and the models from serve-cpu.yaml")  # fmt: skip

        admin = Principal(
            id="admin", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"}))
        )
        await store.ensure_org(org)
        key, _ = await store.create_api_key(admin, "cluster test")
        auth = {"Authorization": f"Bearer {key}"}
        client = httpx2.Client(base_url=url, headers=auth, timeout=60)
        agent = client.post(
            f"/api/orgs/{org}/agents",
            json={"name": "planner", "mode": "AUTONOMOUS", "persona": "Answer briefly."},
        )
        assert agent.status_code == 201, agent.text

        def submit(goal: str) -> str:
            created = client.post(
                f"/api/orgs/{org}/tasks",
                json={"name": goal, "agentId": agent.json()["id"], "assigneeKind": "AGENT",
                      "payload": {"goal": goal, "maxSteps": 2}},
            )  # fmt: skip
            assert created.status_code == 202, created.text
            return str(created.json()["id"])

        def run_of(run_id: str) -> dict[str, Any]:
            run: dict[str, Any] = client.get(f"/api/orgs/{org}/tasks/{run_id}").json()
            return run

        def chat_lines() -> int:
            """Requests the LLM replica on the second node logged (Serve's request log, in
            that node's own temp dir)."""
            logs = Path(f"/tmp/rc-{tag}-w").glob(
                "session_2*/logs/serve/replica_cortex-models_LLM_*.log"
            )
            return sum(p.read_text().count("chat") for p in logs)

        # Warm the models up (first forward passes) so the run's calls meet warm replicas.
        warm = client.post(
            "/models/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["hi"]}
        )
        assert warm.status_code == 200, warm.text
        warm = client.post(
            "/models/v1/chat/completions",
            json={"model": "SmolLM2-135M-Instruct", "max_tokens": 4,
                  "messages": [{"role": "user", "content": "hi"}]},
        )  # fmt: skip
        assert warm.status_code == 200, warm.text
        before = _wait(chat_lines, 30, "the warm-up call in the LLM replica's log")

        # --- 1. a task: run actor on the head, the model replicas on the second node --------
        first = submit("Say hello.")
        name = ActorKey.run(org, uuid.UUID(first)).name
        done = _wait(lambda: run_of(first)["status"] in TERMINAL and run_of(first), 240,
                     "the first run")  # fmt: skip
        actors = _state("actors", address, env)
        (run_actor,) = [a for a in actors if a["name"] == name]
        assert run_actor["node_id"] == head_id, run_actor
        replicas = {
            a["class_name"].rsplit(":", 1)[-1]: a["node_id"]
            for a in actors
            if a["class_name"].startswith("ServeReplica:cortex-models") and a["state"] == "ALIVE"
        }
        assert replicas["LLM"] == gpu_id and replicas["Embedder"] == gpu_id, replicas
        # The run's model calls were answered there.
        _wait(lambda: chat_lines() > before, 30, f"the run's calls in the LLM's log ({done})")
        assert done["steps"], done

        # --- 2. an ingestion job: ray job submit --working-dir . ----------------------------
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        (corpus / "guide.md").write_text("# Guide\n\n## Install\n\nRun the installer.\n")
        (corpus / "notes.txt").write_text("First note.\n\nSecond note.\n")
        out = _run(
            [str(RAY), "job", "submit", "--address", address, "--working-dir", ".", "--",
             "python", "-m", "jobs.ingest", "--org", org, "--collection", "docs",
             "--no-embed", str(corpus)],
            env, timeout=300,
        )  # fmt: skip
        assert "succeeded" in out, out[-2000:]
        with psycopg.connect(db.dsn) as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM kb_passages WHERE org_id = %s", (org,)
            ).fetchone() or (0,)
        assert count > 0

        # --- 3. the second node dies under a running task; the run still ends ---------------
        # A run whose actor is alive and that has not ended yet; a run quicker than the state
        # API (seconds a look) ended before it could be caught: another one is started.
        for attempt in range(3):
            second_run = submit(f"Say hello again ({attempt}).")
            name = ActorKey.run(org, uuid.UUID(second_run)).name
            _wait(
                lambda name=name: any(
                    a["name"] == name and a["state"] in ("ALIVE", "DEAD")
                    for a in _state("actors", address, env)
                ),
                120,
                "the second run's actor",
            )
            if run_of(second_run)["status"] not in TERMINAL:
                break
        else:
            pytest.fail("three runs ended before the node could be killed under them")
        second.kill()
        killed = time.monotonic()
        ended = _wait(lambda: run_of(second_run)["status"] in TERMINAL and run_of(second_run),
                      400, "the run after its model node died")  # fmt: skip
        print(
            f"ended {time.monotonic() - killed:.0f} s after the kill: {ended['status']}, "
            f"{ended.get('error') or ended.get('result')!r}, {len(ended['steps'])} steps"
        )
        assert ended["status"] in TERMINAL
        dead = {n["node_id"]: n["state"] for n in _state("nodes", address, env)}
        assert dead[gpu_id] == "DEAD" and dead[head_id] == "ALIVE"
    finally:
        if client is not None:
            client.close()
        if second is not None:
            second.stop()
        head.stop()
