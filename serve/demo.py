"""The main job on the embedded default: the whole local stack, and one task through the API.

    python -m serve.demo [GOAL] [--max-steps N] [--port 8000] [--keep-running]
                         [--in-process-models]

Starts the embedded PostgreSQL, a local Ray, the model-serving app (SmolLM2 and MiniLM, once,
at 127.0.0.1:8000/models/v1) and the HTTP API on Ray Serve (127.0.0.1:8000, runs driven by
session actors that reach the models through deployment handles), creates an organisation,
an admin API key and an autonomous agent, submits a task over HTTP, follows it to its
terminal state, prints the step log, and prints the curl commands that do the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from typing import Any

import httpx2 as httpx
import ray
from ray import serve as ray_serve

from cortex_ray import AgentMode, NotFoundError, Runtime, Settings, load_settings
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import HashEmbedder
from serve._deployment import run_local

ORG = "demo"
AGENT = "demo-agent"
PERSONA = "You are a careful assistant. Use your tools, then finish with a short answer."
GOAL = (
    "Find out the current date and time, remember it as a fact, and finish with a "
    "one-sentence answer."
)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _prepare(settings: Settings) -> tuple[str, str]:
    """The demo's admin key and agent, through the core's use cases as the local operator
    (no model needed): what ``cortex-ray api-keys create`` and ``agents create`` do."""
    runtime = await Runtime.open(settings, model=None, embedder=HashEmbedder(EMBEDDING_DIM))
    try:
        created = await runtime.create_api_key(
            ORG, "demo-admin", name="demo", admin=True, grant=["*"]
        )
        try:
            agent = await runtime.get_agent(ORG, AGENT)
        except NotFoundError:
            agent = await runtime.create_agent(
                ORG, AGENT, persona=PERSONA, mode=AgentMode.AUTONOMOUS
            )
        return created.key, str(agent.id)
    finally:
        await runtime.close()


def _print_run(run: dict[str, Any]) -> None:
    print(f"\nrun {run['id']}: {run['status']}")
    for step in run.get("steps", []):
        action = step.get("action") or {}
        obs = step.get("observation") or {}
        scores = ", ".join(
            f"{'*' if c.get('index') == step.get('selected') else ''}"
            f"{c.get('tool') or 'finish'}={c.get('score')}"
            for c in step.get("candidates", [])
        )
        what = action.get("tool") or step.get("decision")
        summary = (obs.get("summary") or step.get("message") or "")[:100]
        print(
            f"  {step['index'] + 1}. {what} [{step.get('actionCategory') or '-'}] "
            f"{obs.get('status', '')} {summary}  ({scores})"
        )
    print(f"result: {run.get('result')}\nreason: {run.get('reason')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("goal", nargs="?", default=GOAL)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keep-running", action="store_true", help="serve until Ctrl-C")
    parser.add_argument(
        "--in-process-models",
        action="store_true",
        help="load the models in every session actor instead of serving them once",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    # Session actors drive the runs: the default executor (CORTEX_SESSIONS__EXECUTOR=actors).
    settings = load_settings()
    _say("==> starting a local Ray, the embedded PostgreSQL and the API on Ray Serve…")
    started = time.perf_counter()
    # The stack reserves 1.5 logical CPUs (API 0.5, embedder 0.5, LLM 0.5; actors none):
    # a 1-core machine still gets 2 so that it starts, and simply runs slower.
    ray.init(num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    api = run_local(
        settings,
        options=settings.api.model_copy(update={"port": args.port}),
        serve_models=not args.in_process_models,
    )
    try:
        stack_settings = settings.model_copy(update={"database_url": _dsn(api, settings)})
        key, agent_id = asyncio.run(_prepare(stack_settings))
        _say(f"==> API ready at {api.url} in {time.perf_counter() - started:.1f} s")
        if api.models is not None:
            _say(
                f"==> models served once for every session actor: {api.models.openai_base_url}"
                f" (chat: {api.settings.model_backend if api.settings else '?'}, embeddings: "
                f"{api.settings.embedding_backend if api.settings else '?'})"
            )
        headers = {"Authorization": f"Bearer {key}"}
        body = {
            "name": "demo",
            "agentId": agent_id,
            "assigneeKind": "AGENT",
            "payload": {"goal": args.goal, "maxSteps": args.max_steps},
        }
        with httpx.Client(base_url=api.url, headers=headers, timeout=120) as client:
            created = client.post(f"/api/orgs/{ORG}/tasks", json=body)
            created.raise_for_status()
            task_id = created.json()["id"]
            _say(f"==> task {task_id} accepted ({created.status_code}); following it…")
            run: dict[str, Any] = {}
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                run = client.get(f"/api/orgs/{ORG}/tasks/{task_id}", params={"wait": 20}).json()
                _say(f"    {run['status']}: {len(run.get('steps', []))} steps")
                if run["status"] != "RUNNING":
                    break
        _print_run(run)
        _print_curl(api.url, key, agent_id, args.goal)
        if args.keep_running:
            _say("==> serving until Ctrl-C")
            while True:
                time.sleep(3600)
        # The job did its work whether the agent met its goal or not; a run that never
        # reached a terminal state is the job's failure.
        return 0 if run.get("status") in ("COMPLETED", "FAILED") else 1
    except KeyboardInterrupt:
        return 130
    finally:
        api.stop()
        ray_serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


def _dsn(api: Any, settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    assert api.embedded is not None
    return str(api.embedded.dsn)


def _print_curl(url: str, key: str, agent_id: str, goal: str) -> None:
    body = json.dumps(
        {"name": "again", "agentId": agent_id, "assigneeKind": "AGENT",
         "payload": {"goal": goal, "maxSteps": 4}}
    )  # fmt: skip
    auth = shlex.quote(f"Authorization: Bearer {key}")
    print(
        "\nThe same over HTTP (while the API runs, e.g. with --keep-running):\n"
        f"  curl -s -X POST {url}/api/orgs/{ORG}/tasks -H {auth} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}\n"
        f"  curl -s {url}/api/orgs/{ORG}/tasks/<task-id>?wait=30 -H {auth}\n"
        f"  curl -s {url}/api/orgs/{ORG}/agents -H {auth}"
    )


if __name__ == "__main__":
    sys.exit(main())
