"""The README's main job (`./dev run` → `python -m serve.demo`): the whole local stack, one
task through the HTTP API, the step log and the curl commands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def test_the_main_job_runs_a_task_through_the_api_on_ray_serve() -> None:
    data = Path(tempfile.mkdtemp(prefix="cortex-ray-demo-", dir="/tmp"))
    try:
        env = {
            **os.environ,
            "CORTEX_DATA_DIR": str(data),
            # No chat model: the run ends FAILED at once with its reason, which keeps this
            # fast; chat through the LLM deployment is covered by test_model_serving. The
            # embedder is served, as by default: the API replica and the session actor
            # reach it through handles.
            "CORTEX_MODEL_BACKEND": "none",
            "HF_HUB_OFFLINE": "1",
        }
        env.pop("CORTEX_DATABASE_URL", None)
        done = subprocess.run(
            [sys.executable, "-m", "serve.demo", "--max-steps", "2", "--port", "8017"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # The task ended FAILED (no model): the demo says so with exit code 3, as
        # ``cortex-ray run`` does.
        assert done.returncode == 3, done.stderr[-3000:]
        assert "API ready at http://127.0.0.1:8017" in done.stderr
        assert (
            "models served once for every session actor: http://127.0.0.1:8017/models/v1 "
            "(chat: none, embeddings: served)" in done.stderr
        )
        assert re.search(r"task [0-9a-f-]{36} accepted \(202\)", done.stderr)
        assert re.search(r"run [0-9a-f-]{36}: FAILED", done.stdout)
        assert "reason: no model configured" in done.stdout
        assert "curl -s -X POST http://127.0.0.1:8017/api/orgs/demo/tasks" in done.stdout
        assert "Authorization: Bearer crx_" in done.stdout
        # The follow-up commands name this task by its id.
        task_id = re.search(r"task ([0-9a-f-]{36}) accepted", done.stderr)
        assert task_id is not None
        assert f"http://127.0.0.1:8017/api/orgs/demo/tasks/{task_id[1]}?wait=30" in done.stdout
        assert f"cortex-ray --org demo runs show {task_id[1]}" in done.stdout
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_the_local_stack_shows_its_actors_and_ingestion_joins_its_ray(tmp_path: Path) -> None:
    """``python -m serve`` starts Ray with its dashboard on 127.0.0.1, so ``ray list actors``
    answers; ``cortex-ray ingest`` on the same machine joins that Ray (announced in the data
    dir) instead of starting a second one; the announcement goes when the stack stops."""
    import json
    import signal
    import time

    data = tmp_path / "data"
    env = {
        **os.environ,
        "CORTEX_DATA_DIR": str(data),
        "CORTEX_MODEL_BACKEND": "none",
        "CORTEX_EMBEDDING_BACKEND": "hash",
        "CORTEX_API__PORT": "8019",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("CORTEX_DATABASE_URL", None)
    env.pop("RAY_ADDRESS", None)
    # A user's shell: no RAY_AUTH_MODE (a Ray started in this process sets it here).
    env.pop("RAY_AUTH_MODE", None)
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 240
        while "Ray dashboard on http://127.0.0.1:" not in (
            out := (tmp_path / "serve.log").read_text()
        ):
            assert server.poll() is None and time.monotonic() < deadline, out[-3000:]
            time.sleep(0.5)
        dashboard = re.search(r"Ray dashboard on (http://127\.0\.0\.1:\d+)", out)
        assert dashboard is not None
        # Not a terminal: clean lines (Ray's worker prefixes uncoloured, no dedup hints).
        assert "\x1b[" not in out, out[-3000:]
        assert "RAY_DEDUP_LOGS" not in out and "repeated" not in out, out[-3000:]
        assert (data / "ray-address").exists()

        ray_cli = str(Path(sys.executable).with_name("ray"))
        listed = subprocess.run(
            [ray_cli, "list", "actors", "--address", dashboard[1], "--format", "json",
             "--limit", "1000"],
            # the CLI sends ~/.ray/auth_token only in token mode (docs/actors.md)
            env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr[-2000:]
        classes = {a.get("class_name") for a in json.loads(listed.stdout)}
        assert "ServeController" in classes, classes

        corpus = tmp_path / "corpus"
        corpus.mkdir()
        (corpus / "guide.md").write_text("# Guide\n\nRun the installer.\n")
        ingest = subprocess.run(
            [str(Path(sys.executable).with_name("cortex-ray")), "--org", "demo", "ingest",
             "handbook", str(corpus), "--no-embed"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        address = (data / "ray-address").read_text().strip()
        assert f"==> joining the Ray at {address}" in ingest.stderr
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
            log.close()
    assert not (data / "ray-address").exists()
