"""GPU embedding check: cortex-ray's SentenceTransformerEmbedder on CUDA vs on the CPU.

Side by side in one run on the same machine and the same texts: texts/s at a fixed batch
size on each device, their ratio, and how far the GPU vectors are from the CPU ones
(minimum cosine similarity). Without CUDA it says so and exits 0, so the script can live in
the repository and run anywhere.

    python bench/gpu_embedding.py [--model PATH] [--texts 8192] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from _texts import synthetic_texts

from cortex_ray import run_main, run_stoppable
from cortex_ray.models.embeddings import SentenceTransformerEmbedder


def throughput(
    embedder: SentenceTransformerEmbedder, batch: list[str], rounds: int
) -> tuple[float, np.ndarray]:
    out = run_stoppable(embedder.embed(batch[:64]))  # warm-up (kernels, allocator)
    timings = []
    for _ in range(rounds):
        if embedder.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run_stoppable(embedder.embed(batch))
        if embedder.device.startswith("cuda"):
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    return len(batch) / statistics.median(timings), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: packaged MiniLM)")
    parser.add_argument("--texts", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: GPU embedding check skipped")
        return
    corpus = synthetic_texts(args.texts)
    gpu = SentenceTransformerEmbedder(args.model, device="cuda")
    cpu = SentenceTransformerEmbedder(args.model, device="cpu")
    gpu_rate, gpu_vecs = throughput(gpu, corpus, args.rounds)
    cpu_rate, cpu_vecs = throughput(cpu, corpus, args.rounds)
    cosine = np.sum(gpu_vecs * cpu_vecs, axis=1)
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "model_dim": gpu.dim,
        "texts": len(corpus),
        "batch_size": 64,
        "gpu_texts_per_s": round(gpu_rate, 1),
        "cpu_texts_per_s": round(cpu_rate, 1),
        "ratio_gpu_over_cpu": round(gpu_rate / cpu_rate, 2),
        "min_cosine_gpu_vs_cpu": round(float(cosine.min()), 6),
        "gpu_vectors_unit_norm": bool(
            np.allclose(np.linalg.norm(gpu_vecs, axis=1), 1.0, atol=1e-3)
        ),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(run_main(main))
