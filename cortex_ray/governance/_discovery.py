"""Connectors that installed packages offer, found through the Python entry point group
``cortex_ray.connectors`` (so the CLI and ``python -m serve`` know them without code).

Each entry point loads an object (a module does) with a ``connector`` (a ``Connector``) and
``tools`` (its ``Tool``s, each with ``connector=`` set)."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from cortex_ray._exceptions import ConfigurationError
from cortex_ray.governance._types import Connector

__all__ = ["CONNECTOR_ENTRY_POINTS", "discover_connectors"]

CONNECTOR_ENTRY_POINTS = "cortex_ray.connectors"


def discover_connectors() -> tuple[list[Connector], list[Any]]:
    """The connectors and their tools of every ``cortex_ray.connectors`` entry point.

    Raises:
        ConfigurationError: An entry point that does not load, or loads something without a
            ``Connector`` named ``connector``.
    """
    connectors: list[Connector] = []
    tools: list[Any] = []
    for point in entry_points(group=CONNECTOR_ENTRY_POINTS):
        try:
            bundle = point.load()
        except Exception as exc:
            raise ConfigurationError(
                f"connector entry point {point.name!r} does not load: {exc}"
            ) from exc
        connector = getattr(bundle, "connector", None)
        if not isinstance(connector, Connector):
            raise ConfigurationError(
                f"connector entry point {point.name!r} has no `connector` (a Connector)"
            )
        connectors.append(connector)
        tools.extend(getattr(bundle, "tools", ()))
    return connectors, tools
