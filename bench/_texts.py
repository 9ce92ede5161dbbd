"""Synthetic sentences for the embedding benchmarks: the same texts for every path compared.

Words from cortex-ray's own vocabulary, 8 to 40 per text, drawn from a seeded generator, so
a rerun (or another machine) embeds exactly the same inputs.
"""

from __future__ import annotations

import numpy as np

WORDS = [
    "agent",
    "memory",
    "cluster",
    "ray",
    "actor",
    "session",
    "retrieval",
    "vector",
    "postgres",
    "index",
    "passage",
    "section",
    "document",
    "citation",
    "planner",
    "candidate",
    "score",
    "tool",
    "gate",
    "audit",
    "principal",
    "grant",
    "episode",
    "fact",
    "persona",
    "skill",
    "observation",
    "budget",
    "step",
    "model",
    "token",
    "batch",
    "replica",
    "deployment",
]


def synthetic_texts(n: int, seed: int = 7) -> list[str]:
    """``n`` texts of 8 to 40 words; the same ``seed`` gives the same texts."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(8, 40)))) for _ in range(n)]
