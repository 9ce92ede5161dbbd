"""The ``cortex-ray`` command line: agents, autonomous runs and their step logs, API keys,
``eval`` (regression cases from runs, suites, replays), governance (connectors, grants,
approvals, secrets, schedules, the audit log), workflows, and the commands that run a job
as its own process (``ingest``: ``python -m jobs.ingest``; ``graph extract`` and ``graph
project``: ``python -m jobs.graph_extract`` and ``jobs.graph_project``).

One module per noun, by the same domains as the runtime's use cases; each parses, calls
the runtime as the operator and renders, with what they share in ``_common`` (options,
opening the runtime, exit codes, tables) and ``_runview`` (a run's step log, a run driven
here). This module only assembles them: the nouns never import each other.

Typer parses the command line and rich draws the spinner, the live step lines and the
tables (see STYLE.md: we do not write CLI parsing or progress bars by hand). Settings come
from the environment (``CORTEX_*``); every command opens the runtime, does one thing and
closes it again, which also stops the embedded PostgreSQL when this process started it.

Exit codes (``_common``): 0 success; 1 a cortex-ray error (not found, storage,
configuration, model); 2 invalid input; 3 a run that ended FAILED; 4 an eval run with a
failing case; 5 a run a person cancelled (CANCELLED); 130 interrupted (SIGINT); 143
stopped (SIGTERM).
"""

from __future__ import annotations

from typing import Annotated

import typer

from cortex_ray.cli._agents import agents_app
from cortex_ray.cli._approvals import approvals_app, audit
from cortex_ray.cli._common import Options, configure_output
from cortex_ray.cli._connectors import connectors_app, grants_app
from cortex_ray.cli._deploy import deploy_app
from cortex_ray.cli._evals import eval_app
from cortex_ray.cli._graph import graph_app
from cortex_ray.cli._keys import keys_app
from cortex_ray.cli._knowledge import ingest_command, sources_app
from cortex_ray.cli._mcp import mcp_app
from cortex_ray.cli._memory import proposals_app
from cortex_ray.cli._run import demo, run_command
from cortex_ray.cli._runs import diagnose_command, runs_app, trace_command
from cortex_ray.cli._schedules import schedules_app
from cortex_ray.cli._secrets import secrets_app
from cortex_ray.cli._workflows import workflow_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="cortex-ray",
    help="A CoALA agent runtime on PostgreSQL/pgvector. Settings come from CORTEX_* "
    "environment variables; global options (--org) go before the command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(
    ctx: typer.Context,
    org: Annotated[
        str, typer.Option("--org", envvar="CORTEX_ORG", help="Organisation (tenant) id.")
    ] = "default",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
) -> None:
    """A CoALA agent runtime. Settings come from CORTEX_* environment variables."""
    configure_output(verbose)
    ctx.obj = Options(org=org)


# The order of registration is the order of --help: commands first, then the groups.
app.command()(demo)
app.command("run")(run_command)
# ingest hands what it does not know (--no-embed, --address, ...) on to the job.
app.command("ingest", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    ingest_command
)
app.command("trace")(trace_command)
app.command("diagnose")(diagnose_command)
app.command("audit")(audit)
app.add_typer(agents_app, name="agents")
app.add_typer(runs_app, name="runs")
app.add_typer(keys_app, name="api-keys")
app.add_typer(proposals_app, name="proposals")
app.add_typer(eval_app, name="eval")
app.add_typer(graph_app, name="graph")
app.add_typer(sources_app, name="sources")
app.add_typer(deploy_app, name="deploy")
app.add_typer(connectors_app, name="connectors")
connectors_app.add_typer(mcp_app, name="mcp")
app.add_typer(grants_app, name="grants")
app.add_typer(approvals_app, name="approvals")
app.add_typer(secrets_app, name="secrets")
app.add_typer(schedules_app, name="schedules")
app.add_typer(workflow_app, name="workflow")


def main() -> None:
    """The ``cortex-ray`` console script."""
    app()
