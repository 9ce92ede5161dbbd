"""Core schema: organisations, principals, agents, runs and steps, sessions, memory, audit.

Every table carries its organisation, and every reference between rows is a composite key
that includes it, so no row can point across organisations.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE organisations (
            id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
            name        text NOT NULL DEFAULT '',
            created_at  timestamptz NOT NULL DEFAULT now()
        );

        CREATE TABLE principals (
            org_id       text NOT NULL REFERENCES organisations (id),
            id           text NOT NULL,
            kind         text NOT NULL CHECK (kind IN ('USER', 'AGENT', 'SERVICE')),
            name         text NOT NULL DEFAULT '',
            is_admin     boolean NOT NULL DEFAULT false,
            grant_policy jsonb,
            created_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id)
        );

        CREATE TABLE agents (
            org_id       text NOT NULL REFERENCES organisations (id),
            id           uuid NOT NULL,
            name         text NOT NULL,
            persona      text NOT NULL DEFAULT '',
            mode         text NOT NULL CHECK (mode IN ('INTERACTIVE', 'AUTONOMOUS')),
            tools        text[] NOT NULL DEFAULT '{}',
            skills       text[] NOT NULL DEFAULT '{}',
            grant_policy jsonb,
            created_at   timestamptz NOT NULL DEFAULT now(),
            updated_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, id),
            UNIQUE (org_id, name)
        );

        CREATE TABLE task_runs (
            org_id      text NOT NULL,
            id          uuid NOT NULL,
            agent_id    uuid NOT NULL,
            name        text NOT NULL DEFAULT '',
            goal        text NOT NULL CHECK (length(goal) > 0),
            status      text NOT NULL CHECK (status IN ('RUNNING', 'COMPLETED', 'FAILED')),
            max_steps   integer NOT NULL CHECK (max_steps > 0),
            caller_id   text,
            result      text,
            reason      text,
            created_at  timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, agent_id) REFERENCES agents (org_id, id)
        );
        CREATE INDEX task_runs_agent ON task_runs (org_id, agent_id, created_at DESC);

        CREATE TABLE run_steps (
            org_id      text NOT NULL,
            run_id      uuid NOT NULL,
            step_index  integer NOT NULL CHECK (step_index >= 0),
            decision    text NOT NULL CHECK (decision IN ('ACT', 'FINISH', 'REPLY')),
            candidates  jsonb NOT NULL DEFAULT '[]',
            selected    integer,
            action      jsonb,
            action_type text,
            observation jsonb,
            message     text,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, run_id, step_index),
            FOREIGN KEY (org_id, run_id) REFERENCES task_runs (org_id, id)
        );

        CREATE TABLE sessions (
            org_id     text NOT NULL,
            id         uuid NOT NULL,
            agent_id   uuid NOT NULL,
            caller_id  text NOT NULL,
            status     text NOT NULL CHECK (status IN ('OPEN', 'ENDED')),
            created_at timestamptz NOT NULL DEFAULT now(),
            ended_at   timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, agent_id) REFERENCES agents (org_id, id)
        );

        CREATE TABLE session_messages (
            org_id     text NOT NULL,
            session_id uuid NOT NULL,
            seq        integer NOT NULL,
            role       text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
            content    text NOT NULL,
            tool       text,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, session_id, seq),
            FOREIGN KEY (org_id, session_id) REFERENCES sessions (org_id, id)
        );

        CREATE TABLE memories (
            org_id        text NOT NULL,
            id            uuid NOT NULL,
            agent_id      uuid NOT NULL,
            kind          text NOT NULL CHECK (kind IN ('EPISODIC', 'SEMANTIC', 'PROCEDURAL')),
            subject       text,
            content       text NOT NULL,
            embedding     vector(384) NOT NULL,
            importance    real NOT NULL CHECK (importance BETWEEN 1 AND 10),
            valid_from    timestamptz NOT NULL,
            valid_to      timestamptz,
            recorded_at   timestamptz NOT NULL DEFAULT now(),
            superseded_at timestamptz,
            superseded_by uuid,
            run_id        uuid,
            session_id    uuid,
            step_index    integer,
            metadata      jsonb NOT NULL DEFAULT '{}',
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, agent_id) REFERENCES agents (org_id, id),
            CHECK (valid_to IS NULL OR valid_to >= valid_from)
        );
        CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_cosine_ops);
        CREATE INDEX memories_recent ON memories (org_id, agent_id, recorded_at DESC);
        CREATE INDEX memories_subject ON memories (org_id, agent_id, subject, valid_from)
            WHERE subject IS NOT NULL;
        -- A step's episodic memory can be written once only.
        CREATE UNIQUE INDEX memories_run_step ON memories (org_id, run_id, step_index, kind)
            WHERE run_id IS NOT NULL AND step_index IS NOT NULL;

        CREATE TABLE procedural_proposals (
            org_id      text NOT NULL,
            id          uuid NOT NULL,
            agent_id    uuid NOT NULL,
            field       text NOT NULL CHECK (field IN ('persona', 'skills')),
            value       jsonb NOT NULL,
            rationale   text NOT NULL DEFAULT '',
            status      text NOT NULL CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED')),
            proposed_by text NOT NULL,
            decided_by  text,
            proposed_at timestamptz NOT NULL DEFAULT now(),
            decided_at  timestamptz,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, agent_id) REFERENCES agents (org_id, id)
        );

        CREATE TABLE audit_log (
            org_id          text NOT NULL,
            id              bigint GENERATED ALWAYS AS IDENTITY,
            at              timestamptz NOT NULL DEFAULT now(),
            principal_id    text NOT NULL,
            agent_id        uuid,
            mode            text,
            tool            text NOT NULL,
            action_type     text NOT NULL,
            status          text NOT NULL,
            reason          text,
            args            jsonb NOT NULL DEFAULT '{}',
            duration_ms     double precision NOT NULL DEFAULT 0,
            run_id          uuid,
            step_index      integer,
            session_id      uuid,
            idempotency_key text,
            PRIMARY KEY (org_id, id)
        );
        CREATE INDEX audit_log_run ON audit_log (org_id, run_id, step_index);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE audit_log, procedural_proposals, memories, session_messages, sessions,
                   run_steps, task_runs, agents, principals, organisations
        """
    )
