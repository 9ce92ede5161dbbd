"""What a platform team reads about a run: traces (where spans go, how a run's trace reads
back), and the secret scrubber and bounded content capture that spans, diagnostics and
audit records share."""

from cortex_ray._tracing import (
    TRACE_CONTEXT,
    context_of,
    current_traceparent,
    outgoing_traceparent,
    server_span,
    start_child_span,
    tracer,
)
from cortex_ray.observability._capture import bound_messages, bound_text, captured
from cortex_ray.observability._scrub import REDACTED, is_secret_key, scrub, scrub_text
from cortex_ray.observability._tracing import PostgresSpanExporter, Tracing, otlp_endpoint
from cortex_ray.observability._view import RunTrace, TraceSpan, waterfall

__all__ = [
    "REDACTED",
    "TRACE_CONTEXT",
    "PostgresSpanExporter",
    "RunTrace",
    "TraceSpan",
    "Tracing",
    "bound_messages",
    "bound_text",
    "captured",
    "context_of",
    "current_traceparent",
    "is_secret_key",
    "otlp_endpoint",
    "outgoing_traceparent",
    "scrub",
    "scrub_text",
    "server_span",
    "start_child_span",
    "tracer",
    "waterfall",
]
