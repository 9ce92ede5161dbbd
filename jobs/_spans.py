"""Spans of the ingestion job's Ray Data tasks, under the job's own ``ingest`` span.

The driver hands its span's ``traceparent`` to every read task (in ``IngestOptions``) and to
the section writer (a constructor argument); each worker process opens a tracer provider
once, from its environment (``CORTEX_TRACING__*``, ``OTEL_*``), keeping spans in the job's
database when they are kept locally, and records one span per read task (a unit of files)
and per section batch. A job run without tracing hands no context on and its tasks record
nothing.
"""

from __future__ import annotations

import logging
import threading

from cortex_ray.observability import Tracing, tracer

__all__ = ["task_tracing"]

log = logging.getLogger("jobs.ingest")

_lock = threading.Lock()
_opened: list[Tracing] = []  # this worker process's provider, once opened


def task_tracing(traceparent: str | None, dsn: str | None) -> None:
    """Make sure this worker records the spans of a traced job (once per process)."""
    if traceparent is None or tracer.recording:
        return
    with _lock:
        if _opened or tracer.recording:
            return
        try:
            opened = Tracing.for_process(dsn)
        except Exception as exc:  # never the job's problem
            log.warning("this ingestion worker records no spans: %s", exc)
            return
        if opened is not None:
            _opened.append(opened)  # lives as long as the worker; spans flush every 0.5 s
