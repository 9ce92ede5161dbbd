"""cortex-ray's metrics on Ray's metrics endpoint, through ``ray.util.metrics``.

The core records through ``cortex_ray.observability.metrics`` and names every metric there;
:class:`RayMetrics` creates each ``Counter``, ``Histogram`` or ``Gauge`` the first time it
is recorded in a process and hands it the values. Ray's metrics agent on each node exports
them (prefixed ``ray_``) with Ray's own, on the port Prometheus scrapes
(``metrics_export_port``; see docs/operations.md, "Metrics").

Recording is off the caller's path: ``record`` appends to a buffer (about a microsecond),
and a daemon thread hands the buffer to Ray every ``flush_s`` (counters summed per label
set first), mostly while the event loop waits on the database. Ray's agent reports every
few seconds anyway, so nothing is late that Prometheus would have seen; what is buffered
when the process exits is handed over by an exit hook.

:func:`install_ray_metrics` is called by every process of the stack that runs on Ray: the
API replicas, session actors, the session directory, the ingestion driver.
"""

from __future__ import annotations

import atexit
import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from ray.util import metrics as ray_metrics

from cortex_ray.observability import metrics

__all__ = ["RayMetrics", "install_ray_metrics"]

Labels = tuple[tuple[str, str], ...]


class RayMetrics:
    """A ``cortex_ray.observability.metrics.MetricsSink`` over ``ray.util.metrics``."""

    def __init__(self, flush_s: float = 0.5) -> None:
        self._made: dict[str, Any] = {}
        self._pending: list[tuple[metrics.MetricSpec, float, Labels]] = []
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._flush_s = flush_s
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cortex-metrics", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def record(self, spec: metrics.MetricSpec, value: float, labels: Mapping[str, str]) -> None:
        item = (spec, value, tuple(labels.items()))
        with self._lock:
            self._pending.append(item)

    def flush(self) -> None:
        """Hand everything buffered to Ray now."""
        with self._flushing:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        counted: dict[tuple[str, Labels], float] = defaultdict(float)
        specs: dict[str, metrics.MetricSpec] = {}
        for spec, value, labels in batch:
            if spec.kind == "counter":
                counted[(spec.name, labels)] += value
                specs[spec.name] = spec
            elif spec.kind == "histogram":
                self._metric(spec).observe(value, tags=dict(labels))
            else:
                self._metric(spec).set(value, tags=dict(labels))
        for (name, labels), total in counted.items():
            if total > 0:
                self._metric(specs[name]).inc(total, tags=dict(labels))

    def _at_exit(self) -> None:
        try:
            self.flush()
        except Exception:  # pragma: no cover - Ray already disconnected: nothing to tell
            return

    def _run(self) -> None:
        while not self._wake.wait(self._flush_s):
            try:
                self.flush()
            except Exception:  # pragma: no cover - Ray gone (shutting down): keep quiet
                continue

    def _metric(self, spec: metrics.MetricSpec) -> Any:
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
