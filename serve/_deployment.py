"""The API as a Ray Serve ingress deployment, and a way to run it on this machine.

The FastAPI app is built in the replica (``__serve_build_asgi_app__``), not pickled from the
driver: the runtime (database pool, models) opens there, in the app's lifespan, and closes
when the replica stops. What crosses from the driver is only the recipe: ``Settings`` or a
picklable runtime factory, an executor factory, and the ``ApiOptions``.

Which executor drives runs and turns is a setting, ``Settings.sessions.executor``
(``CORTEX_SESSIONS__EXECUTOR``): ``actors`` (the default) builds an ``actors.SessionManager``
in the replica, so every run and conversation has its own session actor; ``in_process``
drives them as asyncio tasks of the replica (one replica only). An explicit executor factory
overrides the setting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from cortex_ray import (
    ApiOptions,
    ConfigurationError,
    Executor,
    InProcessExecutor,
    Runtime,
    Settings,
    load_settings,
)
from cortex_ray.storage import EmbeddedPostgres
from serve._app import ExecutorFactory, RuntimeFactory, create_app, options_for
from serve.models import LocalModels, served_settings, serving_config_for
from serve.models import run_local as run_models

try:
    from ray import serve as ray_serve
    from ray.serve import Application, Deployment
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the HTTP API on Ray Serve needs Ray: pip install 'cortex-ray[ray]'") from exc

__all__ = [
    "DEFAULT_APP_NAME",
    "MODELS_ROUTE_PREFIX",
    "ApiIngress",
    "LocalApi",
    "app_builder",
    "build_api",
    "executor_for_settings",
    "run_local",
]

log = logging.getLogger("serve.api")

DEFAULT_APP_NAME = "cortex-api"


def executor_for_settings(runtime: Runtime) -> Executor:
    """The executor ``runtime.settings.sessions.executor`` names, for the opened runtime.

    ``actors``: an ``actors.SessionManager`` on the database the runtime has open (its DSN,
    also the embedded server's); the actors open their own runtimes from the same settings,
    so a ``served`` model stays served. ``in_process``: an ``InProcessExecutor``.

    Module-level (pickled by reference): it travels to the replica as the executor factory.
    """
    if runtime.settings.sessions.executor == "in_process":
        return InProcessExecutor(runtime)
    # Imported here: the in-process choice (and a plain create_app) never needs actors/.
    from actors import SessionManager

    return SessionManager.for_runtime(runtime)


class _ApiReplica:
    """The HTTP API's Serve deployment (``ApiIngress``): one FastAPI app per replica.

    Args:
        runtime: ``Settings`` (``None``: from ``CORTEX_*`` in the replica's environment) or a
            picklable async factory returning an open ``Runtime``.
        executor: A picklable factory ``Runtime -> Executor``; ``None``: what the settings'
            ``sessions.executor`` names (:func:`executor_for_settings`), or, with a runtime
            factory, an ``InProcessExecutor`` (session actors open their runtime from
            settings and could not reproduce the factory's model: pass an executor factory).
        options: ``ApiOptions`` (``None``: the settings' ``api``, or ``CORTEX_API__*``).
    """

    def __init__(
        self,
        runtime: Settings | RuntimeFactory | None = None,
        executor: ExecutorFactory | None = None,
        options: ApiOptions | None = None,
    ) -> None:
        from actors import install_ray_metrics

        install_ray_metrics()  # this replica's API metrics (runs submitted, turns refused)
        self._runtime = runtime
        if executor is None and (runtime is None or isinstance(runtime, Settings)):
            executor = executor_for_settings
        self._executor = executor
        self._options = options

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._runtime, self._executor, options=self._options)


ApiIngress: Deployment = ray_serve.deployment(name="CortexApi")(ray_serve.ingress()(_ApiReplica))
"""The Serve deployment of the API (``ApiIngress.bind(runtime, executor, options)``)."""


def build_api(
    runtime: Settings | RuntimeFactory | None = None,
    executor: ExecutorFactory | None = None,
    *,
    options: ApiOptions | None = None,
) -> Application:
    """The API as a Serve application (``serve.run(build_api(...))``).

    Without ``executor``, settings (or ``None``: the replica's environment) choose it with
    ``sessions.executor``: session actors by default; a runtime factory gets the in-process
    executor (see ``ApiIngress``)."""
    opts = options or options_for(runtime)
    deployment = ApiIngress.options(
        num_replicas=opts.num_replicas,
        max_ongoing_requests=opts.max_ongoing_requests,
        ray_actor_options={"num_cpus": opts.num_cpus},
    )
    return deployment.bind(runtime, executor, opts)


def app_builder(args: dict[str, Any]) -> Application:
    """For ``serve run serve:app_builder`` and Serve config files (cluster/serve-*.yaml):
    settings from the replica's environment (``CORTEX_*``, ``CORTEX_API__*``, set through the
    application's ``runtime_env.env_vars``), including the executor
    (``CORTEX_SESSIONS__EXECUTOR``, session actors by default); no arguments are read."""
    if args:
        log.warning("serve.app_builder ignores its arguments: %s", sorted(args))
    return build_api()


MODELS_ROUTE_PREFIX = "/models"
"""Where ``run_local(serve_models=True)`` puts the model-serving app's OpenAI routes, beside
the API at ``/`` on the same proxy: ``http://127.0.0.1:8000/models/v1``."""


@dataclass
class LocalApi:
    """The API running on this machine's Ray: where it listens, and how to stop it.

    ``settings`` are what the replicas run with (the embedded database's DSN and, with
    ``serve_models``, the served backends filled in); ``models`` is the model-serving app
    started beside it, if any."""

    url: str
    name: str
    handle: DeploymentHandle[Any]
    embedded: EmbeddedPostgres | None = field(default=None, repr=False)
    models: LocalModels | None = None
    settings: Settings | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Delete the Serve applications (and stop the embedded PostgreSQL it started)."""
        ray_serve.delete(self.name)
        if self.models is not None:
            self.models.stop()
            self.models = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def run_local(
    runtime: Settings | RuntimeFactory | None = None,
    executor: ExecutorFactory | None = None,
    *,
    options: ApiOptions | None = None,
    name: str = DEFAULT_APP_NAME,
    route_prefix: str = "/",
    serve_models: bool = False,
) -> LocalApi:
    """Start Serve's HTTP proxy on ``options.host:options.port`` (127.0.0.1:8000 unless
    configured) and deploy the API there; returns once it is ready.

    Ray is started (``ray.init()``) if this process is not connected yet. With settings that
    name no database, the embedded PostgreSQL is started here, in the driver, and its DSN
    handed to the replicas, so every process of the stack shares one server.

    ``serve_models`` (settings only; what ``python -m serve`` and the demo do): the models
    the settings load in-process (``local``) move to the model-serving app
    (``serve.models``, deployed first, at ``/models``), and the API replica and the session
    actors reach them through handles, so no replica or actor loads weights of its own.
    """
    if runtime is None:
        runtime = load_settings()
    opts = options or options_for(runtime)
    embedded: EmbeddedPostgres | None = None
    models: LocalModels | None = None
    if isinstance(runtime, Settings) and not runtime.storage.database_url:
        embedded = EmbeddedPostgres(runtime.storage.data_dir / "pg")
        runtime = runtime.model_copy(update={"database_url": embedded.dsn})
    try:
        ray_serve.start(http_options={"host": opts.host, "port": opts.port})
        if serve_models:
            if not isinstance(runtime, Settings):
                raise ConfigurationError("serve_models needs Settings, not a runtime factory")
            runtime = served_settings(runtime)
            config = serving_config_for(runtime)
            if config is not None:
                models = run_models(
                    config,
                    host=opts.host,
                    port=opts.port,
                    name=runtime.models.app,
                    route_prefix=MODELS_ROUTE_PREFIX,
                )
        handle = ray_serve.run(
            build_api(runtime, executor, options=opts), name=name, route_prefix=route_prefix
        )
    except BaseException:
        if models is not None:
            models.stop()
        if embedded is not None:
            embedded.stop()
        raise
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "::") else opts.host
    prefix = "" if route_prefix == "/" else route_prefix
    settings = runtime if isinstance(runtime, Settings) else None
    return LocalApi(f"http://{host}:{opts.port}{prefix}", name, handle, embedded, models, settings)
