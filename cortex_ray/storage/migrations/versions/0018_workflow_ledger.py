"""The workflow ledger (issue 18, point 5).

``workflows`` names a workflow once per organisation; ``workflow_versions`` holds its
versions, each immutable once published (a trigger refuses UPDATE and DELETE: a change is a
new version): the input JSON schema, the tools and connectors it allows, the evidence it
requires, its risk level, its approval gates and its default run mode. ``task_runs`` records
the version a run follows and its (schema-checked) inputs. ``payloads`` stores a large tool
argument or result once per organisation, keyed by the sha256 of its text; the audit rows
that carry it reference it (``args_ref``, ``result_ref``) instead of copying it.
``audit_log.source_versions`` keeps the ``source_id@version`` pairs a result cited.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE workflows (
            org_id      text NOT NULL REFERENCES organisations (id),
            id          uuid NOT NULL,
            name        text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,99}$'),
            description text NOT NULL DEFAULT '',
            created_by  text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, name)
        );
        CREATE TABLE workflow_versions (
            org_id            text NOT NULL,
            id                uuid NOT NULL,
            workflow_id       uuid NOT NULL,
            version           integer NOT NULL CHECK (version >= 1),
            instructions      text NOT NULL CHECK (length(instructions) > 0),
            input_schema      jsonb NOT NULL,
            tools             text[] NOT NULL DEFAULT '{}',
            connectors        text[] NOT NULL DEFAULT '{}',
            required_evidence jsonb NOT NULL DEFAULT '{}',
            risk              text NOT NULL
                CHECK (risk IN ('low', 'medium', 'high', 'critical')),
            approval_tools    text[] NOT NULL DEFAULT '{}',
            approval_tiers    text[] NOT NULL DEFAULT '{}',
            default_mode      text NOT NULL
                CHECK (default_mode IN ('execute', 'dry_run', 'shadow')),
            published_by      text NOT NULL,
            published_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, workflow_id, version),
            FOREIGN KEY (org_id, workflow_id) REFERENCES workflows (org_id, id)
        );
        CREATE FUNCTION workflow_versions_immutable() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'a published workflow version is immutable'
                USING ERRCODE = 'integrity_constraint_violation';
        END $$;
        CREATE TRIGGER workflow_versions_immutable
            BEFORE UPDATE OR DELETE ON workflow_versions
            FOR EACH ROW EXECUTE FUNCTION workflow_versions_immutable();
        ALTER TABLE task_runs
            ADD COLUMN workflow_version_id uuid,
            ADD COLUMN workflow_inputs     jsonb,
            ADD CONSTRAINT task_runs_workflow_version
                FOREIGN KEY (org_id, workflow_version_id)
                REFERENCES workflow_versions (org_id, id);
        CREATE INDEX task_runs_workflow ON task_runs (org_id, workflow_version_id)
            WHERE workflow_version_id IS NOT NULL;
        CREATE TABLE payloads (
            org_id     text NOT NULL,
            sha256     text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
            body       text NOT NULL,
            bytes      integer NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, sha256)
        );
        ALTER TABLE audit_log
            ADD COLUMN args_ref        text,
            ADD COLUMN result_ref      text,
            ADD COLUMN source_versions text[];
        CREATE INDEX audit_log_args_ref ON audit_log (org_id, args_ref)
            WHERE args_ref IS NOT NULL;
        CREATE INDEX audit_log_result_ref ON audit_log (org_id, result_ref)
            WHERE result_ref IS NOT NULL;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX audit_log_args_ref;
        DROP INDEX audit_log_result_ref;
        ALTER TABLE audit_log DROP COLUMN args_ref, DROP COLUMN result_ref,
            DROP COLUMN source_versions;
        DROP TABLE payloads;
        DROP INDEX task_runs_workflow;
        ALTER TABLE task_runs DROP CONSTRAINT task_runs_workflow_version,
            DROP COLUMN workflow_version_id, DROP COLUMN workflow_inputs;
        DROP TABLE workflow_versions;
        DROP FUNCTION workflow_versions_immutable();
        DROP TABLE workflows;
        """
    )
