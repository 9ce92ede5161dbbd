"""Agents over A2A (the Agent2Agent protocol, ``a2a-sdk``): each published agent's card and
JSON-RPC endpoint, mounted in the API app, mapped onto sessions and runs through the same
use cases as the HTTP routes (docs/a2a.md)."""

from serve.a2a._call import A2ACall, published
from serve.a2a._handler import RuntimeRequestHandler
from serve.a2a._routes import A2A_PREFIX, a2a_router

__all__ = ["A2A_PREFIX", "A2ACall", "RuntimeRequestHandler", "a2a_router", "published"]
