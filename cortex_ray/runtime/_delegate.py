"""``delegate``: a façade's method that is one line, typed with the method it forwards to.

``list_agents = delegate("agents", AgentUseCases.list_agents)`` on a class makes
``obj.list_agents(...)`` call ``obj.agents.list_agents(...)``, with that method's own
signature for type checkers (a ``ParamSpec``) and its docstring for readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

__all__ = ["Delegate", "delegate"]

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


class Delegate(Generic[S, P, R]):
    """A non-data descriptor: reads ``getattr(obj, service)`` on every access, so a service
    replaced on the object is the one called; an instance attribute of the same name (a
    test's stand-in) shadows it."""

    def __init__(self, service: str, method: Callable[Concatenate[S, P], R]) -> None:
        self.service = service
        self.method_name = method.__name__
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Delegate[S, P, R]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        bound: Callable[P, R] = getattr(getattr(obj, self.service), self.method_name)
        return bound


def delegate(service: str, method: Callable[Concatenate[S, P], R]) -> Delegate[S, P, R]:
    """The method ``method`` of the object's attribute ``service``, as the object's own."""
    return Delegate(service, method)
