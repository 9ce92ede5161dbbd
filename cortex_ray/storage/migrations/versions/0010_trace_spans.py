"""Spans kept locally when no trace collector is configured.

``trace_spans`` holds finished OpenTelemetry spans (``cortex_ray.observability``'s
``PostgresSpanExporter``): ids in W3C hex, times, status, kind and attributes (scrubbed and
bounded before they were set), and for the spans that carry them the organisation, run and
session, so ``cortex-ray trace RUN_ID`` and ``GET /api/orgs/{org}/tasks/{id}/trace`` find a
run's traces by the root span and read every span of those traces. Rows older than the
retention (``CORTEX_TRACING__RETENTION_DAYS``) are deleted by the runtime; nothing else
refers to them, so the downgrade simply drops the table.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE trace_spans (
            trace_id        text NOT NULL,
            span_id         text NOT NULL,
            parent_span_id  text,
            name            text NOT NULL,
            kind            text NOT NULL,
            start_time      timestamptz NOT NULL,
            end_time        timestamptz NOT NULL,
            status          text NOT NULL,
            status_message  text,
            attributes      jsonb NOT NULL DEFAULT '{}',
            links           jsonb NOT NULL DEFAULT '[]',
            org_id          text,
            run_id          uuid,
            session_id      uuid,
            PRIMARY KEY (trace_id, span_id)
        );
        CREATE INDEX trace_spans_run ON trace_spans (org_id, run_id) WHERE run_id IS NOT NULL;
        CREATE INDEX trace_spans_session ON trace_spans (org_id, session_id)
            WHERE session_id IS NOT NULL;
        CREATE INDEX trace_spans_end ON trace_spans (end_time);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE trace_spans;")
