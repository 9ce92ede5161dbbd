"""How every job's entry point (``python -m jobs.*``) begins and ends, written once: its
settings (a bad one exits 1), its options over ``Settings.ingest`` (an out-of-range flag
exits 2, named), the database (``--database-url``, else ``CORTEX_DATABASE_URL``, else the
embedded server, started here and stopped at the end), the migrations, the Ray it joins or
starts (``jobs._ray``), one JSON line on stdout, and the exit code: 0 done, 1 a
configuration, model or storage error, 2 invalid arguments, 130/143 interrupted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import typer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import ValidationError

from cortex_ray import (
    CortexError,
    IngestJobOptions,
    Interrupted,
    InvalidRequestError,
    Settings,
    load_settings,
)
from cortex_ray.graph import setting_shown
from cortex_ray.storage import EmbeddedPostgres, database_label, migrate
from jobs._ray import join_or_start_ray

__all__ = [
    "EXIT_ERROR",
    "EXIT_INVALID",
    "Work",
    "bulk_dsn",
    "fail",
    "job_default",
    "job_options",
    "job_settings",
    "resolve_dsn",
    "run_job",
    "shown_default",
]

EXIT_ERROR = 1
EXIT_INVALID = 2

Work = Callable[[str | None], str | None]
"""A job's body: given the DSN (``None`` when it needs no database), it does the work and
returns the line to print on stdout (its JSON report), or ``None`` (it printed its own)."""


def fail(message: str, code: int) -> NoReturn:
    """One ``error:`` line on stderr, then exit ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def job_settings() -> Settings:
    """The settings (``CORTEX_*``), with the jobs' logging; a bad setting exits 1."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return load_settings()
    except CortexError as exc:
        fail(str(exc), EXIT_ERROR)


def job_default(name: str) -> Any:
    """The default of a job option: the setting ``CORTEX_INGEST__<NAME>``'s own default
    (``Settings.ingest``), so that the flags, ``run_ingest`` and the settings agree."""
    return IngestJobOptions.model_fields[name].default


def shown_default(name: str) -> str:
    """What ``--help`` shows as a flag's default: the setting it comes from."""
    return setting_shown(name)


def job_options(
    settings: Settings, flag_names: Mapping[str, str] | None = None, **flags: Any
) -> IngestJobOptions:
    """``settings.ingest`` with the flags that were given (not ``None``) put over it,
    validated by the same model (so a flag obeys the setting's limits). ``flag_names`` names
    the flag of a setting whose flag is not its name in kebab case.

    Raises:
        InvalidRequestError: A flag is out of range; the message names it.
    """
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        return IngestJobOptions.model_validate({**settings.ingest.model_dump(), **given})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0])
        flag = (flag_names or {}).get(field) or "--" + field.replace("_", "-")
        raise InvalidRequestError(f"invalid option {flag}: {first['msg']}") from None


def resolve_dsn(
    database_url: str | None, settings: Settings
) -> tuple[str, EmbeddedPostgres | None]:
    """The DSN to use, and the embedded server this process started (to stop at the end)."""
    url = database_url or settings.storage.database_url
    if url:
        return url, None
    embedded = EmbeddedPostgres(settings.storage.data_dir / "pg")
    return embedded.dsn, embedded


def bulk_dsn(dsn: str) -> str:
    """The read tasks' DSN: their commits do not wait for the WAL flush.

    Safe for this protocol: nothing is served until ``publish``, which commits synchronously
    from the driver's own connection; its flush makes every earlier commit durable too (the
    WAL is sequential), and a crash before it leaves an unpublished generation that a rerun
    redoes. Without it each file's four small transactions each wait for an fsync.
    """
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c synchronous_commit=off".strip()
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def run_job(
    work: Work,
    *,
    settings: Settings,
    database_url: str | None,
    database: bool = True,
    on_ray: bool = True,
    address: str | None = None,
    num_cpus: int | None = None,
    interrupted: str = "",
    invalid_exit: int = EXIT_ERROR,
    foreign_errors: bool = False,
) -> None:
    """A job's tail: resolve and migrate the database (unless ``database`` is False), join
    or start Ray (``on_ray``), run ``work``, print its JSON line; always stop what this call
    started (its Ray, the embedded server).

    Errors end the process with one ``error:`` line: a cortex-ray error exits 1 (an
    invalid request ``invalid_exit``); with ``foreign_errors`` any other exception too (a
    client library's: unreachable server, bad credentials). An interruption says
    ``interrupted by SIGNAL`` and what it leaves (``interrupted``: ``": nothing was
    published"``), and exits 130 or 143.
    """
    embedded: EmbeddedPostgres | None = None
    started_ray = False
    # Errors name the database the job used (never its password): without CORTEX_DATA_DIR
    # or a DSN it is the embedded one in the default data dir, which may not be the
    # stack's.
    where = ""
    if database:
        url = database_url or settings.storage.database_url
        where = f" (database: {database_label(url, settings.storage.data_dir)})"
    try:
        dsn: str | None = None
        if database:
            dsn, embedded = resolve_dsn(database_url, settings)
            migrate(dsn)
        if on_ray:
            started_ray = join_or_start_ray(address, settings.storage.data_dir, num_cpus=num_cpus)
        line = work(dsn)
    except InvalidRequestError as exc:
        fail(f"{exc}{where}", invalid_exit)
    except CortexError as exc:
        fail(f"{exc}{where}", EXIT_ERROR)
    except Interrupted as exc:
        typer.echo(f"interrupted by {exc}{interrupted}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:
        if not foreign_errors:
            raise
        fail(f"{type(exc).__name__}: {exc}{where}", EXIT_ERROR)
    finally:
        if started_ray:
            _shutdown_ray()
        if embedded is not None:
            embedded.stop()
    if line is not None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _shutdown_ray() -> None:
    # Imported here, as in jobs._ray: a job that needs no Ray (graph_project) never loads it.
    import ray

    ray.shutdown()
