"""What every ``cortex-ray`` command shares: the global options, opening the runtime,
running a command's coroutine with its exit code, one-line errors, tables, and running a
job (``python -m jobs.*``) in this process's place.

Exit codes: 0 success; 1 a cortex-ray error (not found, storage, configuration, model);
2 invalid input; 3 a run that ended FAILED; 4 an eval run with a failing case; 5 a run a
person cancelled (CANCELLED); 130 interrupted (SIGINT); 143 stopped (SIGTERM).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shlex
import sys
import warnings
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn
from uuid import UUID

import pydantic
import typer
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from cortex_ray._exceptions import CortexError, InvalidRequestError
from cortex_ray._shutdown import Interrupted, run_stoppable
from cortex_ray._types import Principal
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import HashEmbedder
from cortex_ray.runtime import Runtime
from cortex_ray.settings import load_settings
from cortex_ray.storage import Database, database_label

__all__ = [
    "EXIT_ERROR",
    "EXIT_EVAL_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_RUN_CANCELLED",
    "EXIT_RUN_FAILED",
    "PRINT_COMMAND",
    "Options",
    "as_operator",
    "configure_output",
    "err",
    "exec_job",
    "execute",
    "fail",
    "job_flags",
    "json_object",
    "list_table",
    "open_runtime",
    "org_of",
    "out",
    "parse_uuid",
    "run_job",
    "shorten",
    "validation_message",
]

EXIT_ERROR = 1
EXIT_INVALID = 2
EXIT_RUN_FAILED = 3
EXIT_EVAL_FAILED = 4
EXIT_RUN_CANCELLED = 5
EXIT_INTERRUPTED = 130

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


@dataclass(frozen=True)
class Options:
    """The global options (before the command), kept on the root context."""

    org: str


# plumbing --------------------------------------------------------------------------------


def fail(message: str, code: int) -> NoReturn:
    """Print one ``error:`` line to stderr and exit with ``code``."""
    one_line = " ".join(message.split()) or "unknown error"
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code)


def validation_message(exc: pydantic.ValidationError, prefix: str = "") -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{prefix}{where}: {first['msg']}" if where else f"{prefix}{first['msg']}"


def execute(work: Coroutine[Any, Any, int]) -> None:
    """Run one command's coroutine; turn cortex-ray errors into one line and an exit code.

    SIGINT and SIGTERM (also SIGINT ignored at start, as in a background job) cancel the
    coroutine, so its runtime closes and the embedded PostgreSQL it started stops; the exit
    code is then 130 or 143. A second signal exits at once."""
    try:
        code = run_stoppable(work)
    except Interrupted as exc:
        typer.echo("interrupted", err=True)
        raise typer.Exit(exc.exit_code) from None
    except InvalidRequestError as exc:
        fail(_message(exc), EXIT_INVALID)
    except CortexError as exc:
        fail(_message(exc), EXIT_ERROR)
    except pydantic.ValidationError as exc:
        # Boundary models (Agent, ...) validate what the user typed, e.g. an empty name.
        fail(validation_message(exc, "invalid input: "), EXIT_INVALID)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(code)


@asynccontextmanager
async def open_runtime(*, with_models: bool, db: Database | None = None) -> AsyncIterator[Runtime]:
    """An open runtime, always closed again. Without models it loads neither model file,
    which keeps the bookkeeping commands fast. On ``db`` (another runtime's, left open) it
    opens no database of its own."""
    settings = load_settings()
    database = database_label(settings.storage.database_url, settings.storage.data_dir)
    where = "connecting to" if settings.storage.database_url else "starting"
    label = f"{where} {database}" + (" and loading models…" if with_models else "…")
    if db is not None:
        label = "loading models…" if with_models else "opening…"
    with err.status(label), _naming_the_database(database):
        if with_models:
            runtime = await Runtime.open(settings, db=db)
        else:
            hashed = HashEmbedder(EMBEDDING_DIM)
            runtime = await Runtime.open(settings, model=None, embedder=hashed, db=db)
    try:
        with _naming_the_database(database):
            yield runtime
    except asyncio.CancelledError:
        # Ctrl-C: a model call may still be running in its worker thread, and closing the
        # llama.cpp model under it crashes the process. Close only the database; the model
        # goes with the process once asyncio.run has waited for that thread.
        await runtime.db.close()
        raise
    except BaseException:
        await runtime.close()
        raise
    else:
        await runtime.close()


@contextmanager
def _naming_the_database(database: str) -> Iterator[None]:
    """A cortex-ray error raised inside says which database it met (a PEP 678 note, which
    :func:`execute` prints): ``no API key ... in organisation 'x'`` depends on where the
    command looked, and without ``CORTEX_DATA_DIR`` that may not be where one thinks."""
    try:
        yield
    except CortexError as exc:
        exc.add_note(f"database: {database}")
        raise


def _message(exc: CortexError) -> str:
    """The error's text, then its notes in parentheses (the database it met)."""
    notes = getattr(exc, "__notes__", [])
    return f"{exc} ({'; '.join(notes)})" if notes else str(exc)


def parse_uuid(value: str, what: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise InvalidRequestError(f"not a {what} id: {value!r}") from None


def configure_output(verbose: bool) -> None:
    """Log through the stderr console (so lines print above the spinner). Unless verbose,
    keep library chatter (weight-loading bars, deprecation notices) off the terminal."""
    handler = RichHandler(console=err, show_path=False, show_time=verbose)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    if verbose:
        logging.captureWarnings(True)
    else:
        # Read when huggingface_hub is first imported, which happens later (model loading).
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)


def org_of(ctx: typer.Context) -> str:
    """The ``--org`` the command line gave (or ``CORTEX_ORG``, else ``default``)."""
    options: Options = ctx.find_root().obj
    return options.org


def as_operator(org: str) -> Principal:
    """Who the CLI acts as: the person at this machine (an admin of ``org``; audited as
    ``operator``). The core decides and audits every command as that principal."""
    return Principal.operator(org)


# formatting ------------------------------------------------------------------------------


def shorten(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def list_table(title: str) -> Table:
    """A compact table: lists must stay readable in an 80-column terminal."""
    return Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )


def json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object an option carries; anything else is invalid input naming ``what``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{what} is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object")
    return value


# jobs: run as their own process ---------------------------------------------------------


def exec_job(args: list[str]) -> NoReturn:
    """Become ``python ARGS`` (``-m jobs.<job> ...``).

    The jobs live in the Ray layer (jobs/), which the core never imports: a job runs as its
    own process, exactly as ``ray job submit`` would run it, and its exit code is the
    command's."""
    if importlib.util.find_spec("jobs") is None:
        fail(
            f"the job {args[1]} is not installed: run from a cortex-ray checkout or "
            "pip install 'cortex-ray[ray]'",
            EXIT_ERROR,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *args])


def job_flags(given: dict[str, Any]) -> list[str]:
    """The flags of a job's command line, from a command's parameters (same names, kebab
    case): those not given (``None``, ``False``) are left to the job's defaults."""
    flags: list[str] = []
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            for item in value:
                flags += [flag, str(item)]
        else:
            flags += [flag, str(value)]
    return flags


def run_job(module: str, flags: list[str], print_command: bool) -> NoReturn:
    """Run the job ``python -m MODULE FLAGS``, or with ``print_command`` print that command
    line (for ``ray job submit --working-dir . -- ...``) and exit."""
    if print_command:
        typer.echo(shlex.join(["python", "-m", module, *flags]))
        raise typer.Exit(0)
    exec_job(["-m", module, *flags])


PRINT_COMMAND = typer.Option(
    "--print-command",
    help="Print the job's command line (to submit with ray job submit) instead of running it.",
)
