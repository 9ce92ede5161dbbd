"""Observability overhead (issue 16, point 8): what traces, metrics and diagnostics cost
per autonomous step, export on against everything off, in one run.

The step is cycle_overhead.py's (a zero-latency scripted model, the hash embedder, the
``tick`` tool through the gate, the real LEARN transaction on PostgreSQL), driven through
``Runtime.run_autonomous``. Seven configurations, interleaved block by block (the order
rotating each round) on one database in one process, each with its own runtime:

OFF         tracing off (no tracer provider), diagnostics off, no metrics sink;
OFF_AGAIN   OFF once more, with a runtime and an agent of its own: the A/A control. Its
            ratio to OFF is what the machine's noise alone makes of two equal things; a
            difference smaller than that is not a measurement;
TRACES      spans exported: batched into the local span store (``trace_spans``), or over
            OTLP/HTTP with ``--otlp URL`` (a real collector, e.g. the Phoenix of
            ``.venv/tools/phoenix``);
METRICS     ``ray.util.metrics`` through ``actors.RayMetrics`` on a local Ray (what session
            actors record), nothing else;
DIAGNOSTICS the diagnostic timeline (scrubbed, bounded, written once a second and at the
            run's end) and the run's cost, nothing else;
ALL         the three together: the default of a deployed stack;
ALL_SAMPLED ALL with the standard OpenTelemetry sampler set to keep one trace in ten
            (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.1``),
            what a busy deployment would set.

A block is ``--block`` runs of ``--steps`` steps back to back, as a session actor runs them:
the span processor's thread exports on its own schedule (every 0.5 s) while the next runs go
on, the metrics thread hands over likewise, and the block's time ends with a flush of
whatever is still pending (its spans to their store, its metrics to Ray), so every exported
byte is counted, once a block rather than once a run (a flush after every run made each run
wait for a database round trip that a deployment never waits for). The tracer provider is
process-wide (the latest activated wins), so a block activates its own provider only; the
metrics sink likewise. Reported per configuration: median and p95 over the rounds of (block
wall time / steps), the ratio of medians to OFF (the target: ALL/OFF <= 1.10), the median of
the per-round paired ratios, and the client process's CPU per step (every thread: the
exporters too), which the database's share of the wall time does not dilute.

``--real-model`` runs the step users run: the packaged SmolLM2-135M through llama.cpp and
the packaged MiniLM embedder in this process (one instance of each, shared by the
configurations), OFF, OFF_AGAIN and ALL only, one run a block. What it measures is the
size of a real step, the denominator of the overhead: its ratios are the model's, not the
telemetry's (each agent's memories differ, so its prompts and answers differ, and the A/A
control moves by as much as the step itself; docs/benchmarks.md has a run).

Run: ``.venv/bin/python bench/observability_overhead.py [--steps 16] [--block 6] [--rounds 12]
[--otlp http://127.0.0.1:6006/v1/traces] [--real-model]``; ``--check`` exits 1 when the target
is missed.
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

import cortex_ray.observability._spans as core_tracing  # bench only: switch the process's provider
from cortex_ray import AgentMode, RunStatus, Runtime, Settings, run_main, run_stoppable
from cortex_ray.memory import HeuristicImportanceScorer
from cortex_ray.models import HashEmbedder, ModelParts, ScriptedModelClient, open_models
from cortex_ray.observability import metrics
from cortex_ray.storage import Database

TARGET = 1.10
CONFIGS = ("OFF", "OFF_AGAIN", "TRACES", "METRICS", "DIAGNOSTICS", "ALL", "ALL_SAMPLED")
REAL_CONFIGS = ("OFF", "OFF_AGAIN", "ALL")
_TRACED = ("TRACES", "ALL", "ALL_SAMPLED")
_DIAGNOSED = ("DIAGNOSTICS", "ALL", "ALL_SAMPLED")
_METERED = ("METRICS", "ALL", "ALL_SAMPLED")


async def _open(
    base: Settings, db: Database, *, traces: bool, diagnostics: bool, models: ModelParts | None
) -> Runtime:
    settings = base.model_copy(
        update={
            "tracing": base.tracing.model_copy(update={"enabled": traces}),
            "diagnostics": base.diagnostics.model_copy(update={"enabled": diagnostics}),
        }
    )
    if models is not None:  # the packaged models, one instance shared by every runtime
        return await Runtime.open(settings, model=models.chat, embedder=models.embedder, db=db)
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

    real = args.real_model
    configs = REAL_CONFIGS if real else CONFIGS
    n, rounds, block = args.steps, args.rounds, 1 if real else args.block
    load_at_start = os.getloadavg()[0]
    if args.otlp:
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = args.otlp
    base = Settings(
        data_dir=data_dir,
        database_url=args.database_url,
        model_backend="local" if real else "none",
        model_name="SmolLM2-135M-Instruct",  # the packaged model every install has
        model_temperature=0.0,  # the same answers in every configuration: less noise
        embedding_backend="local" if real else "hash",
        importance_scoring="heuristic",
        max_steps_limit=max(64, n),
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    sink = RayMetrics()
    models = await open_models(base) if real else None
    db = await Database.open(base.model_copy(update={"pool_max_size": 4}).storage)
    runtimes: dict[str, Runtime] = {}
    try:
        for name in configs:
            if name == "ALL_SAMPLED":
                os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"  # read by the
                os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0.1"  # SDK's TracerProvider when built
            try:
                runtimes[name] = await _open(
                    base, db, traces=name in _TRACED, diagnostics=name in _DIAGNOSED, models=models
                )
            finally:
                os.environ.pop("OTEL_TRACES_SAMPLER", None)
                os.environ.pop("OTEL_TRACES_SAMPLER_ARG", None)
        providers = {
            name: rt.tracing.provider for name, rt in runtimes.items() if rt.tracing is not None
        }
        for provider in providers.values():  # on only for their own blocks
            core_tracing.deactivate_provider(provider)
        org = f"bench-{uuid.uuid4().hex[:10]}"
        tools = None if real else AGENT_TOOLS
        agents = {
            name: await rt.create_agent(
                org, f"bench-{name.lower()}", mode=AgentMode.AUTONOMOUS, tools=tools
            )
            for name, rt in runtimes.items()
        }
        cpu: dict[str, list[float]] = {name: [] for name in configs}
        failed: dict[str, int] = {name: 0 for name in configs}

        async def one(name: str) -> float:
            """A block of runs of the configuration: wall milliseconds per step."""
            rt = runtimes[name]
            provider = providers.get(name)
            if provider is not None:
                core_tracing.activate_provider(provider)
            if name in _METERED:
                metrics.install_metrics(sink)
            gc.collect()
            steps = 0
            try:
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(block):
                    run = await rt.run_autonomous(org, agents[name].id, GOAL, max_steps=n)
                    steps += len(run.steps)
                    if run.status is not RunStatus.COMPLETED:
                        if not real:
                            raise RuntimeError(
                                f"{name}: run ended {run.status.value}: {run.reason}"
                            )
                        failed[name] += 1  # the small model's own doing: its steps still count
                if provider is not None:
                    provider.force_flush()  # what is still pending is counted too
                if name in _METERED:
                    sink.flush()
                wall = time.perf_counter() - started
                cpu[name].append((time.process_time() - cpu_started) / max(steps, 1) * 1000)
            finally:
                metrics.uninstall_metrics(sink)
                if provider is not None:
                    core_tracing.deactivate_provider(provider)
            if steps == 0:
                raise RuntimeError(f"{name}: no step was taken")
            return wall / steps * 1000

        for _ in range(args.warmup):
            for name in configs:
                await one(name)
        for values in cpu.values():
            values.clear()
        for name in failed:
            failed[name] = 0
        per_step: dict[str, list[float]] = {name: [] for name in configs}
        for r in range(rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for name in order:
                per_step[name].append(await one(name))
        for provider in providers.values():
            provider.force_flush()
    finally:
        for rt in runtimes.values():
            await rt.close(close_db=False)
        await db.close()
        if models is not None and models.chat is not None:
            await models.chat.aclose()
        ray.shutdown()

    exported = f"OTLP to {args.otlp}" if args.otlp else "local span store (trace_spans)"
    step = (
        "the packaged SmolLM2-135M (llama.cpp) and MiniLM in this process"
        if real
        else "a zero-latency scripted model and the hash embedder"
    )
    print(
        f"observability overhead per autonomous step ({step}): up to {n} steps a run, "
        f"{block} run(s) a block, {rounds} blocks per configuration, interleaved; spans "
        f"exported to the {exported}; metrics through ray.util.metrics on a local Ray; load "
        f"average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (the "
        f"machine's other work shares its cores)"
    )
    off = statistics.median(per_step["OFF"])
    off_cpu = statistics.median(cpu["OFF"])
    print("               wall per step (the target)        paired    client CPU per step")
    for name in configs:
        values = per_step[name]
        median = statistics.median(values)
        paired = statistics.median(v / o for v, o in zip(values, per_step["OFF"], strict=True))
        cpu_median = statistics.median(cpu[name])
        print(
            f"  {name:<12} median {median:8.3f} ms  p95 {percentile(values, 95):8.3f}  "
            f"{median / off:5.3f}×  {paired:5.3f}×   median {cpu_median:7.3f} ms  "
            f"{cpu_median / off_cpu:5.3f}×  (+{median - off:6.3f} ms wall)"
            + (f"  {failed[name]} runs not completed" if failed[name] else "")
        )
    noise = abs(statistics.median(per_step["OFF_AGAIN"]) / off - 1)
    ratio = statistics.median(per_step["ALL"]) / off
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(
        f"ALL / OFF = {ratio:.3f}× wall (target ≤ {TARGET:.2f}×): {verdict}; the A/A control "
        f"OFF_AGAIN differs from OFF by {noise:.1%} in this run"
    )
    return 1 if args.check and ratio > TARGET else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="default 16 (4 with --real-model)")
    parser.add_argument("--block", type=int, default=6, help="runs a block (zero-latency step)")
    parser.add_argument("--rounds", type=int, default=None, help="default 12 (8 with --real-model)")
    parser.add_argument("--warmup", type=int, default=1, help="blocks per configuration")
    parser.add_argument("--otlp", default=None, help="an OTLP/HTTP traces endpoint")
    parser.add_argument("--real-model", action="store_true", help="the packaged models' step")
    parser.add_argument("--database-url", default=None, help="default: an embedded PostgreSQL")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 4 if args.real_model else 16
    if args.rounds is None:
        args.rounds = 8 if args.real_model else 12

    async def go() -> int:
        with scratch_data_dir(args.data_dir) as data_dir:
            return await bench(args, data_dir)

    return run_main(lambda: run_stoppable(go()))


if __name__ == "__main__":
    sys.exit(main())
