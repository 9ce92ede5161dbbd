"""Evaluation: each step's recording (a run's cassette), suites of cases, suite runs.

- ``run_steps.recording`` keeps what the step's DECIDE saw (its working memory without
  the observations, which the earlier rows hold) and every model call it made (a digest of
  the request, the response): enough to replay the run's decisions without the model.
- ``eval_suites``: versioned sets of cases; a version is never changed, a change is a new
  version (``UNIQUE (org_id, name, version)``). A case holds its cassette and its checks.
- ``eval_runs`` and ``eval_results``: one row per suite run (mode, model, metrics) and one
  per case (passed, the checks' verdicts, the replay's outcome and metrics).

Recordings and cases are ``json``, not ``jsonb``: jsonb reorders object keys, and the order
of a tool's parameters is part of the prompt and of the grammar a replay must rebuild
byte for byte. For the same reason a step's candidates, action and observation become
``json``: the progress lines quote a call's arguments in the order the model wrote them,
and a run resumed from jsonb rows was shown ``remember_fact(fact=..., subject=...)`` where
the live run had shown ``remember_fact(subject=..., fact=...)`` (found by the first replay).

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE run_steps ADD COLUMN recording json;
        ALTER TABLE run_steps
            ALTER COLUMN candidates DROP DEFAULT,
            ALTER COLUMN candidates TYPE json USING candidates::json,
            ALTER COLUMN candidates SET DEFAULT '[]',
            ALTER COLUMN action TYPE json USING action::json,
            ALTER COLUMN observation TYPE json USING observation::json;

        CREATE TABLE eval_suites (
            org_id      text NOT NULL REFERENCES organisations (id),
            name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
            version     integer NOT NULL CHECK (version >= 1),
            description text NOT NULL DEFAULT '',
            cases       json NOT NULL,
            digest      text NOT NULL,
            created_by  text,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (org_id, name, version)
        );

        CREATE TABLE eval_runs (
            org_id        text NOT NULL REFERENCES organisations (id),
            id            uuid NOT NULL,
            suite         text NOT NULL,
            suite_version integer NOT NULL,
            mode          text NOT NULL CHECK (mode IN ('replay', 'live')),
            model         text,
            overrides     jsonb NOT NULL DEFAULT '{}',
            passed        integer NOT NULL,
            total         integer NOT NULL,
            metrics       jsonb NOT NULL,
            created_by    text,
            started_at    timestamptz NOT NULL,
            finished_at   timestamptz NOT NULL,
            PRIMARY KEY (org_id, id),
            FOREIGN KEY (org_id, suite, suite_version)
                REFERENCES eval_suites (org_id, name, version)
        );
        CREATE INDEX eval_runs_recent ON eval_runs (org_id, started_at DESC);

        CREATE TABLE eval_results (
            org_id      text NOT NULL,
            eval_run_id uuid NOT NULL,
            ordinal     integer NOT NULL,
            case_name   text NOT NULL,
            passed      boolean NOT NULL,
            result      json NOT NULL,
            PRIMARY KEY (org_id, eval_run_id, ordinal),
            FOREIGN KEY (org_id, eval_run_id) REFERENCES eval_runs (org_id, id) ON DELETE CASCADE
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE eval_results;
        DROP TABLE eval_runs;
        DROP TABLE eval_suites;
        ALTER TABLE run_steps
            ALTER COLUMN candidates DROP DEFAULT,
            ALTER COLUMN candidates TYPE jsonb USING candidates::jsonb,
            ALTER COLUMN candidates SET DEFAULT '[]',
            ALTER COLUMN action TYPE jsonb USING action::jsonb,
            ALTER COLUMN observation TYPE jsonb USING observation::jsonb;
        ALTER TABLE run_steps DROP COLUMN recording;
        """
    )
