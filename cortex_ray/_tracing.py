"""The decision cycle's spans, which cost nothing when no OpenTelemetry SDK is set up.

Without a tracer provider (none set in code, none named by ``OTEL_PYTHON_TRACER_PROVIDER``,
or the no-op one) the API hands out spans that record nothing, yet entering and leaving
one still swaps the current span in the context, builds its attributes and runs two
context managers. A cycle step opens five or six of them: measured in
bench/cycle_overhead.py, skipping them saves ~0.1 ms of client CPU a step (issue 12).

What is observable stays the same: with no provider the API's span would carry its
parent's span context (or be the current non-recording span itself), so the current span
context seen inside is the one outside, and ``set_attribute`` on the yielded
``INVALID_SPAN`` is the no-op it was. Once a provider is set (``opentelemetry-instrument``,
``trace.set_tracer_provider``), every span is created as before.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from opentelemetry import trace
from opentelemetry.util.types import Attributes

__all__ = ["tracer"]

_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


class _CycleTracer:
    """``start_as_current_span`` of the ``cortex_ray`` tracer, or nothing without a provider."""

    def __init__(self) -> None:
        self._tracer = trace.get_tracer("cortex_ray")

    def start_as_current_span(
        self, name: str, attributes: Attributes = None
    ) -> AbstractContextManager[trace.Span]:
        if isinstance(trace.get_tracer_provider(), _NO_PROVIDER):
            return nullcontext(trace.INVALID_SPAN)
        return self._tracer.start_as_current_span(name, attributes=attributes)


tracer = _CycleTracer()
