"""The decision cycle's spans, which cost nothing when nothing records them.

Spans go to the tracer provider a ``Runtime`` activated (``activate_provider``: the one
``cortex_ray.observability.Tracing`` builds from the settings, with the OTLP exporter
and/or the local span store), else to OpenTelemetry's global provider if a program set
one (``opentelemetry-instrument``, ``trace.set_tracer_provider``), else nowhere.

Without a recording provider the API hands out spans that record nothing, yet entering and
leaving one still swaps the current span in the context, builds its attributes and runs two
context managers. A cycle step opens five or six of them: measured in
bench/cycle_overhead.py, skipping them saves ~0.1 ms of client CPU a step (issue 12). What
is observable stays the same: with no provider the API's span would carry its parent's
span context (or be the current non-recording span itself), so the current span context
seen inside is the one outside, and ``set_attribute`` on the yielded ``INVALID_SPAN`` is the
no-op it was.

Likewise under a sampled-out parent, when the provider's sampler follows the parent's
decision (``ParentBased``, OpenTelemetry's default, and every ``parentbased_*`` sampler of
``OTEL_TRACES_SAMPLER``): the SDK would consult the sampler, make a new non-recording span
and swap it into the context, ~17 µs a span that nothing ever sees (issue 16, point 8: most
of what a run sampled out still cost). The parent's non-recording span is yielded instead;
its trace id and sampled flag, all that a caller can read from it, are the same.

The runtime's provider is not made OpenTelemetry's global one on purpose: that can be set
only once per process, and a process may open several runtimes (tests, the evaluation
harness) or already have the program's own provider. Parenting does not depend on it: the
current span lives in the context, whichever provider made it.
"""

from __future__ import annotations

import random
import threading
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_DATA_SOURCE_ID,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from cortex_ray._types import TaskRun

__all__ = [
    "GEN_AI_AGENT_ID",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_DATA_SOURCE_ID",
    "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_OUTPUT_MESSAGES",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_REQUEST_TEMPERATURE",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_TOOL_CALL_ARGUMENTS",
    "GEN_AI_TOOL_CALL_RESULT",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_TOOL_TYPE",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "SEMCONV_VERSION",
    "TRACE_CONTEXT",
    "Link",
    "SpanContext",
    "SpanKind",
    "Status",
    "StatusCode",
    "activate_provider",
    "active_provider",
    "attempt_link",
    "context_of",
    "current_traceparent",
    "deactivate_provider",
    "end_run_span",
    "outgoing_traceparent",
    "server_span",
    "start_child_span",
    "submission_span",
    "tracer",
]

SEMCONV_VERSION = "1.44.0"
"""The OpenTelemetry semantic conventions the spans follow: the GenAI attribute names of
``opentelemetry-semantic-conventions==0.66b2`` (schema 1.44.0; the GenAI part is still
"development" status, so the names are pinned with the package)."""

_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

_lock = threading.Lock()
_active: list[trace.TracerProvider] = []
_tracers: dict[int, trace.Tracer] = {}
_parent_decides: dict[int, tuple[bool, bool]] = {}


def activate_provider(provider: trace.TracerProvider) -> None:
    """Send this process's cycle spans to ``provider`` (the latest activated wins) until
    :func:`deactivate_provider`."""
    with _lock:
        _active.append(provider)


def deactivate_provider(provider: trace.TracerProvider) -> None:
    with _lock:
        if provider in _active:
            _active.remove(provider)
        _tracers.pop(id(provider), None)
        _parent_decides.pop(id(provider), None)


def active_provider() -> trace.TracerProvider | None:
    """The provider spans go to now, or ``None`` when nothing records them."""
    if _active:
        return _active[-1]
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, _NO_PROVIDER) else provider


def _drops_unsampled_children(provider: trace.TracerProvider) -> tuple[bool, bool]:
    """Whether ``provider`` records nothing under a not-sampled (local, remote) parent."""
    found = _parent_decides.get(id(provider))
    if found is None:
        sampler = getattr(provider, "sampler", None)
        found = (
            (
                getattr(sampler, "_local_parent_not_sampled", None) is ALWAYS_OFF,
                getattr(sampler, "_remote_parent_not_sampled", None) is ALWAYS_OFF,
            )
            if isinstance(sampler, ParentBased)
            else (False, False)
        )
        _parent_decides[id(provider)] = found
    return found


class _CycleTracer:
    """``start_as_current_span`` of the ``cortex_ray`` tracer, or nothing without a provider
    or under a sampled-out parent whose decision the sampler follows."""

    def _tracer(self) -> trace.Tracer | None:
        provider = active_provider()
        if provider is None:
            return None
        found = _tracers.get(id(provider))
        if found is None:
            found = _tracers[id(provider)] = provider.get_tracer("cortex_ray")
        return found

    @staticmethod
    def _sampled_out(context: object | None) -> trace.Span | None:
        """The current span, when it is a sampled-out parent the new span would follow."""
        if context is not None:
            return None
        current = trace.get_current_span()
        ctx = current.get_span_context()
        if not ctx.is_valid or ctx.trace_flags.sampled:
            return None
        provider = active_provider()
        if provider is None:
            return None
        local, remote = _drops_unsampled_children(provider)
        return current if (remote if ctx.is_remote else local) else None

    def start_as_current_span(
        self,
        name: str,
        attributes: Attributes = None,
        *,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        links: list[trace.Link] | None = None,
        context: object | None = None,
    ) -> AbstractContextManager[trace.Span]:
        found = self._tracer()
        if found is None:
            return nullcontext(trace.INVALID_SPAN)
        if (parent := self._sampled_out(context)) is not None:
            return nullcontext(parent)
        return found.start_as_current_span(
            name,
            attributes=attributes,
            kind=kind,
            links=links,
            context=context,  # type: ignore[arg-type]
        )

    @property
    def recording(self) -> bool:
        """Whether spans are recorded now (content capture is skipped when they are not)."""
        return active_provider() is not None


tracer = _CycleTracer()


TRACE_CONTEXT = TraceContextTextMapPropagator()
"""W3C Trace Context (``traceparent``/``tracestate``): what crosses process boundaries."""


def submission_span(name: str, attributes: Attributes = None) -> AbstractContextManager[trace.Span]:
    """A span for submitting work that later runs elsewhere (a run, a turn), when nothing
    else stands for the submission: with no current span (a Python caller, the CLI) it is
    the real root that every attempt's spans hang under, so a collector sees one tree with
    no missing parent. Inside a span (an HTTP request's) it is that span, and nothing new."""
    if active_provider() is None or trace.get_current_span().get_span_context().is_valid:
        return nullcontext(trace.get_current_span())
    return tracer.start_as_current_span(name, attributes)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` a new run should belong to: the current span's (an HTTP
    request, a caller's own span, a :func:`submission_span`), else a fresh one standing for
    the run; ``None`` when nothing records spans (no cost, nothing stored)."""
    if active_provider() is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        ctx = SpanContext(
            trace_id=random.getrandbits(128) or 1,
            span_id=random.getrandbits(64) or 1,
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def outgoing_traceparent() -> str | None:
    """The ``traceparent`` to hand a call into another process (a Serve handle call, a Ray
    task): the current span's, when one records and is sampled; ``None`` otherwise, and the
    callee then records nothing for it."""
    if active_provider() is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def server_span(
    name: str, traceparent: str | None, attributes: Attributes = None
) -> AbstractContextManager[trace.Span]:
    """The callee's side of :func:`outgoing_traceparent`: a SERVER span under the caller's
    span (a model deployment's ``chat {model}``, an ingestion task's batch), or nothing when
    the caller sent no context or this process records no spans."""
    if not traceparent or active_provider() is None:
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(
        name, attributes, kind=trace.SpanKind.SERVER, context=context_of(traceparent)
    )


def start_child_span(
    name: str, traceparent: str | None, attributes: Attributes = None
) -> trace.Span:
    """:func:`server_span` for work that is not one call (a generator that yields blocks, a
    Ray Data read task): started, not made current; the caller ends it. ``INVALID_SPAN``
    (ending it is a no-op) without context or provider."""
    provider = active_provider()
    if not traceparent or provider is None:
        return trace.INVALID_SPAN
    return provider.get_tracer("cortex_ray").start_span(
        name, context_of(traceparent), kind=trace.SpanKind.SERVER, attributes=attributes
    )


def context_of(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` stands for (``None``: start a new trace)."""
    if not traceparent:
        return None
    return TRACE_CONTEXT.extract({"traceparent": traceparent})


def attempt_link(traceparent: str | None, attempt_span_id: str | None) -> list[Link]:
    """A link to the run's previous attempt (same trace), if there was one."""
    if not traceparent or not attempt_span_id:
        return []
    parts = traceparent.split("-")
    try:
        trace_id, span_id = int(parts[1], 16), int(attempt_span_id, 16)
    except (IndexError, ValueError):
        return []
    previous = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True)
    return [Link(previous, {"cortex.link": "previous attempt"})]


def end_run_span(span: trace.Span, run: TaskRun) -> None:
    """Mark an agent-invocation span with how its run ended (a failed run is an error)."""
    span.set_attribute("cortex.status", run.status.value)
    if run.status.value == "FAILED":
        span.set_status(Status(StatusCode.ERROR, (run.reason or "failed")[:200]))
