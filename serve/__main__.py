"""``python -m serve``: run the HTTP API on this machine until Ctrl-C or SIGTERM.

Connects to a running Ray (``RAY_ADDRESS``) or starts a local one, deploys the model-serving
app (the models the settings would load in-process, at ``/models/v1``) and the API with
``run_local(serve_models=True)`` and, on the way out, deletes both (and stops what it
started). ``--in-process-models`` keeps the models in the API replica instead.

Runs and conversations are driven by session actors (one per run or session) unless
``CORTEX_SESSIONS__EXECUTOR=in_process`` asks for the replica's own asyncio tasks.
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType

import ray

from cortex_ray import ApiOptions, load_settings
from serve import run_local


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m serve",
        description="Serve the cortex-ray HTTP API on Ray Serve. Settings come from CORTEX_* "
        "and CORTEX_API__* environment variables.",
    )
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8000)")
    parser.add_argument(
        "--in-process-models",
        action="store_true",
        help="load the models in the API replica (and each session actor) instead of "
        "deploying the model-serving app beside the API",
    )
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = load_settings()  # a bad value names its CORTEX_ variable
    options = ApiOptions.model_validate({**settings.api.model_dump(), **overrides})
    settings = settings.model_copy(update={"api": options})
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init()  # RAY_ADDRESS, or a local Ray
    # After ray.init: Ray's core worker installs a SIGTERM handler that logs and kills the
    # process; ours replaces it so that the apps are deleted and the embedded PostgreSQL
    # stopped. A background job inherits SIGINT ignored; a service manager sends SIGTERM.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        api = run_local(settings, serve_models=not args.in_process_models)
        print(f"cortex-ray API on {api.url} (docs: {api.url}/docs); Ctrl-C stops it", flush=True)
        if api.models is not None:
            print(f"models (OpenAI-compatible) on {api.models.openai_base_url}", flush=True)
        try:
            threading.Event().wait()
        finally:
            api.stop()
    except KeyboardInterrupt:
        pass
    finally:
        if started_ray:
            ray.shutdown()


if __name__ == "__main__":
    main()
