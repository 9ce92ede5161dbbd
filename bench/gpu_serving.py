"""GPU serving (issue 17, point 6): cluster/serve-gpu.yaml's models on one GPU machine.

Deploys the ``cortex-models`` application of cluster/serve-gpu.yaml on a local Ray (the LLM on
vLLM through Ray Serve LLM, the GPU embedder), with only what a single machine needs changed:
no ``accelerator_type`` (whatever GPU is there), no node-label pinning (one node), API keys
off on 127.0.0.1, and model sources that may be local paths (a device machine has no network).
Then, over the OpenAI routes (``/models/v1``):

LLM        time to first token and decode tokens/s of single streamed requests (median), and
           the aggregate completion tokens/s with ``--concurrency`` requests in flight.
EMBEDDER   texts/s of ``/v1/embeddings`` at batch sizes 1, 8, 64, ... up to ``--max-batch``
           or the first that fails (out of GPU memory: the GPU's limit), median of rounds.

Without a CUDA device, or without vLLM (``pip install 'ray[serve,llm]==2.60.*'``), it says
which and exits 0 without starting anything, so it imports and runs anywhere. Until it has run
on a GPU machine the GPU path is unproven (docs/deployment.md).

    python bench/gpu_serving.py --llm /models/Qwen2.5-7B-Instruct --embedder /models/bge-small
        [--requests 8] [--concurrency 16] [--max-tokens 256] [--max-batch 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "cluster" / "serve-gpu.yaml"
PROMPTS = [
    "Explain in three sentences what a vector index is.",
    "Write a haiku about distributed systems.",
    "List five things to check before deploying a database migration.",
    "Summarise the CoALA decision cycle for a new engineer.",
]


def missing() -> str | None:
    """Why this machine cannot run it, or ``None``."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'ray[serve,llm]==2.60.*')"
    return None


def models_app(llm: str | None, embedder: str | None) -> dict[str, Any]:
    """The file's model application, made to fit one machine (see the module docstring)."""
    raw = yaml.safe_load(CONFIG.read_text())
    (app,) = [a for a in raw["applications"] if a["import_path"] == "serve.models:build_app"]
    args = copy.deepcopy(app["args"])
    vllm = args["llm"]["vllm"]
    vllm.pop("accelerator_type", None)
    if llm:
        vllm["model_loading_config"]["model_source"] = llm
    if embedder:
        args["embedder"]["model"] = embedder
    args["reranker"] = None  # not measured here; keeps the GPU for the two that are
    args["ingress"]["require_keys"] = False
    for part in (args["embedder"], args["ingress"]):
        part["deployment"]["ray_actor_options"].pop("label_selector", None)
    return dict(args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def llm_figures(base: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=base, api_key="unused", timeout=600)

    async def one(prompt: str) -> tuple[float, float, int]:
        start = time.perf_counter()
        first = None
        tokens = 0
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=args.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        end = time.perf_counter()
        first = first or end
        return first - start, end - first, tokens

    await one(PROMPTS[0])  # warm-up: CUDA graphs, the first KV blocks
    single = [await one(PROMPTS[i % len(PROMPTS)]) for i in range(args.requests)]
    start = time.perf_counter()
    burst = await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(args.concurrency)))
    wall = time.perf_counter() - start
    return {
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "ttft_ms_median": round(1000 * statistics.median(t for t, _, _ in single), 1),
        "decode_tokens_per_s_median": round(
            statistics.median(n / d for _, d, n in single if d > 0), 1
        ),
        "concurrency": args.concurrency,
        "aggregate_tokens_per_s": round(sum(n for _, _, n in burst) / wall, 1),
        "ttft_ms_median_under_load": round(1000 * statistics.median(t for t, _, _ in burst), 1),
    }


def embedder_figures(base: str, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx2
    from _texts import synthetic_texts

    texts = synthetic_texts(args.max_batch)
    rows: list[dict[str, Any]] = []
    size = 1
    with httpx2.Client(base_url=base, timeout=600) as client:
        while size <= args.max_batch:
            timings = []
            for _ in range(args.rounds + 1):  # the first round warms up
                start = time.perf_counter()
                answer = client.post("/embeddings", json={"model": model, "input": texts[:size]})
                timings.append(time.perf_counter() - start)
                if answer.status_code != 200:
                    rows.append({"batch": size, "error": answer.text[:300]})
                    return rows  # the GPU's limit (or the route's): stop here
            rows.append(
                {"batch": size, "texts_per_s": round(size / statistics.median(timings[1:]), 1)}
            )
            size *= 8 if size < 64 else 4
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", help="LLM model_source (a local path or a Hub id)")
    parser.add_argument("--embedder", help="embedder model (a local path or a Hub id)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    why = missing()
    if why is not None:
        print(f"{why}: GPU serving benchmark skipped (the GPU path stays unproven)")
        return 0

    import ray
    import torch
    from ray import serve

    from serve.models import ModelServingConfig, build_models_app

    config = ModelServingConfig.model_validate(models_app(args.llm, args.embedder))
    port = _free_port()
    ray.init()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        started = time.perf_counter()
        serve.run(build_models_app(config), name="cortex-models", route_prefix="/models")
        ready_s = time.perf_counter() - started
        base = f"http://127.0.0.1:{port}/models/v1"
        assert config.llm is not None and config.embedder is not None
        report = {
            "device": torch.cuda.get_device_name(0),
            "gpus": torch.cuda.device_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "deploy_ready_s": round(ready_s, 1),
            "llm": {"model": config.llm.served_id}
            | asyncio.run(llm_figures(base, config.llm.served_id, args)),
            "embedder": {
                "model": config.embedder.model,
                "batches": embedder_figures(base, config.embedder.model_id, args),
            },
        }
        print(json.dumps(report, indent=2))
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
