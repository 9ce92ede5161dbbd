"""``python -m serve``: run the HTTP API on this machine until Ctrl-C or SIGTERM.

Connects to a running Ray (``RAY_ADDRESS``) or starts a local one, deploys the model-serving
app (the models the settings would load in-process, at ``/models/v1``) and the API with
``run_local(serve_models=True)``. ``--in-process-models`` keeps the models in the API replica
instead.

SIGINT or SIGTERM (also SIGINT when the process started with it ignored, as a background job
does) stops it: both apps are deleted (the replicas close their runtimes), the embedded
PostgreSQL it started is stopped, and a Ray it started is shut down; then it exits 0. A
second signal exits at once (130 or 143). See docs/operations.md, "Stopping".

Runs and conversations are driven by session actors (one per run or session) unless
``CORTEX_SESSIONS__EXECUTOR=in_process`` asks for the replica's own asyncio tasks.
"""

from __future__ import annotations

import argparse
import sys

from cortex_ray import ApiOptions, load_settings
from serve import run_local
from serve._lifecycle import Interrupted, ray_driver


def main(argv: list[str] | None = None) -> int:
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
    try:
        # RAY_ADDRESS, or a local Ray (dashboard on 127.0.0.1), announced in the data dir
        with ray_driver(announce=settings.storage.data_dir) as driver:
            api = run_local(settings, serve_models=not args.in_process_models)
            driver.callback(api.stop)
            print(
                f"cortex-ray API on {api.url} (docs: {api.url}/docs); Ctrl-C stops it", flush=True
            )
            if driver.dashboard_url:
                print(f"Ray dashboard on {driver.dashboard_url}", flush=True)
            if api.models is not None:
                print(f"models (OpenAI-compatible) on {api.models.openai_base_url}", flush=True)
            driver.wait()
    except Interrupted:
        pass  # a server's normal way to stop: exit 0 once everything is cleaned up
    return 0


if __name__ == "__main__":
    sys.exit(main())
