"""Liveness and readiness (open: no key)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from serve._deps import state_of
from serve.schemas import ApiError, Health

__all__ = ["health_router"]


def health_router() -> APIRouter:
    """The open probes: liveness and readiness."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """Liveness: the process answers. Open (no key)."""
        return Health(status="ok")

    @router.get(
        "/readyz",
        response_model=Health,
        responses={503: {"model": ApiError, "description": "not ready"}},
    )
    async def readyz(request: Request) -> Health:
        """Readiness: the runtime is open and the database answers. Open (no key)."""
        await state_of(request).runtime.ping()
        return Health(status="ready")

    return router
