"""The main job on the embedded default: the whole local stack, and one task through the API.

    python -m serve.demo [GOAL] [--max-steps N] [--port 8000] [--keep-running]
                         [--in-process-models]

Starts the embedded PostgreSQL, a local Ray, the model-serving app (the packaged chat model
named by CORTEX_MODEL_NAME, Qwen2.5-Coder-1.5B-Instruct by default, and MiniLM, once, at
127.0.0.1:8000/models/v1) and the HTTP API on Ray Serve (127.0.0.1:8000, runs driven by
session actors that reach the models through deployment handles), creates an organisation,
an admin API key and an autonomous agent (with the tools its goal needs: current_time and
remember_fact), submits a task over HTTP, follows it to its
terminal state, prints the step log, and prints the commands that do the same or look at
this task again (with its id).

Exit codes: 0 the task COMPLETED; 3 it ended FAILED, 5 CANCELLED (as ``cortex-ray run``); 1
it reached no terminal state, or the stack did not start; 130 or 143 interrupted by SIGINT or
SIGTERM before the task ended. With ``--keep-running`` it then serves until SIGINT or SIGTERM
(also SIGINT ignored at start, as in a background job) and exits with the task's code once the
apps are deleted, the embedded PostgreSQL is stopped and its Ray is shut down; a second signal
exits at once. See docs/operations.md, "Stopping".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any

import httpx2 as httpx

from cortex_ray import (
    AgentChanges,
    AgentMode,
    Grant,
    NotFoundError,
    Runtime,
    Settings,
    load_settings,
    run_stoppable,
)
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import HashEmbedder
from serve._deployment import run_local
from serve._lifecycle import Interrupted, ray_driver

ORG = "demo"
AGENT = "demo-agent"
PERSONA = "You are a careful assistant. Use your tools, then finish with a short answer."
GOAL = (
    "Find out the current date and time, remember it as a fact, and finish with a "
    "one-sentence answer."
)

# The tools its goal needs, as an operator would grant them: with every built-in, the default
# model spent its steps on memory_search and propose_procedural_edit (docs/benchmarks.md,
# "Agent benchmark: whole tasks").
TOOLS = ("current_time", "remember_fact")

EXIT_COMPLETED = 0
EXIT_ERROR = 1
EXIT_FAILED = 3
EXIT_CANCELLED = 5


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
                ORG, AGENT, persona=PERSONA, mode=AgentMode.AUTONOMOUS, tools=TOOLS
            )
        if agent.tools != TOOLS:  # a data dir from an earlier version: the same agent
            agent = await runtime.update_agent(
                ORG, agent.id, AgentChanges(tools=TOOLS, grant=Grant(tools=frozenset(TOOLS)))
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
        if step.get("note"):
            print(f"       note: {step['note']}")
    print(f"result: {run.get('result')}\nreason: {run.get('reason')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("goal", nargs="?", default=GOAL)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keep-running", action="store_true", help="serve until Ctrl-C or SIGTERM")
    parser.add_argument(
        "--in-process-models",
        action="store_true",
        help="load the models in every session actor instead of serving them once",
    )
    parser.add_argument(
        "--no-dashboard",
        action="store_true",
        help="start Ray without its dashboard (saves ~0.25 GB and ~2 s)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    # Session actors drive the runs: the default executor (CORTEX_SESSIONS__EXECUTOR=actors).
    settings = load_settings()
    _say("==> starting a local Ray, the embedded PostgreSQL and the API on Ray Serve…")
    started = time.perf_counter()
    outcome: int | None = None  # the task's exit code, once it has ended
    try:
        # The stack reserves 1.5 logical CPUs (API 0.5, embedder 0.5, LLM 0.5; actors none):
        # a 1-core machine still gets 2 so that it starts, and simply runs slower.
        with ray_driver(
            num_cpus=max(2, os.cpu_count() or 1),
            include_dashboard=not args.no_dashboard,
            log_to_driver=False,
            announce=settings.storage.data_dir,  # `cortex-ray ingest` joins this Ray meanwhile
        ) as driver:
            api = run_local(
                settings,
                options=settings.api.model_copy(update={"port": args.port}),
                serve_models=not args.in_process_models,
            )
            driver.callback(api.stop)  # the apps, then the embedded PostgreSQL
            stack_settings = settings.model_copy(update={"database_url": _dsn(api, settings)})
            key, agent_id = run_stoppable(_prepare(stack_settings), guard=driver.guard)
            _say(f"==> API ready at {api.url} in {time.perf_counter() - started:.1f} s")
            if driver.dashboard_url:
                _say(
                    f"==> Ray dashboard (actors per org/agent/session, Serve apps, jobs): "
                    f"{driver.dashboard_url}"
                )
            if api.models is not None:
                _say(
                    f"==> models served once for every session actor: "
                    f"{api.models.openai_base_url} (chat: "
                    f"{api.settings.models.backend if api.settings else '?'}, embeddings: "
                    f"{api.settings.embeddings.backend if api.settings else '?'})"
                )
            task_started = time.perf_counter()
            task_id, run = _follow_task(api.url, key, agent_id, args.goal, args.max_steps)
            _print_run(run)
            _say(
                f"==> task {run.get('status')} in {time.perf_counter() - task_started:.1f} s "
                f"({len(run.get('steps', []))} steps, model {settings.models.name}); the whole "
                f"demo took {time.perf_counter() - started:.1f} s"
            )
            _print_commands(api.url, key, agent_id, args.goal, task_id)
            outcome = _exit_code(run)
            if args.keep_running:
                _say("==> serving until Ctrl-C or SIGTERM")
                driver.wait()
            return outcome
    except Interrupted as exc:
        _say(f"==> {exc}: stopped")
        return exc.exit_code if outcome is None else outcome
    except KeyboardInterrupt:  # before the handlers were installed
        return 130


def _follow_task(
    url: str, key: str, agent_id: str, goal: str, max_steps: int
) -> tuple[str, dict[str, Any]]:
    """Submit the task over HTTP and long-poll it to a terminal state (or 15 minutes)."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "name": "demo",
        "agentId": agent_id,
        "assigneeKind": "AGENT",
        "payload": {"goal": goal, "maxSteps": max_steps},
    }
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        created = client.post(f"/api/orgs/{ORG}/tasks", json=body)
        created.raise_for_status()
        task_id = str(created.json()["id"])
        _say(f"==> task {task_id} accepted ({created.status_code}); following it…")
        run: dict[str, Any] = {}
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            run = client.get(f"/api/orgs/{ORG}/tasks/{task_id}", params={"wait": 20}).json()
            _say(f"    {run['status']}: {len(run.get('steps', []))} steps")
            if run["status"] != "RUNNING":
                break
    return task_id, run


def _exit_code(run: dict[str, Any]) -> int:
    """0 COMPLETED, 3 FAILED (the agent did not meet its goal), 5 CANCELLED (a person stopped
    it), 1 no terminal state."""
    return {"COMPLETED": EXIT_COMPLETED, "FAILED": EXIT_FAILED, "CANCELLED": EXIT_CANCELLED}.get(
        str(run.get("status")), EXIT_ERROR
    )


def _dsn(api: Any, settings: Settings) -> str:
    if settings.storage.database_url:
        return settings.storage.database_url
    assert api.embedded is not None
    return str(api.embedded.dsn)


def _print_commands(url: str, key: str, agent_id: str, goal: str, task_id: str) -> None:
    """The same over HTTP, and this task again (over HTTP and with the CLI), by its real id."""
    body = json.dumps(
        {"name": "again", "agentId": agent_id, "assigneeKind": "AGENT",
         "payload": {"goal": goal, "maxSteps": 4}}
    )  # fmt: skip
    auth = shlex.quote(f"Authorization: Bearer {key}")
    task_url = shlex.quote(f"{url}/api/orgs/{ORG}/tasks/{task_id}?wait=30")
    print(
        "\nThe same over HTTP (while the API runs, e.g. with --keep-running):\n"
        f"  curl -s -X POST {url}/api/orgs/{ORG}/tasks -H {auth} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}\n"
        f"  curl -s {task_url} -H {auth}\n"
        f"  curl -s {url}/api/orgs/{ORG}/agents -H {auth}\n"
        "This task's step log from the command line (same CORTEX_* settings):\n"
        f"  cortex-ray --org {ORG} runs show {task_id}"
    )


if __name__ == "__main__":
    sys.exit(main())
