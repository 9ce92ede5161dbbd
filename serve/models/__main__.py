"""``python -m serve.models``: serve the models on this machine until Ctrl-C or SIGTERM.

Connects to a running Ray (``RAY_ADDRESS``) or starts a local one, deploys the CPU default
(or ``--config FILE``: a ``ModelServingConfig`` as YAML or JSON) on 127.0.0.1:8000 unless
told otherwise. SIGINT or SIGTERM (also SIGINT ignored at start) deletes the application,
shuts down a Ray it started, and exits 0; a second signal exits at once (130 or 143).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from serve._lifecycle import Interrupted, ray_driver
from serve.models._builder import DEFAULT_MODELS_APP, run_local
from serve.models._config import ModelServingConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve.models",
        description="Serve embeddings, reranking and chat on Ray Serve (OpenAI-compatible).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--name", default=DEFAULT_MODELS_APP, help="Serve application name")
    parser.add_argument("--route-prefix", default="/", help="route prefix (default /)")
    parser.add_argument("--config", type=Path, help="a ModelServingConfig as YAML or JSON")
    args = parser.parse_args(argv)
    raw: dict[str, object] = {}
    if args.config is not None:
        text = args.config.read_text()
        raw = json.loads(text) if args.config.suffix == ".json" else yaml.safe_load(text) or {}
    config = ModelServingConfig.model_validate(raw)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        with ray_driver() as driver:  # RAY_ADDRESS, or a local Ray
            models = run_local(
                config,
                host=args.host,
                port=args.port,
                name=args.name,
                route_prefix=args.route_prefix,
            )
            driver.callback(models.stop)
            print(
                f"cortex-ray models on {models.openai_base_url} "
                f"({', '.join(config.model_ids())}); Ctrl-C stops it",
                flush=True,
            )
            driver.wait()
    except Interrupted:
        pass  # a server's normal way to stop: exit 0 once everything is cleaned up
    return 0


if __name__ == "__main__":
    sys.exit(main())
