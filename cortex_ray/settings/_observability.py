"""Options of observability: diagnostic timelines and traces (``cortex_ray.observability``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DiagnosticsOptions", "LocalSpans", "TracingOptions"]


class DiagnosticsOptions(BaseModel):
    """Per-run and per-turn diagnostic timelines: ``Settings.diagnostics``,
    ``CORTEX_DIAGNOSTICS__<FIELD>`` (``cortex-ray diagnose RUN_ID``; docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description="keep a diagnostic timeline per run and turn")
    retention_days: float = Field(
        default=7.0, gt=0, description="timeline events older than this are deleted"
    )
    max_events: int = Field(
        default=2000, ge=10, description="events kept per run or turn; later ones are counted"
    )
    max_value_chars: int = Field(
        default=2000, ge=64, description="largest text kept per value (after scrubbing)"
    )
    stall_after_s: float = Field(
        default=30.0, gt=0, description="a model call running this long is noted as a stall"
    )
    loop_repeats: int = Field(
        default=3, ge=2, description="the same call proposed this often in a run is a loop"
    )


class LocalSpans(StrEnum):
    """Whether finished spans are also kept in the database (``cortex-ray trace RUN_ID``)."""

    AUTO = "auto"
    """Kept when no collector is configured (no ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``)."""
    ON = "on"
    OFF = "off"


class TracingOptions(BaseModel):
    """Traces (OpenTelemetry, GenAI semantic conventions): ``Settings.tracing``,
    ``CORTEX_TRACING__<FIELD>``. The exporter itself is configured the standard way
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
    ...; docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        default=True,
        description="open spans at all; false leaves no tracer provider (zero cost) unless "
        "the program sets one itself",
    )
    local: LocalSpans = Field(
        default=LocalSpans.AUTO,
        description="keep finished spans in the database: auto (when no OTLP endpoint is "
        "set), on, off",
    )
    capture_content: bool = Field(
        default=False,
        description="put prompts, tool arguments and results in spans (scrubbed and "
        "bounded); off: only sizes, names and outcomes",
    )
    max_content_chars: int = Field(
        default=4096, ge=64, description="largest captured value per attribute"
    )
    retention_days: float = Field(
        default=7.0, gt=0, description="locally kept spans older than this are deleted"
    )
