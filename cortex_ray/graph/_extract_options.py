"""The options of the model-based graph extraction job (``python -m jobs.graph_extract``),
declared once: the job's command line and ``cortex-ray graph extract`` (which runs that job
as its own process, or prints its command line) both take their flags from here, so the
two cannot drift apart. No Ray here, and nothing of ``jobs/``: the core declares, the job
runs.

Each ``Extract*`` alias is one flag (name, type, bounds, help); :class:`ExtractRequest` is
what the flags say, checked once (what to extract) and turned back into the job's command
line (:meth:`ExtractRequest.flags`). Unset flags take ``CORTEX_INGEST__GRAPH_MODEL_*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import typer

from cortex_ray._exceptions import InvalidRequestError
from cortex_ray.settings import IngestJobOptions

__all__ = [
    "EXTRACT_JOB",
    "ExtractActors",
    "ExtractAddress",
    "ExtractBatch",
    "ExtractCollection",
    "ExtractDatabaseUrl",
    "ExtractInFlight",
    "ExtractModelVersion",
    "ExtractNumGpus",
    "ExtractOrg",
    "ExtractRequest",
    "ExtractSinceVersion",
    "ExtractSources",
    "setting_shown",
]

EXTRACT_JOB = "jobs.graph_extract"
"""The module the job runs as (``python -m``)."""


def setting_shown(name: str) -> str:
    """What ``--help`` shows as a job flag's default: the setting ``CORTEX_INGEST__<NAME>``
    it comes from, and that setting's own default."""
    variable = f"CORTEX_INGEST__{name.upper()}"
    default: Any = IngestJobOptions.model_fields[name].default
    return f"{variable}, else {default}" if default is not None else f"{variable}, else unset"


ExtractOrg = Annotated[str, typer.Option("--org", help="The organisation.")]
ExtractCollection = Annotated[
    str | None, typer.Option("--collection", help="Only this collection's versions.")
]
ExtractSources = Annotated[
    list[str] | None, typer.Option("--source", help="Only this source id (repeatable).")
]
ExtractSinceVersion = Annotated[
    int | None, typer.Option("--since-version", min=1, help="Only versions numbered ≥ N.")
]
ExtractModelVersion = Annotated[
    str | None,
    typer.Option(
        "--model-version",
        help="The model's name/version recorded on its facts (default CORTEX_MODEL_NAME).",
    ),
]
ExtractBatch = Annotated[
    int | None,
    typer.Option(
        "--batch", help="Passages a model call.", show_default=setting_shown("graph_model_batch")
    ),
]
ExtractActors = Annotated[
    int | None,
    typer.Option(
        "--actors", help="Model actors.", show_default=setting_shown("graph_model_actors")
    ),
]
ExtractInFlight = Annotated[
    int | None,
    typer.Option(
        "--in-flight",
        help="Calls each actor keeps going.",
        show_default=setting_shown("graph_model_in_flight"),
    ),
]
ExtractNumGpus = Annotated[
    float | None,
    typer.Option(
        "--num-gpus",
        help="GPUs per actor (model_backend=local).",
        show_default=setting_shown("graph_model_num_gpus"),
    ),
]
ExtractAddress = Annotated[
    str | None,
    typer.Option("--address", help="Ray address."),
]
ExtractDatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL DSN (default CORTEX_DATABASE_URL, else the embedded server).",
    ),
]


@dataclass(frozen=True)
class ExtractRequest:
    """What the extraction job's flags say (``None``: the flag was not given, the setting
    decides)."""

    org: str
    collection: str | None = None
    source: tuple[str, ...] = ()
    since_version: int | None = None
    model_version: str | None = None
    batch: int | None = None
    actors: int | None = None
    in_flight: int | None = None
    num_gpus: float | None = None
    address: str | None = None
    database_url: str | None = None

    def source_ids(self) -> list[str]:
        """The ``--source`` ids, checked, after checking that something is named.

        Raises:
            InvalidRequestError: Neither ``--collection`` nor ``--source``, or a source id
                that is no UUID; the message names the flag.
        """
        if not self.collection and not self.source:
            raise InvalidRequestError("give --collection or --source (what to extract)")
        ids = []
        for value in self.source:
            try:
                ids.append(str(UUID(value)))
            except ValueError:
                raise InvalidRequestError(f"--source: not a source id: {value!r}") from None
        return ids

    def flags(self) -> list[str]:
        """The job's command line after ``python -m jobs.graph_extract``: the flags given,
        in declaration order; those not given are left to the job's defaults."""
        given: list[tuple[str, Any]] = [
            ("--org", self.org),
            ("--collection", self.collection),
            *(("--source", s) for s in self.source),
            ("--since-version", self.since_version),
            ("--model-version", self.model_version),
            ("--batch", self.batch),
            ("--actors", self.actors),
            ("--in-flight", self.in_flight),
            ("--num-gpus", self.num_gpus),
            ("--address", self.address),
            ("--database-url", self.database_url),
        ]
        return [part for flag, value in given if value is not None for part in (flag, str(value))]
