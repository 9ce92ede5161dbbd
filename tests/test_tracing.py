"""The cycle's spans: nothing without a tracer provider, recorded as before with one."""

from __future__ import annotations

import pytest
from opentelemetry import trace

import cortex_ray.observability._spans
from cortex_ray.observability import tracer

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_runtime_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process with no runtime open: a runtime another test left open (its
    provider still active) must not decide what these see."""
    monkeypatch.setattr(cortex_ray.observability._spans, "_active", [])


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


def test_under_a_sampled_out_parent_nothing_is_made_and_nothing_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a sampler that follows the parent's decision (the ``parentbased_*`` ones), a
    child of a sampled-out span is that span itself: what the SDK would have made (a new
    non-recording span of the same trace, not sampled) shows nothing else to a caller."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    sampling = pytest.importorskip("opentelemetry.sdk.trace.sampling")
    for sampler, reused in (
        (sampling.ParentBasedTraceIdRatio(0.0), True),
        (sampling.TraceIdRatioBased(0.0), False),
    ):
        exporter = memory.InMemorySpanExporter()
        provider = sdk.TracerProvider(sampler=sampler)
        provider.add_span_processor(export.SimpleSpanProcessor(exporter))
        cortex_ray.observability._spans.activate_provider(provider)
        try:
            with tracer.start_as_current_span("invoke_agent a") as root:
                assert not root.is_recording()
                with tracer.start_as_current_span("step 0", attributes={"n": 1}) as child:
                    assert not child.is_recording()
                    child.set_attribute("cortex.decision", "act")
                    seen = trace.get_current_span().get_span_context()
                    assert seen.trace_id == root.get_span_context().trace_id
                    assert not seen.trace_flags.sampled
                    assert (child is root) is reused
        finally:
            cortex_ray.observability._spans.deactivate_provider(provider)
        assert exporter.get_finished_spans() == ()
