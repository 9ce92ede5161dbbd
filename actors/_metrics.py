"""cortex-ray's metrics on Ray's metrics endpoint, through ``ray.util.metrics``.

The core records through ``cortex_ray.observability.metrics`` and names every metric there;
:class:`RayMetrics` creates each ``Counter``, ``Histogram`` or ``Gauge`` the first time it
is recorded in a process and hands it the value. Ray's metrics agent on each node exports
them (prefixed ``ray_``) with Ray's own, on the port Prometheus scrapes
(``metrics_export_port``; see docs/operations.md, "Metrics").

:func:`install_ray_metrics` is called by every process of the stack that runs on Ray: the
API replicas, session actors, the session directory, the ingestion driver and its workers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ray.util import metrics as ray_metrics

from cortex_ray.observability import metrics

__all__ = ["RayMetrics", "install_ray_metrics"]


class RayMetrics:
    """A ``cortex_ray.observability.metrics.MetricsSink`` over ``ray.util.metrics``."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _metric(self, spec: metrics.MetricSpec) -> Any:
        made = self._made.get(spec.name)
        if made is not None:
            return made
        with self._lock:
            made = self._made.get(spec.name)
            if made is None:
                if spec.kind == "counter":
                    made = ray_metrics.Counter(spec.name, spec.description, spec.labels)
                elif spec.kind == "histogram":
                    made = ray_metrics.Histogram(
                        spec.name, spec.description, list(spec.boundaries), spec.labels
                    )
                else:
                    made = ray_metrics.Gauge(spec.name, spec.description, spec.labels)
                self._made[spec.name] = made
        return made

    def record(self, spec: metrics.MetricSpec, value: float, labels: Mapping[str, str]) -> None:
        made = self._metric(spec)
        tags = dict(labels)
        if spec.kind == "counter":
            if value > 0:
                made.inc(value, tags=tags)
        elif spec.kind == "histogram":
            made.observe(value, tags=tags)
        else:
            made.set(value, tags=tags)


_installed: list[RayMetrics] = []
_lock = threading.Lock()


def install_ray_metrics() -> RayMetrics:
    """This process's ``RayMetrics``, installed once (call it where Ray is connected)."""
    with _lock:
        if not _installed:
            sink = RayMetrics()
            metrics.install_metrics(sink)
            _installed.append(sink)
        return _installed[0]
