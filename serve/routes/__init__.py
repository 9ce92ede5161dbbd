"""The HTTP API's routers, one module per domain of the door (``cortex_ray.Runtime``):
each route parses, calls one use case and renders.

Shared dependencies (the bearer key, the organisation member, error responses) live in
``serve._deps``; ``serve._app`` includes these routers in ``ROUTERS``' order.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from serve.routes.agents import agents_router
from serve.routes.connectors import connectors_router
from serve.routes.evals import evals_router
from serve.routes.governance import governance_router
from serve.routes.graph import graph_router
from serve.routes.health import health_router
from serve.routes.keys import keys_router
from serve.routes.knowledge import knowledge_router
from serve.routes.memory import memory_router
from serve.routes.runs import runs_router
from serve.routes.sessions import sessions_router
from serve.routes.tools import tools_router
from serve.routes.workflows import workflows_router

__all__ = [
    "ROUTERS",
    "agents_router",
    "connectors_router",
    "evals_router",
    "governance_router",
    "graph_router",
    "health_router",
    "keys_router",
    "knowledge_router",
    "memory_router",
    "runs_router",
    "sessions_router",
    "tools_router",
    "workflows_router",
]

ROUTERS: tuple[Callable[[], APIRouter], ...] = (
    health_router,
    keys_router,
    agents_router,
    memory_router,
    knowledge_router,
    runs_router,
    sessions_router,
    tools_router,
    evals_router,
    governance_router,
    connectors_router,
    graph_router,
    workflows_router,
)
"""Every router of the API, in the order the app includes them."""
