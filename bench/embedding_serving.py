"""Embedding serving (issue 4): the packaged MiniLM through the Serve deployment, against
sentence-transformers in this process, in the same run.

IN-PROCESS  ``SentenceTransformer.encode(texts, batch_size=64, normalize_embeddings=True)``.
HANDLE      ``DeploymentHandle.embed.remote(texts)`` on the ``Embedder`` deployment.
HTTP        ``POST /v1/embeddings`` through Serve's proxy and the ``ModelIngress`` replica,
            with the official ``openai`` client (base64 vectors, decoded by the client).

Part 1: texts/s at 64 texts per call, the three interleaved round by round so drift
cancels. Target: HANDLE ≥ 0.8 × IN-PROCESS.
Part 2: 32 concurrent single-text calls through the handle, to an ``Embedder`` with
``@serve.batch`` and to one without (``batching: false``, one forward pass per call), wall
time per wave of 32, interleaved. Target: batched ≥ 4 × unbatched (calls/s).

The embedder replicas reserve 2 logical CPUs, so Ray gives them ``OMP_NUM_THREADS=2``, the
same torch thread count as this process; the Ray cluster here declares 8 logical CPUs so
that both apps fit. Everything shares the machine's cores: measure on an idle machine.

Run: ``.venv/bin/python bench/embedding_serving.py [--rounds 20] [--waves 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import openai
import ray
import torch
from _texts import synthetic_texts
from ray import serve as ray_serve
from sentence_transformers import SentenceTransformer

from cortex_ray import reclaim_signals, run_main, run_stoppable
from cortex_ray.models import packaged_minilm_path
from serve.models import (
    EMBEDDER_NAME,
    DeploymentOptions,
    EmbedderConfig,
    IngressConfig,
    ModelServingConfig,
    build_models_app,
)

HANDLE_TARGET, BATCH_TARGET = 0.8, 4.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(args: argparse.Namespace, batching: bool) -> ModelServingConfig:
    return ModelServingConfig(
        embedder=EmbedderConfig(
            batching=batching,
            max_batch_size=args.max_batch,
            batch_wait_timeout_s=args.wait,
            deployment=DeploymentOptions(
                ray_actor_options={"num_cpus": 2}, max_ongoing_requests=256
            ),
        ),
        reranker=None,
        llm=None,
        ingress=IngressConfig(
            deployment=DeploymentOptions(
                ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256
            )
        ),
    )


async def part1(
    args: argparse.Namespace, model: SentenceTransformer, handle: Any, base_url: str
) -> dict[str, float]:
    texts = synthetic_texts(64 * args.rounds, seed=1)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    times: dict[str, list[float]] = {"in_process": [], "handle": [], "http": []}

    async def in_process(batch: list[str]) -> np.ndarray:
        return await asyncio.to_thread(
            model.encode, batch, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
        )

    async def via_handle(batch: list[str]) -> np.ndarray:
        return np.asarray(await handle.embed.remote(batch))

    async def via_http(batch: list[str]) -> np.ndarray:
        got = await client.embeddings.create(model="all-MiniLM-L6-v2", input=batch)
        return np.array([d.embedding for d in got.data], dtype=np.float32)

    ways = {"in_process": in_process, "handle": via_handle, "http": via_http}
    warm = synthetic_texts(64, seed=2)
    reference = await in_process(warm)
    for fn in ways.values():  # warm-up, and the three agree
        np.testing.assert_allclose(await fn(warm), reference, atol=1e-4)
    before = await handle.stats.remote()
    for r in range(args.rounds):
        batch = texts[64 * r : 64 * (r + 1)]
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            start = time.perf_counter()
            await ways[name](batch)
            times[name].append(time.perf_counter() - start)
    await client.close()
    after = await handle.stats.remote()
    out = {k: 64 / statistics.median(v) for k, v in times.items()}
    # the replica's own forward-pass time per call (handle and HTTP calls both land there)
    out["replica_encode_ms"] = 1000 * (after["encode_s"] - before["encode_s"]) / (2 * args.rounds)
    out["in_process_ms"] = 1000 * statistics.mean(times["in_process"])
    return out


async def part2(args: argparse.Namespace, batched: Any, unbatched: Any) -> dict[str, float]:
    texts = synthetic_texts(32 * args.waves, seed=3)
    waves: dict[str, list[float]] = {"batched": [], "unbatched": []}
    handles = {"batched": batched, "unbatched": unbatched}

    async def wave(handle: Any, chunk: list[str]) -> None:
        await asyncio.gather(*(handle.embed.remote([t]) for t in chunk))

    for handle in handles.values():
        await wave(handle, synthetic_texts(32, seed=4))
    before = await batched.stats.remote()
    for w in range(args.waves):
        chunk = texts[32 * w : 32 * (w + 1)]
        order = list(handles) if w % 2 == 0 else list(reversed(handles))
        for name in order:
            start = time.perf_counter()
            await wave(handles[name], chunk)
            waves[name].append(time.perf_counter() - start)
    after = await batched.stats.remote()
    passes = after["passes"] - before["passes"]
    out = {k: 32 / statistics.median(v) for k, v in waves.items()}
    out["texts_per_pass"] = (after["calls"] - before["calls"]) / max(passes, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="64-text calls of each kind")
    parser.add_argument("--waves", type=int, default=20, help="waves of 32 single-text calls")
    parser.add_argument("--max-batch", type=int, default=64, help="texts per merged pass")
    parser.add_argument("--wait", type=float, default=0.005, help="batch_wait_timeout_s")
    parser.add_argument(
        "--worker-niceness",
        type=int,
        default=None,
        help="nice value of Ray's workers (the replicas); default: Ray's own (15), which "
        "yields the CPU to this process (the in-process side) when the machine is busy",
    )
    args = parser.parse_args()
    if args.worker_niceness is not None:
        # Read by the raylet when ray.init starts it; the name is case-sensitive.
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)  # noqa: SIM112
    niceness = os.environ.get("RAY_worker_niceness", "15 (Ray's default)")  # noqa: SIM112

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    port = free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        ray_serve.run(build_models_app(config(args, True)), name="emb-batched", route_prefix="/b")
        ray_serve.run(
            build_models_app(config(args, False)), name="emb-unbatched", route_prefix="/u"
        )
        batched = ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name="emb-batched")
        unbatched = ray_serve.get_deployment_handle(EMBEDDER_NAME, app_name="emb-unbatched")
        model = SentenceTransformer(str(packaged_minilm_path()), device="cpu")
        rates = run_stoppable(part1(args, model, batched, f"http://127.0.0.1:{port}/b/v1"))
        calls = run_stoppable(part2(args, batched, unbatched))
    finally:
        ray_serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()

    handle_ratio = rates["handle"] / rates["in_process"]
    http_ratio = rates["http"] / rates["in_process"]
    batch_ratio = calls["batched"] / calls["unbatched"]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads in this process), "
        f"ray {ray.__version__}; Ray worker niceness {niceness}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"part 1: 64 texts per call, {args.rounds} rounds, median texts/s")
    for name in ("in_process", "handle", "http"):
        print(f"  {name:<11} {rates[name]:8.1f} texts/s")
    print(
        f"  mean forward pass per 64 texts: in this process {rates['in_process_ms']:.1f} ms, "
        f"inside the replica {rates['replica_encode_ms']:.1f} ms"
    )
    verdict = "PASS" if handle_ratio >= HANDLE_TARGET else "FAIL"
    print(f"  handle / in-process = {handle_ratio:.2f}  (target >= {HANDLE_TARGET}) {verdict}")
    print(f"  http / in-process   = {http_ratio:.2f}  (no target)")
    print(f"part 2: waves of 32 concurrent single-text handle calls, {args.waves} waves")
    for name in ("batched", "unbatched"):
        print(f"  {name:<11} {calls[name]:8.1f} calls/s")
    print(
        f"  batched: {calls['texts_per_pass']:.1f} calls merged per forward pass on average "
        f"(max_batch_size {args.max_batch}, batch_wait_timeout_s {args.wait})"
    )
    verdict = "PASS" if batch_ratio >= BATCH_TARGET else "FAIL"
    print(f"  batched / unbatched = {batch_ratio:.2f}  (target >= {BATCH_TARGET}) {verdict}")


if __name__ == "__main__":
    sys.exit(run_main(main))
