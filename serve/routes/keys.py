"""Who an API key belongs to."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from cortex_ray import Principal
from serve._deps import ERRORS, authenticate
from serve.schemas import PrincipalBody

__all__ = ["keys_router"]


def keys_router() -> APIRouter:
    """``/api/me``: the principal of the request's API key."""
    router = APIRouter(prefix="/api", tags=["principals"], responses={401: ERRORS[401]})

    @router.get("/me", response_model=PrincipalBody, response_model_by_alias=True)
    async def whoami(principal: Annotated[Principal, Depends(authenticate)]) -> PrincipalBody:
        """The principal the API key belongs to (and so its organisation)."""
        return PrincipalBody.of(principal)

    return router
