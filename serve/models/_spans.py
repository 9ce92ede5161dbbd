"""The spans a model replica records for the calls it serves.

A caller that traces (a session actor's ``chat {model}`` span, the API's retrieval span)
hands its W3C ``traceparent`` with each handle call (``outgoing_traceparent()``); the
replica opens its own SERVER span under it, so the call appears in the caller's trace with
the time it spent in the replica (waiting for the model, the forward pass). A call without
one records nothing. The replica's spans go where the settings of its environment send
them (``OTEL_EXPORTER_OTLP_*``, else the local span store of ``spans_database_url`` or
``CORTEX_DATABASE_URL``).
"""

from __future__ import annotations

import logging

from pydantic import SecretStr

from cortex_ray.observability import Tracing

__all__ = ["replica_tracing"]

log = logging.getLogger("serve.models")


def replica_tracing(database_url: SecretStr | None) -> Tracing | None:
    """This replica's tracer provider, or ``None`` (tracing off, nowhere to send spans). A
    replica serves even when its spans cannot be set up: the reason is logged."""
    try:
        return Tracing.for_process(database_url.get_secret_value() if database_url else None)
    except Exception as exc:  # never the replica's problem
        log.warning("this replica records no spans: %s", exc)
        return None
