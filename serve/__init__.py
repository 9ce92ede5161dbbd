"""cortex-ray on Ray Serve: the HTTP API (a FastAPI ingress deployment).

``create_app`` builds the FastAPI app around a runtime and an ``Executor`` (in-process or
session actors); ``ApiIngress`` / ``build_api`` deploy it on Ray Serve; ``run_local`` starts
it on this machine, bound to 127.0.0.1 unless configured (with ``serve_models``, beside the
model-serving app of ``serve.models``, which the replicas and actors then use). Routes,
auth and errors: docs/api.md.
"""

from cortex_ray import ApiOptions
from serve._app import ExecutorFactory, RuntimeFactory, create_app
from serve._deployment import (
    DEFAULT_APP_NAME,
    MODELS_ROUTE_PREFIX,
    ApiIngress,
    LocalApi,
    app_builder,
    build_api,
    run_local,
)
from serve._deps import ApiState

__all__ = [
    "DEFAULT_APP_NAME",
    "MODELS_ROUTE_PREFIX",
    "ApiIngress",
    "ApiOptions",
    "ApiState",
    "ExecutorFactory",
    "LocalApi",
    "RuntimeFactory",
    "app_builder",
    "build_api",
    "create_app",
    "run_local",
]
