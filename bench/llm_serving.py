"""LLM serving (issue 4): the packaged SmolLM2 through the Serve ``LLM`` deployment (llama.cpp),
against the same backend (the core's ``LlamaCppClient``) in this process, in the same run.

IN-PROCESS  ``LlamaCppClient.chat`` in this process.
HANDLE      ``HandleModelClient.chat``: the OpenAI request through a ``DeploymentHandle`` to
            the ``LLM`` replica, which runs the same ``LlamaCppClient``.
HTTP        ``OpenAICompatibleClient.chat`` (the official ``openai`` client) through Serve's
            proxy and the ``ModelIngress`` replica (reported, no target).

Same prompts, ``temperature=0``, the same ``max_tokens``, one request at a time, the kinds
interleaved prompt by prompt (order alternating) so drift cancels. tokens/s = completion
tokens (as each reports them) / wall time of the calls, both summed over the prompts.
Target: HANDLE ≥ 0.9 × IN-PROCESS.
llama.cpp picks its own thread count the same way in both processes; run on an idle machine.

Run: ``.venv/bin/python bench/llm_serving.py [--prompts 12] [--max-tokens 96]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from pathlib import Path

# Benchmark the working tree this file sits in, whatever is installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray
from ray import serve as ray_serve

from cortex_ray import reclaim_signals, run_main, run_stoppable
from cortex_ray.models import ChatMessage, ChatRequest, ModelClient
from cortex_ray.models.llama_cpp import LlamaCppClient
from cortex_ray.models.openai_compatible import OpenAICompatibleClient
from serve.models import (
    LLM_NAME,
    DeploymentOptions,
    HandleModelClient,
    IngressConfig,
    LlmConfig,
    ModelServingConfig,
    build_models_app,
)

TARGET = 0.9
MODEL = "SmolLM2-135M-Instruct"
TOPICS = (
    "how Ray actors keep state",
    "why databases use write-ahead logs",
    "what a vector index does",
    "how to plan a small garden",
    "the water cycle",
    "why the sky is blue",
    "how a compiler works",
    "what makes a good README",
    "how bees make honey",
    "the rules of chess",
    "how rainbows form",
    "what an API key is",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(
    clients: dict[str, ModelClient], prompts: list[str], max_tokens: int
) -> dict[str, tuple[float, int]]:
    """Per kind: (completion tokens / wall seconds over all prompts, total tokens)."""
    seconds: dict[str, float] = dict.fromkeys(clients, 0.0)
    tokens: dict[str, int] = dict.fromkeys(clients, 0)
    for i, prompt in enumerate(["Say hi.", *prompts]):
        request = ChatRequest(
            messages=(ChatMessage(role="user", content=f"Explain {prompt} in a paragraph."),),
            temperature=0.0,
            max_tokens=max_tokens,
        )
        order = list(clients) if i % 2 == 0 else list(reversed(clients))
        for name in order:
            start = time.perf_counter()
            response = await clients[name].chat(request)
            elapsed = time.perf_counter() - start
            if i == 0:
                continue  # warm-up
            seconds[name] += elapsed
            tokens[name] += response.usage.completion_tokens
    return {k: (tokens[k] / seconds[k], tokens[k]) for k in clients}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
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
    prompts = [TOPICS[i % len(TOPICS)] for i in range(args.prompts)]

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    reclaim_signals()  # ray.init replaced SIGTERM's handler
    port = free_port()
    ray_serve.start(http_options={"host": "127.0.0.1", "port": port})
    no_cpu = DeploymentOptions(ray_actor_options={"num_cpus": 0})
    config = ModelServingConfig(
        embedder=None,
        reranker=None,
        llm=LlmConfig(
            default_max_tokens=args.max_tokens,
            deployment=DeploymentOptions(ray_actor_options={"num_cpus": 1}),
        ),
        ingress=IngressConfig(deployment=no_cpu),
    )
    local = LlamaCppClient()
    try:
        ray_serve.run(build_models_app(config), name="llm-bench", route_prefix="/llm")
        clients: dict[str, ModelClient] = {
            "in_process": local,
            "handle": HandleModelClient(
                ray_serve.get_deployment_handle(LLM_NAME, app_name="llm-bench"), MODEL
            ),
            "http": OpenAICompatibleClient(f"http://127.0.0.1:{port}/llm/v1", MODEL),
        }
        results = run_stoppable(measure(clients, prompts, args.max_tokens))
    finally:
        ray_serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()

    ratio = results["handle"][0] / results["in_process"][0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, ray {ray.__version__}; "
        f"model {local.name}; {args.prompts} prompts, max_tokens {args.max_tokens}, "
        f"temperature 0; Ray worker niceness {niceness}; load average {os.getloadavg()[0]:.1f}"
    )
    for name, (rate, total) in results.items():
        print(f"  {name:<11} {rate:7.1f} tokens/s ({total} tokens in all)")
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(f"  handle / in-process = {ratio:.2f}  (target >= {TARGET}) {verdict}")
    http_ratio = results["http"][0] / results["in_process"][0]
    print(f"  http / in-process   = {http_ratio:.2f}  (no target)")


if __name__ == "__main__":
    sys.exit(run_main(main))
