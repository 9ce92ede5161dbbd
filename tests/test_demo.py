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
