"""API load (issue 3): N concurrent loopback clients running tasks through the HTTP API on
Ray Serve, against the in-process core in the same run.

API    ``POST /api/orgs/{org}/tasks`` then ``GET .../tasks/{id}?wait=30`` (a long poll that
       answers when the run ends), over HTTP on 127.0.0.1 through Serve's proxy to the API
       replica (``serve.build_api``, the default ``InProcessExecutor``: the run is driven in
       the replica). A task's latency is POST sent → terminal status received.
CORE   ``Runtime.run_autonomous`` in this process on the same database.

Both use a zero-latency ``ScriptedModelClient`` (a bench tool ``tick(n)`` every step, with
a new argument each so that no call repeats, a finish at the last), the ``HashEmbedder``
and the ``HeuristicImportanceScorer``, so the numbers are the runtime's and the API's own
cost. Per-step latency = task latency / steps. Two phases, each
warmed up: sequential (one task at a time; API and core interleaved in rounds so drift
cancels), then concurrent (N clients, each running tasks back to back; then N concurrent
core runs). Target: API per-step ≤ 1.3 × core per-step + 5 ms; errors 0.

Run: ``.venv/bin/python bench/api_load.py [--clients 8] [--tasks 160] [--steps 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2
import ray
from _scratch import scratch_data_dir
from ray import serve as ray_serve

from cortex_ray import (
    AgentMode,
    Grant,
    Principal,
    RunStatus,
    Runtime,
    Settings,
    reclaim_signals,
    run_main,
    run_stoppable,
)
from cortex_ray.act import Tool, ToolContext
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import ChatRequest, HashEmbedder, ScriptedModelClient
from serve import ApiOptions, build_api

RATIO, SLACK_MS = 1.3, 5.0
APP = "cortex-api-bench"

# --- the zero-latency model (pickled by value into the replica: this is __main__) -------

_STEP = re.compile(r"Step (\d+) of (\d+)\.")


def _act(step: int) -> str:
    # A new argument each step: a call made again with the same arguments is a repeat to
    # the planner (it would ask for the answer, and end a run of repeats).
    return json.dumps({"candidates": [{"tool": "tick", "args": {"n": step}, "rationale": "r"}]})


async def _tick(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"n": args["n"], "utc": datetime.now(UTC).isoformat(timespec="seconds")}


TICK = Tool(
    name="tick",
    description="Count a step and read the clock.",
    handler=_tick,
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
    idempotent=True,
)
_FINISH = json.dumps({"candidates": [{"finish": True, "message": "It is now.", "rationale": "ok"}]})


def respond(request: ChatRequest) -> str:
    props = (request.response_schema or {}).get("properties", {})
    if "candidates" in props:
        for message in reversed(request.messages):
            found = _STEP.search(message.content or "") if message.role == "user" else None
            if found:
                return _FINISH if int(found[1]) >= int(found[2]) else _act(int(found[1]))
        return _act(0)
    if "scores" in props:
        return json.dumps({"scores": [5] * int(props["scores"].get("maxItems", 1))})
    if "best" in props:
        listed = props["best"]["enum"]
        return json.dumps({"assessments": ["ok"] * len(listed), "best": listed[0]})
    if "importance" in props:
        return json.dumps({"importance": 5})
    raise ValueError(f"unexpected request schema {request.schema_name!r}")


async def open_runtime(settings: Settings) -> Runtime:
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=respond, name="zero-latency"),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[TICK],
    )


# --- measurement ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass
class Sample:
    """Tasks of one kind: latencies (s), server-side run times (s), errors."""

    latencies: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0

    def per_step_ms(self, steps: int) -> list[float]:
        return [t / steps * 1000 for t in self.latencies]


@dataclass
class Target:
    client: httpx2.AsyncClient
    runtime: Runtime
    org: str
    agent: str
    steps: int


async def api_task(t: Target, sample: Sample) -> None:
    started = time.perf_counter()
    try:
        r = await t.client.post(
            f"/api/orgs/{t.org}/tasks",
            json={
                "name": "load",
                "agentId": t.agent,
                "assigneeKind": "AGENT",
                "payload": {"goal": "Report the current time.", "maxSteps": t.steps},
            },
        )
        if r.status_code != 202:
            sample.errors.append(f"POST {r.status_code}: {r.text[:120]}")
            return
        location = r.json()["location"]
        while True:
            r = await t.client.get(location, params={"wait": 30})
            if r.status_code != 200:
                sample.errors.append(f"GET {r.status_code}: {r.text[:120]}")
                return
            body = r.json()
            if body["status"] != "RUNNING":
                break
    except httpx2.HTTPError as exc:
        sample.errors.append(f"{type(exc).__name__}: {exc}")
        return
    elapsed = time.perf_counter() - started
    if body["status"] != RunStatus.COMPLETED.value or len(body["steps"]) != t.steps:
        sample.errors.append(f"run {body['id']} {body['status']} after {len(body['steps'])}")
        return
    sample.latencies.append(elapsed)
    created = datetime.fromisoformat(body["createdAt"])
    finished = datetime.fromisoformat(body["finishedAt"])
    sample.server.append((finished - created).total_seconds())


async def core_task(t: Target, sample: Sample) -> None:
    started = time.perf_counter()
    try:
        run = await t.runtime.run_autonomous(
            t.org, t.agent, "Report the current time.", max_steps=t.steps, name="load"
        )
    except Exception as exc:
        sample.errors.append(f"{type(exc).__name__}: {exc}")
        return
    elapsed = time.perf_counter() - started
    if run.status is not RunStatus.COMPLETED or len(run.steps) != t.steps:
        sample.errors.append(f"run {run.id} {run.status.value} after {len(run.steps)}")
        return
    sample.latencies.append(elapsed)
    assert run.finished_at is not None
    sample.server.append((run.finished_at - run.created_at).total_seconds())


async def concurrently(kind: Any, t: Target, workers: int, total: int) -> Sample:
    """``workers`` loops running ``total`` tasks between them, back to back."""
    sample = Sample()
    left = iter(range(total))

    async def worker() -> None:
        for _ in left:
            await kind(t, sample)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    sample.wall = time.perf_counter() - started
    return sample


# --- the benchmark --------------------------------------------------------------------------


async def bench(args: argparse.Namespace, data_dir: Path) -> int:
    steps, clients = args.steps, args.clients
    settings = Settings(
        data_dir=data_dir,
        database_url=args.database_url,
        model_backend="none",
        embedding_backend="hash",
        importance_scoring="heuristic",
        max_steps_limit=max(64, steps),
        pool_max_size=max(8, clients),
    )
    runtime = await open_runtime(settings)
    replica_settings = settings.model_copy(update={"database_url": runtime.db.dsn})
    try:
        org = f"bench-{uuid.uuid4().hex[:10]}"
        admin = Principal(
            id="bench", org_id=org, is_admin=True, grant=Grant(tools=frozenset({"*"}))
        )
        key, _ = await runtime.store.create_api_key(admin, "api_load")
        agent = await runtime.create_agent(
            org,
            "load-worker",
            mode=AgentMode.AUTONOMOUS,
            tools=[
                "current_time",
                "memory_search",
                "remember_fact",
                "propose_procedural_edit",
                "tick",
            ],
        )

        t0 = time.perf_counter()
        ray.init(
            num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="cortex-ray-bench"
        )
        reclaim_signals()  # ray.init replaced SIGTERM's handler
        ray_serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        options = ApiOptions(port=args.port, max_ongoing_requests=max(100, 4 * clients))
        factory = functools.partial(open_runtime, replica_settings)
        ray_serve.run(build_api(factory, options=options), name=APP, route_prefix="/")
        startup = time.perf_counter() - t0

        limits = httpx2.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{args.port}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
            limits=limits,
        ) as client:
            t = Target(client, runtime, org, str(agent.id), steps)
            for _ in range(args.warmup):
                await api_task(t, Sample())
                await core_task(t, Sample())

            # Sequential, interleaved in rounds.
            api_seq, core_seq = Sample(), Sample()
            rounds = 5
            per_round = max(1, args.sequential // rounds)
            for r in range(rounds):
                order = (api_task, core_task) if r % 2 == 0 else (core_task, api_task)
                for kind in order:
                    sample = api_seq if kind is api_task else core_seq
                    for _ in range(per_round):
                        await kind(t, sample)

            # Concurrent: N clients, then N concurrent core runs (warmed up at that load).
            await concurrently(api_task, t, clients, clients)
            api_conc = await concurrently(api_task, t, clients, args.tasks)
            await concurrently(core_task, t, clients, clients)
            core_conc = await concurrently(core_task, t, clients, args.tasks)
        report(args, settings, startup, api_seq, core_seq, api_conc, core_conc)
        ok = all(
            target_met(api, core, steps)
            for api, core in ((api_seq, core_seq), (api_conc, core_conc))
        )
        errors = sum(len(s.errors) for s in (api_seq, core_seq, api_conc, core_conc))
        return 0 if (ok and errors == 0) or not args.check else 1
    finally:
        if ray.is_initialized():
            ray_serve.shutdown()
            ray.shutdown()
        await runtime.close()


def target_met(api: Sample, core: Sample, steps: int) -> bool:
    if not api.latencies or not core.latencies:
        return False
    a = statistics.median(api.per_step_ms(steps))
    c = statistics.median(core.per_step_ms(steps))
    return a <= RATIO * c + SLACK_MS


def report(
    args: argparse.Namespace,
    settings: Settings,
    startup: float,
    api_seq: Sample,
    core_seq: Sample,
    api_conc: Sample,
    core_conc: Sample,
) -> None:
    steps = args.steps
    where = "configured DSN" if args.database_url else "embedded"
    print(
        f"API load: {args.clients} concurrent loopback clients, {args.tasks} tasks per "
        f"concurrent phase, {args.sequential} sequential tasks of each kind, {steps} steps/task"
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; ray {ray.__version__} "
        f"(num_cpus=2), Serve proxy on 127.0.0.1:{args.port}, 1 API replica with the "
        f"InProcessExecutor; PostgreSQL {where}; model: ScriptedModelClient (zero latency); "
        f"embedder: HashEmbedder(384); importance: heuristic"
    )
    niceness = os.environ.get("RAY_worker_niceness", "15 (Ray's default)")  # noqa: SIM112
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Ray worker niceness {niceness}; load average at the end {load}")
    print(f"start-up (ray.init + serve.run, replica opens its runtime): {startup:.1f} s")
    print()
    header = (
        f"{'':44}{'tasks':>6}{'errors':>7}{'tasks/s':>9}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'ms/step p50':>12}{'ms/step p95':>12}"
    )
    for title, pairs in (
        ("sequential (one task at a time, interleaved)", (("API", api_seq), ("core", core_seq))),
        (f"concurrent ({args.clients} at a time)", (("API", api_conc), ("core", core_conc))),
    ):
        print(title)
        print(header)
        for label, s in pairs:
            name = (
                "API: POST + GET ?wait over HTTP"
                if label == "API"
                else "core: Runtime.run_autonomous in-process"
            )
            if not s.latencies:
                print(f"  {name:42}{0:>6}{len(s.errors):>7}")
                continue
            ms = [x * 1000 for x in s.latencies]
            rate = len(ms) / (s.wall or sum(s.latencies))
            per = s.per_step_ms(steps)
            print(
                f"  {name:42}{len(ms):>6}{len(s.errors):>7}{rate:>9.1f}"
                f"{statistics.median(ms):>9.1f}{percentile(ms, 95):>9.1f}"
                f"{statistics.median(per):>12.2f}{percentile(per, 95):>12.2f}"
            )
        api, core = pairs[0][1], pairs[1][1]
        if api.latencies and core.latencies:
            a = statistics.median(api.per_step_ms(steps))
            c = statistics.median(core.per_step_ms(steps))
            limit = RATIO * c + SLACK_MS
            verdict = "PASS" if a <= limit else "FAIL"
            server = statistics.median(api.server) / steps * 1000
            print(
                f"  API/core per step (medians): {a:.2f} / {c:.2f} ms = {a / c:.2f}×; "
                f"target ≤ {RATIO}× + {SLACK_MS:g} ms = {limit:.2f} ms: {verdict}"
            )
            print(
                f"  API runs inside the replica (created → finished, server clock): "
                f"{server:.2f} ms/step; the rest is HTTP, the proxy and the polls"
            )
        for s in pairs:
            for error in s[1].errors[:5]:
                print(f"  error ({s[0]}): {error}")
        print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (N)")
    parser.add_argument("--tasks", type=int, default=160, help="tasks per concurrent phase")
    parser.add_argument("--sequential", type=int, default=40, help="sequential tasks per kind")
    parser.add_argument("--steps", type=int, default=8, help="steps per task (max_steps)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up tasks of each kind")
    parser.add_argument("--port", type=int, default=8711, help="Serve's HTTP port (loopback)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="embedded PostgreSQL folder (default: a fresh one under /tmp, removed afterwards)",
    )
    parser.add_argument("--database-url", default=None, help="use this PostgreSQL instead")
    parser.add_argument(
        "--worker-niceness",
        type=int,
        default=None,
        help="nice value of Ray's worker processes (the Serve proxy and replica); default: "
        "Ray's own (15), which yields the CPU to this process when the machine is busy",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 on a missed target/errors")
    args = parser.parse_args()
    if args.worker_niceness is not None:
        # Read by the raylet when ray.init starts it; the name is case-sensitive.
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)  # noqa: SIM112
    if args.steps < 2 or args.clients < 1 or args.tasks < 1 or args.sequential < 5:
        parser.error("--steps >= 2, --clients >= 1, --tasks >= 1, --sequential >= 5")

    with scratch_data_dir(args.data_dir) as data_dir:
        return run_stoppable(bench(args, data_dir))


if __name__ == "__main__":
    sys.exit(run_main(main))
