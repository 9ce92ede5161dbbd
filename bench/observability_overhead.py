"""Observability overhead (issue 16, point 8): what traces, metrics and diagnostics cost
per autonomous step, export on against everything off, in one run.

The step is cycle_overhead.py's (a zero-latency scripted model, the hash embedder, the
``tick`` tool through the gate, the real LEARN transaction on PostgreSQL), driven through
``Runtime.run_autonomous``. Four configurations, interleaved run by run (the order rotating
each run) on one database in one process, each with its own runtime:

OFF         tracing off (no tracer provider), diagnostics off, no metrics sink;
TRACES      spans exported: batched into the local span store (``trace_spans``), or over
            OTLP/HTTP with ``--otlp URL`` (a real collector, e.g. the Phoenix of
            ``.venv/tools/phoenix``);
METRICS     ``ray.util.metrics`` through ``actors.RayMetrics`` on a local Ray (what session
            actors record), nothing else;
DIAGNOSTICS the diagnostic timeline (scrubbed, bounded, written after each step) and the
            run's cost, nothing else;
ALL         the three together: the default of a deployed stack;
ALL_SAMPLED ALL with the standard OpenTelemetry sampler set to keep one trace in ten
            (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.1``),
            what a busy deployment would set.

The tracer provider is process-wide (the latest activated wins), so the runner activates
the TRACES/ALL runtime's provider only for its own runs; the metrics sink likewise.
Each run's time includes flushing what it exported (its spans to their store, its metrics to
Ray), so work deferred to a background thread is counted. Reported per configuration:
median and p95 over the runs of (run wall time / steps) and the ratio to OFF (the target:
ALL/OFF ≤ 1.10), and the client process's CPU per step (every thread: the exporters too)
with its ratio, which the database's share of the wall time does not dilute.

Run: ``.venv/bin/python bench/observability_overhead.py [--steps 8] [--runs 30]
[--otlp http://127.0.0.1:6006/v1/traces]``; ``--check`` exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _scratch import scratch_data_dir
from cycle_overhead import AGENT_TOOLS, GOAL, TICK, percentile, respond

import cortex_ray._tracing as core_tracing  # bench only: switch the process's provider
from cortex_ray import AgentMode, RunStatus, Runtime, Settings, run_main, run_stoppable
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder, ScriptedModelClient
from cortex_ray.observability import metrics
from cortex_ray.storage import Database

TARGET = 1.10
CONFIGS = ("OFF", "TRACES", "METRICS", "DIAGNOSTICS", "ALL", "ALL_SAMPLED")


async def _open(base: Settings, db: Database, *, traces: bool, diagnostics: bool) -> Runtime:
    settings = base.model_copy(
        update={
            "tracing": base.tracing.model_copy(update={"enabled": traces}),
            "diagnostics": base.diagnostics.model_copy(update={"enabled": diagnostics}),
        }
    )
    return await Runtime.open(
        settings,
        model=ScriptedModelClient(responder=respond, name="zero-latency"),
        embedder=HashEmbedder(384),
        importance=HeuristicImportanceScorer(),
        tools=[TICK],
        db=db,
    )


async def bench(args: argparse.Namespace, data_dir: Path) -> int:
    import ray

    from actors import RayMetrics

    n, runs = args.steps, args.runs
    load_at_start = os.getloadavg()[0]
    if args.otlp:
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = args.otlp
    base = Settings(
        data_dir=data_dir,
        database_url=args.database_url,
        model_backend="none",
        embedding_backend="hash",
        importance_scoring="heuristic",
        max_steps_limit=max(64, n),
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    sink = RayMetrics()
    db = await Database.open(base.model_copy(update={"pool_max_size": 4}))
    runtimes: dict[str, Runtime] = {}
    try:
        runtimes["OFF"] = await _open(base, db, traces=False, diagnostics=False)
        runtimes["METRICS"] = await _open(base, db, traces=False, diagnostics=False)
        runtimes["DIAGNOSTICS"] = await _open(base, db, traces=False, diagnostics=True)
        runtimes["TRACES"] = await _open(base, db, traces=True, diagnostics=False)
        runtimes["ALL"] = await _open(base, db, traces=True, diagnostics=True)
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"  # read by the SDK's
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0.1"  # TracerProvider when it is built
        try:
            runtimes["ALL_SAMPLED"] = await _open(base, db, traces=True, diagnostics=True)
        finally:
            del os.environ["OTEL_TRACES_SAMPLER"], os.environ["OTEL_TRACES_SAMPLER_ARG"]
        providers = {
            name: rt.tracing.provider for name, rt in runtimes.items() if rt.tracing is not None
        }
        for provider in providers.values():  # on only for their own runs
            core_tracing.deactivate_provider(provider)
        org = f"bench-{uuid.uuid4().hex[:10]}"
        agents = {
            name: await rt.create_agent(
                org, f"bench-{name.lower()}", mode=AgentMode.AUTONOMOUS, tools=AGENT_TOOLS
            )
            for name, rt in runtimes.items()
        }

        cpu: dict[str, list[float]] = {name: [] for name in CONFIGS}

        async def one(name: str) -> float:
            rt = runtimes[name]
            provider = providers.get(name)
            if provider is not None:
                core_tracing.activate_provider(provider)
            if name in ("METRICS", "ALL", "ALL_SAMPLED"):
                metrics.install_metrics(sink)
            gc.collect()
            try:
                started, cpu_started = time.perf_counter(), time.process_time()
                run = await rt.run_autonomous(org, agents[name].id, GOAL, max_steps=n)
                if provider is not None:
                    provider.force_flush()  # the export of this run's spans counts too
                if name in ("METRICS", "ALL", "ALL_SAMPLED"):
                    sink.flush()  # and the hand-over of its metrics to Ray
                wall = time.perf_counter() - started
                cpu[name].append((time.process_time() - cpu_started) / n * 1000)
            finally:
                metrics.uninstall_metrics(sink)
                if provider is not None:
                    core_tracing.deactivate_provider(provider)
            if run.status is not RunStatus.COMPLETED or len(run.steps) != n:
                raise RuntimeError(f"{name}: run ended {run.status.value}: {run.reason}")
            return wall / n * 1000

        for _ in range(args.warmup):
            for name in CONFIGS:
                await one(name)
        for values in cpu.values():
            values.clear()
        per_step: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for r in range(runs):
            order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
            for name in order:
                per_step[name].append(await one(name))
        for provider in providers.values():
            provider.force_flush()
    finally:
        for rt in runtimes.values():
            await rt.close(close_db=False)
        await db.close()
        ray.shutdown()

    exported = f"OTLP to {args.otlp}" if args.otlp else "local span store (trace_spans)"
    print(
        f"observability overhead per autonomous step: {n} steps a run, {runs} runs per "
        f"configuration, interleaved; spans exported to the {exported}; metrics through "
        f"ray.util.metrics on a local Ray; load average {load_at_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (the machine's other work shares its cores)"
    )
    off = statistics.median(per_step["OFF"])
    off_cpu = statistics.median(cpu["OFF"])
    print("               wall per step (the target)             client CPU per step")
    for name in CONFIGS:
        values = per_step[name]
        median = statistics.median(values)
        cpu_median = statistics.median(cpu[name])
        print(
            f"  {name:<12} median {median:7.3f} ms  p95 {percentile(values, 95):7.3f}  "
            f"{median / off:5.3f}×   median {cpu_median:6.3f} ms  {cpu_median / off_cpu:5.3f}×  "
            f"(+{median - off:5.3f} ms wall)"
        )
    ratio = statistics.median(per_step["ALL"]) / off
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"ALL / OFF = {ratio:.3f}× wall (target ≤ {TARGET:.2f}×): {verdict}")
    return 1 if args.check and ratio > TARGET else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--otlp", default=None, help="an OTLP/HTTP traces endpoint")
    parser.add_argument("--database-url", default=None, help="default: an embedded PostgreSQL")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    async def go() -> int:
        with scratch_data_dir(args.data_dir) as data_dir:
            return await bench(args, data_dir)

    return run_main(lambda: run_stoppable(go()))


if __name__ == "__main__":
    sys.exit(main())
