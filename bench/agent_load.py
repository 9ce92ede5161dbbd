"""Agent load on the packaged model (issue 13, point 8): N concurrent autonomous runs through
the HTTP API, every model call a real SmolLM2 generation, against one run alone on the same
stack in the same process.

Stack   ``serve.run_local(settings, serve_models=True)``, what ``python -m serve`` starts: the
        API (default executor: one session actor per run) and the model-serving app at
        ``/models`` (the packaged SmolLM2 through llama.cpp, the packaged MiniLM), both on a
        local Ray with 2 CPUs, on the embedded PostgreSQL. The LLM deployment has the
        defaults of ``LlmConfig``: one replica, one generation at a time, ``max_waiting``
        requests in line, each waiting at most ``queue_timeout_s``; beyond: 503.
Runs    ``POST /api/orgs/{org}/tasks`` (an autonomous agent, ``maxSteps`` steps, a goal that
        has it remember a fact and read the clock), then ``GET .../tasks/{id}?wait=30`` until
        the run ends or ``--run-timeout`` passes.
Step    Latency of step i = its ``createdAt`` − step i−1's (step 0: − the run's ``createdAt``),
        server clock: the model calls of that step (propose, evaluate if several candidates
        are valid, importance of what it remembers) and its tool.
Probe   A 20-token ``POST /models/v1/chat/completions`` (the issue's measurement: 5 min with
        ~9 runs active), once with nothing else running, then every ``--probe-every`` s
        while the N runs are active.

Phases  baseline: ``--alone`` runs one at a time; load: N runs at once. Reported: runs,
        steps, p50/p95 per step, timeouts (runs not ended within ``--run-timeout``, steps
        whose tool ended TIMEOUT, HTTP client timeouts), refusals (503 model_overloaded),
        failed runs and why, the probe's latencies, the LLM replica's counters; the ratio
        load/baseline of the per-step p50 and p95. Target: 0 timeouts, 0 refusals at N=8.

Run: ``.venv/bin/python bench/agent_load.py [--runs 8] [--steps 3] [--alone 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2
import ray
from _scratch import scratch_data_dir
from ray import serve as ray_serve

from cortex_ray import Grant, Principal, Settings
from cortex_ray.storage import Database, Store
from serve import ApiOptions, run_local
from serve._lifecycle import Interrupted, ray_driver
from serve.models import LLM_NAME, LlmConfig

GOAL = (
    "Remember the fact that the Lisbon office opens at 09:00 with remember_fact, "
    "then report the current time."
)
PROBE = {
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 20,
    "temperature": 0,
}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass
class Phase:
    """The runs of one phase: per-step latencies (s), outcomes, errors."""

    steps: list[float] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)
    timeouts: Counter[str] = field(default_factory=Counter)
    refusals: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    run_s: list[float] = field(default_factory=list)
    wall: float = 0.0
    probes: list[float] = field(default_factory=list)
    probe_errors: Counter[str] = field(default_factory=Counter)
    served_by_kind: Counter[str] = field(default_factory=Counter)  # the LLM's, this phase
    refused_by_kind: Counter[str] = field(default_factory=Counter)

    def count_llm(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        for mine, key in (
            (self.served_by_kind, "served_by_kind"),
            (self.refused_by_kind, "refused_by_kind"),
        ):
            mine.update(Counter(after[key]) - Counter(before[key]))

    @property
    def foreground_refusals(self) -> int:
        """Refused LLM calls a run or a client waited for (background importance: not)."""
        return sum(n for kind, n in self.refused_by_kind.items() if kind != "importance")


async def one_run(
    http: httpx2.AsyncClient, org: str, agent: str, steps: int, deadline_s: float, phase: Phase
) -> None:
    started = time.perf_counter()
    try:
        r = await http.post(
            f"/api/orgs/{org}/tasks",
            json={
                "name": "agent-load",
                "agentId": agent,
                "assigneeKind": "AGENT",
                "payload": {"goal": GOAL, "maxSteps": steps},
            },
        )
        if r.status_code != 202:
            phase.runs[f"POST {r.status_code}"] += 1
            phase.reasons[r.text[:160]] += 1
            return
        location = r.json()["location"]
        while True:
            left = deadline_s - (time.perf_counter() - started)
            if left <= 0:
                phase.timeouts["run not ended in time"] += 1
                phase.runs["TIMEOUT"] += 1
                return
            r = await http.get(location, params={"wait": min(30, max(1, int(left)))})
            if r.status_code != 200:
                phase.runs[f"GET {r.status_code}"] += 1
                phase.reasons[r.text[:160]] += 1
                return
            body = r.json()
            if body["status"] != "RUNNING":
                break
    except httpx2.TimeoutException as exc:
        phase.timeouts[f"HTTP {type(exc).__name__}"] += 1
        phase.runs["HTTP timeout"] += 1
        return
    phase.run_s.append(time.perf_counter() - started)
    phase.runs[body["status"]] += 1
    if body["status"] != "COMPLETED":
        reason = str(body.get("reason") or "")
        phase.reasons[reason[:160]] += 1
        if "model_overloaded" in reason or "over capacity" in reason:
            phase.refusals += 1
    previous = datetime.fromisoformat(body["createdAt"])
    for step in body["steps"]:
        at = datetime.fromisoformat(step["createdAt"])
        phase.steps.append((at - previous).total_seconds())
        previous = at
        observation = step.get("observation") or {}
        if observation.get("status") == "TIMEOUT":
            phase.timeouts[f"tool {observation.get('tool')} TIMEOUT"] += 1
        summary = str(observation.get("summary") or "")
        if "model_overloaded" in summary or "over capacity" in summary:
            phase.refusals += 1


async def probe(models: httpx2.AsyncClient, model: str, phase: Phase) -> None:
    started = time.perf_counter()
    try:
        r = await models.post("/v1/chat/completions", json={"model": model, **PROBE})
    except httpx2.TimeoutException:
        phase.probe_errors["HTTP timeout"] += 1
        return
    if r.status_code == 200:
        phase.probes.append(time.perf_counter() - started)
        return
    code = (r.json().get("error") or {}).get("code") if r.content else None
    phase.probe_errors[f"{r.status_code} {code}"] += 1
    if code == "model_overloaded":
        phase.refusals += 1


async def load_phase(
    http: httpx2.AsyncClient,
    models: httpx2.AsyncClient,
    args: argparse.Namespace,
    org: str,
    agent: str,
    model: str,
) -> Phase:
    phase = Phase()
    started = time.perf_counter()
    runs = [
        asyncio.ensure_future(one_run(http, org, agent, args.steps, args.run_timeout, phase))
        for _ in range(args.runs)
    ]
    while not all(r.done() for r in runs):
        await asyncio.wait(runs, timeout=args.probe_every)
        if not all(r.done() for r in runs):
            await probe(models, model, phase)
    await asyncio.gather(*runs)
    phase.wall = time.perf_counter() - started
    return phase


async def bench(args: argparse.Namespace, settings: Settings, url: str) -> int:
    db = await Database.open(settings.storage)
    try:
        org = f"load-{uuid.uuid4().hex[:8]}"
        everything = Grant(tools=frozenset({"*"}))
        admin = Principal(id="bench", org_id=org, is_admin=True, grant=everything)
        store = Store(db)
        await store.ensure_org(org)
        key, _ = await store.create_api_key(admin, "agent_load")
    finally:
        await db.close()
    auth = {"Authorization": f"Bearer {key}"}
    timeout = httpx2.Timeout(args.http_timeout)
    limits = httpx2.Limits(max_connections=args.runs + 8)
    async with (
        httpx2.AsyncClient(base_url=url, headers=auth, timeout=timeout, limits=limits) as http,
        httpx2.AsyncClient(base_url=f"{url}/models", headers=auth, timeout=timeout) as models,
    ):
        r = await http.post(
            f"/api/orgs/{org}/agents",
            json={
                "name": "load-worker",
                "mode": "AUTONOMOUS",
                "persona": "You carry out the goal with the tools you have, then finish.",
            },
        )
        assert r.status_code == 201, r.text
        agent = r.json()["id"]
        model = (await models.get("/v1/models")).json()["data"]
        chat_model = next(m["id"] for m in model if m["id"] == settings.models.name)

        # warm-up: one run (the first actor, the prompt cache) and one probe
        await one_run(http, org, agent, args.steps, args.run_timeout, Phase())
        await probe(models, chat_model, Phase())

        llm = ray_serve.get_deployment_handle(LLM_NAME, app_name=settings.models.app)
        await settle(llm)
        alone = Phase()
        before = await llm.load.remote()
        t0 = time.perf_counter()
        for _ in range(args.alone):
            await one_run(http, org, agent, args.steps, args.run_timeout, alone)
        for _ in range(3):
            await probe(models, chat_model, alone)
        alone.wall = time.perf_counter() - t0
        await settle(llm)
        middle = await llm.load.remote()
        alone.count_llm(before, middle)

        loaded = await load_phase(http, models, args, org, agent, chat_model)
        left = await llm.load.remote()
        await settle(llm)
        loaded.count_llm(middle, await llm.load.remote())
    report(args, settings, alone, loaded, left)
    timeouts = sum(loaded.timeouts.values()) + sum(alone.timeouts.values())
    refusals = loaded.foreground_refusals + alone.foreground_refusals
    return 0 if not args.check or (timeouts == 0 and refusals == 0) else 1


async def settle(llm: Any, within_s: float = 300.0) -> None:
    """Wait until the LLM's line is empty (background importance scoring included)."""
    for _ in range(int(within_s)):
        if not (await llm.load.remote())["in_flight"]:
            return
        await asyncio.sleep(1)


def _row(label: str, phase: Phase) -> str:
    s = [x * 1000 for x in phase.steps]
    if not s:
        return f"  {label:36}{0:>6}"
    return (
        f"  {label:36}{sum(phase.runs.values()):>6}{len(s):>7}"
        f"{statistics.median(s) / 1000:>10.1f}{percentile(s, 95) / 1000:>10.1f}"
        f"{sum(phase.timeouts.values()):>10}{phase.foreground_refusals:>10}"
    )


def report(
    args: argparse.Namespace,
    settings: Settings,
    alone: Phase,
    loaded: Phase,
    counters: dict[str, Any],
) -> None:
    llm = LlmConfig()
    print(
        f"Agent load: {args.runs} concurrent autonomous runs of {args.steps} steps vs "
        f"{args.alone} run(s) alone, through the HTTP API; goal: {GOAL!r}"
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; ray {ray.__version__} "
        f"(num_cpus={args.num_cpus}); executor {settings.sessions.executor}; candidates "
        f"{settings.decide.candidates}; importance {settings.memory.importance_scoring}; "
        "tool timeout "
        f"{settings.tools.timeout_s:g} s; model {settings.models.name} via the LLM deployment "
        f"(1 replica, max_waiting {llm.max_waiting}, queue_timeout_s {llm.queue_timeout_s:g}, "
        f"max_tokens {settings.models.max_tokens}); embedder served MiniLM; PostgreSQL embedded"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at the end {load}")
    print()
    print(
        f"  {'':36}{'runs':>6}{'steps':>7}{'p50 s':>10}{'p95 s':>10}{'timeouts':>10}"
        f"{'refused':>10}   (per step)"
    )
    print(_row(f"baseline: {args.alone} run(s), one at a time", alone))
    print(_row(f"load: {args.runs} runs at once", loaded))
    if alone.steps and loaded.steps:
        p50 = statistics.median(loaded.steps) / statistics.median(alone.steps)
        p95 = percentile(loaded.steps, 95) / percentile(alone.steps, 95)
        print(
            f"  ratio load/baseline per step: p50 {p50:.2f}x, p95 {p95:.2f}x "
            f"(one replica generates one request at a time: up to {args.runs}x is sharing it)"
        )
    for label, phase in (("baseline", alone), ("load", loaded)):
        runs = ", ".join(f"{k} {v}" for k, v in sorted(phase.runs.items()))
        print(f"  {label}: runs {runs}; wall {phase.wall:.0f} s", end="")
        if phase.run_s:
            print(f"; run p50 {statistics.median(phase.run_s):.1f} s, max {max(phase.run_s):.1f} s")
        else:
            print()
        for what, n in phase.timeouts.items():
            print(f"    timeout: {what} x{n}")
        for why, n in phase.reasons.items():
            print(f"    not completed: {why!r} x{n}")
    print()
    for label, phase in (("alone", alone), (f"during the {args.runs} runs", loaded)):
        if phase.probes:
            ms = phase.probes
            print(
                f"  20-token completion over HTTP, {label}: n={len(ms)}, p50 "
                f"{statistics.median(ms):.1f} s, max {max(ms):.1f} s"
                + (f"; refused/errors {dict(phase.probe_errors)}" if phase.probe_errors else "")
            )
        elif phase.probe_errors:
            print(f"  20-token completion, {label}: errors {dict(phase.probe_errors)}")
    for label, phase in (("baseline", alone), ("load", loaded)):
        print(
            f"  LLM calls, {label} (until its line was empty again): served "
            f"{dict(phase.served_by_kind)}, refused 503 {dict(phase.refused_by_kind)}"
        )
    print(f"  LLM replica counters when the last run ended: {counters}")
    timeouts = sum(loaded.timeouts.values())
    refusals = loaded.foreground_refusals
    verdict = "PASS" if timeouts == 0 and refusals == 0 else "FAIL"
    print(
        f"  target at {args.runs} runs: 0 timeouts, 0 refused calls that a run or a client "
        f"waited for (background importance scoring keeps its heuristic score when refused): "
        f"{verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="concurrent runs (N)")
    parser.add_argument("--steps", type=int, default=3, help="maxSteps of each run")
    parser.add_argument("--alone", type=int, default=2, help="baseline runs, one at a time")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--http-timeout", type=float, default=300.0, help="per HTTP call")
    parser.add_argument("--probe-every", type=float, default=20.0, help="seconds between probes")
    parser.add_argument("--port", type=int, default=8712, help="Serve's HTTP port (loopback)")
    parser.add_argument("--num-cpus", type=int, default=2, help="the local Ray's CPUs")
    parser.add_argument("--executor", choices=("actors", "in_process"), default=None)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="embedded PostgreSQL folder (default: a fresh one under /tmp, removed afterwards)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 on timeouts or refusals")
    args = parser.parse_args()
    if args.runs < 1 or args.steps < 2 or args.alone < 1:
        parser.error("--runs >= 1, --steps >= 2, --alone >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with scratch_data_dir(args.data_dir) as data_dir:
        base = Settings(data_dir=data_dir, api=ApiOptions(port=args.port))
        if args.executor is not None:
            sessions = base.sessions.model_copy(update={"executor": args.executor})
            base = base.model_copy(update={"sessions": sessions})
        try:
            with ray_driver(
                num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False
            ) as driver:
                api = run_local(base, serve_models=True)
                driver.callback(api.stop)
                assert api.settings is not None
                return asyncio.run(bench(args, api.settings, api.url))
        except Interrupted as exc:
            return int(getattr(exc, "exit_code", 1) or 1)


if __name__ == "__main__":
    sys.exit(main())
