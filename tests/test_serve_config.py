"""The API deployed from its Serve config file (cluster/serve-cpu.yaml), the way Ray documents
config files (``serve run CONFIG``), on the test run's local Ray and embedded PostgreSQL.

The file's ``cortex-api`` application is deployed twice, under two names and route prefixes,
with the test's environment in its ``runtime_env`` (the database, a model server on
loopback, a namespace of its own): once as the file says (``CORTEX_SESSIONS__EXECUTOR``
``actors``) and once with ``in_process``. The model server holds every request until the
test lets it go, so the test can look at the cluster while a run is mid-step: with
``actors`` the run has its own session actor, found by its ``ActorKey`` name in the
session namespace; with ``in_process`` nothing of the actor layer exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from cortex_ray import Grant, Principal, Settings
from cortex_ray.storage import Database, Store

ray = pytest.importorskip("ray")

from actors import DIRECTORY_NAME, ActorKey  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "cluster" / "serve-cpu.yaml"
APP = "cortex-api"
TERMINAL = {"COMPLETED", "FAILED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- a chat-completions server on loopback that answers when the test says so --------------


class HeldModel:
    """OpenAI-compatible ``/v1/chat/completions``: each request waits for :meth:`release`,
    then the autonomous planner gets one ``finish`` candidate (and its score)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.requests = 0
        held = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                held.requests += 1
                held.released.wait(timeout=120)
                name = (body.get("response_format") or {}).get("json_schema", {}).get("name")
                if name == "proposals":
                    content = json.dumps(
                        {"candidates": [{"finish": True, "message": "done", "rationale": "r"}]}
                    )
                elif name == "scores":
                    content = json.dumps({"scores": [10]})
                else:
                    content = "ok"
                answer = json.dumps(
                    {
                        "id": "held",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "held"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def hold(self) -> None:
        self.released.clear()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


# --- the deployment -----------------------------------------------------------------------


@dataclass
class Deployed:
    url: str
    model: HeldModel
    namespaces: dict[str, str]  # route prefix → the session namespace of that app


def _apps_from_file(dsn: str, model_url: str, run_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file, validated by Serve's own schema, reduced to its API application
    twice (actors as the file says, then in_process) with the test's environment."""
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load(CONFIG.read_text())
    ServeDeploySchema.model_validate(raw)  # the file as shipped is a valid Serve config
    (api,) = [app for app in raw["applications"] if app["name"] == APP]
    assert api["import_path"] == "serve:app_builder"
    assert api["runtime_env"]["env_vars"]["CORTEX_SESSIONS__EXECUTOR"] == "actors"
    apps, namespaces = [], {}
    for suffix, prefix, executor in (("", "/", None), ("-inproc", "/inproc", "in_process")):
        env = dict(api["runtime_env"]["env_vars"])
        namespace = f"serve-config-{run_id}{suffix}"
        env.update(
            CORTEX_DATABASE_URL=dsn,
            CORTEX_MODEL_BACKEND="openai",
            CORTEX_MODEL_URL=model_url,
            CORTEX_EMBEDDING_BACKEND="hash",
            CORTEX_IMPORTANCE_SCORING="heuristic",
            CORTEX_CANDIDATES="1",
            CORTEX_SESSIONS__NAMESPACE=namespace,
            CORTEX_SESSIONS__RUN_RETRY_LIMIT="1",
            CORTEX_API__NUM_CPUS="0",  # two API apps on the test run's 2 CPUs
        )
        if executor is not None:
            env["CORTEX_SESSIONS__EXECUTOR"] = executor
        apps.append(
            {**api, "name": APP + suffix, "route_prefix": prefix, "runtime_env": {"env_vars": env}}
        )
        namespaces[prefix] = namespace
    config = {**raw, "applications": apps}
    ServeDeploySchema.model_validate(config)
    return config, namespaces


@pytest.fixture(scope="module")
def deployed(
    ray_cluster: Any, settings: Settings, db: Database, tmp_path_factory: Any
) -> Iterator[Deployed]:
    from ray import serve as ray_serve

    model = HeldModel()
    model.release()
    port = _free_port()
    config, namespaces = _apps_from_file(db.dsn, model.url, uuid.uuid4().hex[:8])
    config["http_options"] = {**config.get("http_options", {}), "port": port}
    path = tmp_path_factory.mktemp("serve-config") / "serve-cpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    ray_serve.shutdown()  # a Serve left by another module would keep its own port
    # `serve run CONFIG` (Ray's CLI, as docs/actors.md says to run the file): it connects to
    # this test run's cluster by its address and returns once the config is submitted.
    cli = Path(sys.executable).with_name("serve")
    done = subprocess.run(
        [
            str(cli),
            "run",
            "--non-blocking",
            "--address",
            ray_cluster.address_info["gcs_address"],
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_ADDRESS": ray_cluster.address_info["gcs_address"]},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        ready = {"/": False, "/inproc": False}
        while not all(ready.values()):
            for prefix in ready:
                try:
                    base = "" if prefix == "/" else prefix
                    ready[prefix] = httpx2.get(f"{url}{base}/healthz", timeout=5).status_code == 200
                except httpx2.HTTPError:
                    pass
            if time.monotonic() > deadline:
                status = ray_serve.status()
                pytest.fail(f"the API from {CONFIG.name} did not come up: {status}")
            time.sleep(0.5)
        yield Deployed(url, model, namespaces)
    finally:
        model.close()
        ray_serve.shutdown()
        for namespace in namespaces.values():
            with contextlib.suppress(ValueError):  # in_process: no directory
                ray.kill(ray.get_actor(DIRECTORY_NAME, namespace=namespace))


async def _tenant(store: Store, org: str) -> dict[str, str]:
    await store.ensure_org(org)
    admin = Principal(id="admin", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"})))
    key, _ = await store.create_api_key(admin, "serve-config test")
    return {"Authorization": f"Bearer {key}"}


def _named(name: str, namespace: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


async def _submit(client: httpx2.AsyncClient, base: str, org: str, auth: dict[str, str]) -> str:
    agent = await client.post(
        f"{base}/api/orgs/{org}/agents",
        json={"name": "planner", "mode": "AUTONOMOUS", "persona": "Finish at once."},
        headers=auth,
    )
    assert agent.status_code == 201, agent.text
    created = await client.post(
        f"{base}/api/orgs/{org}/tasks",
        json={
            "name": "from the config file",
            "agentId": agent.json()["id"],
            "assigneeKind": "AGENT",
            "payload": {"goal": "say done", "maxSteps": 2},
        },
        headers=auth,
    )
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


async def _wait_until(check: Any, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.1)
    return None


async def _terminal(client: httpx2.AsyncClient, path: str, auth: dict[str, str]) -> dict[str, Any]:
    run: dict[str, Any] = {}
    for _ in range(20):
        run = (await client.get(path, params={"wait": 20}, headers=auth)).json()
        if run["status"] in TERMINAL:
            return run
    pytest.fail(f"the run did not end: {run}")


async def test_config_file_runs_tasks_in_session_actors(
    deployed: Deployed, store: Store, org: str
) -> None:
    auth = await _tenant(store, org)
    namespace = deployed.namespaces["/"]
    deployed.model.hold()  # the run's first model call waits: its actor is live meanwhile
    try:
        async with httpx2.AsyncClient(base_url=deployed.url, timeout=60) as client:
            run_id = await _submit(client, "", org, auth)
            name = ActorKey.run(org, uuid.UUID(run_id)).name
            actor = await _wait_until(lambda: _named(name, namespace))
            assert actor is not None, f"no actor {name!r} in namespace {namespace!r}"
            # Its own process, supervised by the namespace's directory.
            assert await actor.pid.remote() != os.getpid()
            directory = ray.get_actor(DIRECTORY_NAME, namespace=namespace)
            assert name in await directory.watched_runs.remote()
            # The actor is inside its first step, waiting on the model.
            assert await _wait_until(lambda: deployed.model.requests >= 1)
            deployed.model.release()
            run = await _terminal(client, f"/api/orgs/{org}/tasks/{run_id}", auth)
    finally:
        deployed.model.release()
    assert run["status"] == "COMPLETED", run
    assert run["result"] == "done"
    # The actor ended with its run: the name is free again.
    assert await _wait_until(lambda: _named(name, namespace) is None, within=30)


async def test_config_file_with_in_process_executor(
    deployed: Deployed, store: Store, org: str
) -> None:
    auth = await _tenant(store, org)
    namespace = deployed.namespaces["/inproc"]
    deployed.model.hold()
    try:
        async with httpx2.AsyncClient(base_url=deployed.url, timeout=60) as client:
            before = deployed.model.requests
            run_id = await _submit(client, "/inproc", org, auth)
            # Mid-step (the model holds the call), and no actor of this namespace exists.
            assert await _wait_until(lambda: deployed.model.requests > before)
            assert _named(ActorKey.run(org, uuid.UUID(run_id)).name, namespace) is None
            assert _named(DIRECTORY_NAME, namespace) is None
            deployed.model.release()
            run = await _terminal(client, f"/inproc/api/orgs/{org}/tasks/{run_id}", auth)
    finally:
        deployed.model.release()
    assert run["status"] == "COMPLETED", run
    assert run["result"] == "done"


@pytest.mark.parametrize("name", ["serve-cpu.yaml", "serve-gpu.yaml"])
def test_model_serving_configs_set_capacity_and_guards(name: str) -> None:
    """Every config file's model app validates with its capacity and guard fields, and a
    file whose proxy binds beyond loopback never leaves the model routes open."""
    import ipaddress

    from ray.serve.schema import ServeDeploySchema

    from serve.models import ModelServingConfig

    raw = yaml.safe_load((CONFIG.parent / name).read_text())
    schema = ServeDeploySchema.model_validate(raw)
    (models,) = [app for app in schema.applications if app.import_path == "serve.models:build_app"]
    config = ModelServingConfig.model_validate(models.args)
    host = raw["http_options"]["host"]
    loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    ingress = models.args["ingress"]
    assert "require_keys" in ingress  # said in the file, not left to a default
    assert {"max_body_bytes", "max_concurrent_per_key"} <= set(ingress)
    if not loopback:
        assert config.ingress.require_keys is True, f"{name} binds {host} with open model routes"
    assert config.llm is not None
    if config.llm.backend == "llama_cpp":
        assert config.llm.max_ongoing_requests > 1 + config.llm.max_waiting
        if name == "serve-cpu.yaml":
            scaling = config.llm.deployment.autoscaling_config
            assert scaling is not None and scaling["min_replicas"] <= scaling["max_replicas"]
            assert "target_ongoing_requests" in scaling
    else:
        deployment = (config.llm.vllm or {})["deployment_config"]
        assert deployment["max_ongoing_requests"] >= 1
        assert deployment["max_queued_requests"] >= 1
        assert deployment["autoscaling_config"]["max_replicas"] >= 1
