"""The cycle's spans: nothing without a tracer provider, recorded as before with one."""

from __future__ import annotations

import pytest
from opentelemetry import trace

import cortex_ray._tracing
from cortex_ray._tracing import tracer


@pytest.fixture(autouse=True)
def _no_runtime_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process with no runtime open: a runtime another test left open (its
    provider still active) must not decide what these see."""
    monkeypatch.setattr(cortex_ray._tracing, "_active", [])


def test_without_a_provider_the_current_span_is_left_as_it_is() -> None:
    outside = trace.get_current_span()
    with tracer.start_as_current_span("cortex.step", attributes={"cortex.step": 1}) as span:
        assert not span.is_recording()
        span.set_attribute("cortex.status", "OK")  # a no-op, as on the API's own span
        assert trace.get_current_span().get_span_context() == outside.get_span_context()


def test_with_a_provider_spans_are_recorded_with_their_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    with tracer.start_as_current_span("cortex.act", attributes={"cortex.tool": "t"}) as span:
        assert span.is_recording()
        span.set_attribute("cortex.status", "OK")
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "cortex.act"
    assert dict(finished.attributes or {}) == {"cortex.tool": "t", "cortex.status": "OK"}
