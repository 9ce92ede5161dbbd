"""What cortex-ray counts and times, and the seam it is recorded through.

The core names every metric once here (:data:`METRICS`: name, kind, labels, buckets) and
records through :func:`record`, which costs one list check while no sink is installed. A
process on Ray installs ``actors.RayMetrics`` (``ray.util.metrics``), so the values reach
the node's metrics endpoint that Prometheus scrapes; the core itself imports no Ray.

Labels are few and bounded (organisation, agent name, tool, action category, model,
outcome, phase): never a run, session or turn id. Prometheus sees each name with Ray's
``ray_`` prefix, counters with ``_total`` (``cortex_runs_started`` →
``ray_cortex_runs_started_total``).

The two model-call histograms carry the names and buckets of the OpenTelemetry GenAI
conventions (1.44.0): ``gen_ai.client.operation.duration`` (seconds) and
``gen_ai.client.token.usage`` (tokens), written with underscores as Prometheus spells them.
The cycle's own durations (phases, tools, knowledge search) use the same duration buckets,
with three more below 10 ms, where a perceive or a search often lands.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "ACCESS_DENIALS",
    "INGEST_BYTES",
    "INGEST_FILES",
    "INGEST_PASSAGES",
    "KNOWLEDGE_SEARCH_DURATION",
    "LOOPS_DETECTED",
    "MCP_CALLS",
    "METRICS",
    "MODEL_DURATION",
    "MODEL_TOKENS",
    "PHASE_DURATION",
    "RUNS_FINISHED",
    "RUNS_REJECTED",
    "RUNS_STARTED",
    "SESSION_ACTORS",
    "SESSION_PASSIVATIONS",
    "SESSION_REACTIVATIONS",
    "STEPS",
    "TOOL_CALLS",
    "TOOL_DURATION",
    "TURNS_FINISHED",
    "TURNS_REJECTED",
    "MetricSpec",
    "MetricsSink",
    "install_metrics",
    "metrics_installed",
    "record",
    "uninstall_metrics",
]

GENAI_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""``gen_ai.client.operation.duration``'s explicit bucket boundaries (seconds)."""

GENAI_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""``gen_ai.client.token.usage``'s explicit bucket boundaries (tokens)."""

CYCLE_DURATION_BUCKETS = (0.001, 0.0025, 0.005, *GENAI_DURATION_BUCKETS)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what a sink creates once and records into."""

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    description: str
    labels: tuple[str, ...]
    boundaries: tuple[float, ...] = ()

    @property
    def prometheus_name(self) -> str:
        """The name Prometheus shows for it when it comes from Ray's metrics endpoint."""
        return f"ray_{self.name}" + ("_total" if self.kind == "counter" else "")


def _counter(name: str, description: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, "counter", description, labels)


def _histogram(
    name: str, description: str, *labels: str, boundaries: tuple[float, ...]
) -> MetricSpec:
    return MetricSpec(name, "histogram", description, labels, boundaries)


RUNS_STARTED = _counter("cortex_runs_started", "Task runs submitted", "org", "agent")
RUNS_REJECTED = _counter(
    "cortex_runs_rejected", "Runs refused before they were recorded (503: at capacity)", "org",
    "reason",
)  # fmt: skip
RUNS_FINISHED = _counter(
    "cortex_runs_finished", "Task runs ended, by outcome (COMPLETED, FAILED, CANCELLED)",
    "org", "agent", "outcome",
)  # fmt: skip
STEPS = _counter(
    "cortex_steps", "Decision cycles of autonomous runs, by decision (ACT, FINISH, ...)", "org",
    "agent", "decision",
)  # fmt: skip
TOOL_CALLS = _counter(
    "cortex_tool_calls", "Tool calls through the gate, by tool, action category and status",
    "org", "agent", "tool", "category", "outcome",
)  # fmt: skip
MCP_CALLS = _counter(
    "cortex_mcp_calls", "Calls sent to MCP servers, by connector, the server's tool name and "
    "outcome (ok, tool_error, timeout, unavailable, input_declined)", "org", "connector",
    "tool", "outcome",
)  # fmt: skip
ACCESS_DENIALS = _counter(
    "cortex_access_denials", "Tool calls the gate refused (the tool's code never ran)", "org",
    "agent", "tool",
)  # fmt: skip
LOOPS_DETECTED = _counter(
    "cortex_loops_detected",
    "Runs that proposed the same action with the same arguments again and again",
    "org", "agent", "tool",
)  # fmt: skip
PHASE_DURATION = _histogram(
    "cortex_phase_duration_seconds", "One phase of a decision cycle (perceive, decide, act, "
    "learn)", "org", "agent", "phase", boundaries=CYCLE_DURATION_BUCKETS,
)  # fmt: skip
TOOL_DURATION = _histogram(
    "cortex_tool_duration_seconds", "One tool call through the gate", "org", "tool", "category",
    boundaries=CYCLE_DURATION_BUCKETS,
)  # fmt: skip
MODEL_DURATION = _histogram(
    "gen_ai_client_operation_duration_seconds",
    "GenAI operation duration (gen_ai.client.operation.duration): chat and embeddings calls",
    "gen_ai_operation_name", "gen_ai_request_model", "outcome",
    boundaries=GENAI_DURATION_BUCKETS,
)  # fmt: skip
MODEL_TOKENS = _histogram(
    "gen_ai_client_token_usage",
    "Tokens per model call (gen_ai.client.token.usage), by gen_ai_token_type input/output",
    "gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type",
    boundaries=GENAI_TOKEN_BUCKETS,
)  # fmt: skip
TURNS_FINISHED = _counter(
    "cortex_turns_finished", "Interactive turns ended, by outcome (replied, refused, failed)",
    "org", "agent", "outcome",
)  # fmt: skip
TURNS_REJECTED = _counter(
    "cortex_turns_rejected", "Messages refused before they became a turn (409: the session is "
    "busy or ended; 503: at capacity)", "org", "reason",
)  # fmt: skip
SESSION_ACTORS = MetricSpec(
    "cortex_session_actors", "gauge", "Session actors this directory knows, by state (live, warm)",
    ("namespace", "state"),
)  # fmt: skip
SESSION_PASSIVATIONS = _counter(
    "cortex_session_passivations", "Idle session actors that left (the session stays open)",
    "namespace",
)  # fmt: skip
SESSION_REACTIVATIONS = _counter(
    "cortex_session_reactivations", "Sessions whose actor had left and came back for a turn",
    "namespace",
)  # fmt: skip
INGEST_FILES = _counter(
    "cortex_ingest_files", "Files the ingestion job handled, by outcome (written, unchanged, "
    "skipped, failed)", "org", "collection", "outcome",
)  # fmt: skip
INGEST_BYTES = _counter("cortex_ingest_bytes", "Bytes of files split", "org", "collection")
INGEST_PASSAGES = _counter("cortex_ingest_passages", "Passages written", "org", "collection")
KNOWLEDGE_SEARCH_DURATION = _histogram(
    "cortex_knowledge_search_duration_seconds", "One knowledge search (retrieve, fuse, rerank)",
    "org", "outcome", boundaries=CYCLE_DURATION_BUCKETS,
)  # fmt: skip

METRICS: tuple[MetricSpec, ...] = (
    RUNS_STARTED,
    RUNS_REJECTED,
    RUNS_FINISHED,
    STEPS,
    TOOL_CALLS,
    MCP_CALLS,
    ACCESS_DENIALS,
    LOOPS_DETECTED,
    PHASE_DURATION,
    TOOL_DURATION,
    MODEL_DURATION,
    MODEL_TOKENS,
    TURNS_FINISHED,
    TURNS_REJECTED,
    SESSION_ACTORS,
    SESSION_PASSIVATIONS,
    SESSION_REACTIVATIONS,
    INGEST_FILES,
    INGEST_BYTES,
    INGEST_PASSAGES,
    KNOWLEDGE_SEARCH_DURATION,
)
"""Every metric cortex-ray records (cluster/grafana/ draws from these)."""


class MetricsSink(Protocol):
    """Where recorded values go (``actors.RayMetrics``: Ray's metrics endpoint)."""

    def record(self, spec: MetricSpec, value: float, labels: Mapping[str, str]) -> None:
        """Add ``value`` to a counter, observe it in a histogram, or set a gauge to it."""
        ...


_lock = threading.Lock()
_sinks: list[MetricsSink] = []


def install_metrics(sink: MetricsSink) -> None:
    """Send this process's metrics to ``sink`` too (idempotent for the same sink)."""
    with _lock:
        if sink not in _sinks:
            _sinks.append(sink)


def uninstall_metrics(sink: MetricsSink) -> None:
    with _lock:
        if sink in _sinks:
            _sinks.remove(sink)


def metrics_installed() -> bool:
    return bool(_sinks)


def record(spec: MetricSpec, value: float = 1.0, **labels: object) -> None:
    """Record ``value`` for ``spec`` with ``labels`` (each of ``spec.labels``; a missing one
    is the empty string). Free while no sink is installed; a sink's failure is never the
    caller's (metrics must not break a run)."""
    if not _sinks:
        return
    tags = {key: str(labels.get(key, "") or "") for key in spec.labels}
    for sink in _sinks:
        try:
            sink.record(spec, value, tags)
        except Exception:  # pragma: no cover - a sink bug: counted nowhere, logged once
            _warn_once(spec.name)


_warned: set[str] = set()


def _warn_once(name: str) -> None:
    import logging

    if name not in _warned:
        _warned.add(name)
        logging.getLogger("cortex_ray.metrics").warning("could not record %s", name, exc_info=True)
