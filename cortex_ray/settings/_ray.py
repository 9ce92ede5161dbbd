"""Options of the Ray layers: the HTTP API (``serve``), session actors (``actors``), run
leases and the supervisor, and the jobs (``jobs``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ApiOptions",
    "GraphProjectionOptions",
    "IngestJobOptions",
    "RunPolicy",
    "SessionPolicy",
]


class ApiOptions(BaseModel):
    """How the HTTP API (``serve/``) is served: ``Settings.api``, ``CORTEX_API__<FIELD>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="bind address; 0.0.0.0 exposes it")
    port: int = Field(default=8000, ge=1, le=65535, description="the HTTP port")
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, description="larger request bodies get 413"
    )
    docs: bool = Field(default=True, description="serve /docs (Swagger UI)")
    num_replicas: int = Field(
        default=1,
        ge=1,
        description="Serve replicas of the API; keep 1 with the in-process executor",
    )
    max_ongoing_requests: int = Field(
        default=100, ge=1, description="concurrent requests per replica (SSE streams count)"
    )
    readyz_timeout_s: float = Field(
        default=5.0, gt=0, description="how long /readyz waits for the database to answer"
    )
    num_cpus: float = Field(
        default=0.5,
        ge=0,
        description="CPUs each API replica reserves (it mostly waits on the database and the "
        "actors); with the served models the local stack reserves 1.5",
    )
    a2a_agents: str = Field(
        default="*",
        max_length=10_000,
        description="agents published over A2A (/a2a/{org}/{agent}): `*` every agent, or "
        "agent names and ids separated by commas; empty: none",
    )


class SessionPolicy(BaseModel):
    """How session actors (``actors/``) live: ``Settings.sessions``,
    ``CORTEX_SESSIONS__<FIELD>``.

    The directory (the supervisor) takes the policy of the manager that created it: managers
    sharing a namespace should share a policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(
        default="cortex-ray", min_length=1, description="the Ray namespace of the actors"
    )
    idle_timeout_s: float = Field(
        default=300.0, gt=0, description="an idle session actor passivates after this long"
    )
    max_live_sessions: int = Field(
        default=256,
        ge=1,
        description="live session actors above this evict the least recently used idle ones",
    )
    max_pending_turns: int = Field(
        default=8,
        ge=1,
        description="turns one session holds (running + queued); one more → SessionBusyError",
    )
    turn_deadline_s: float = Field(
        default=900.0,
        gt=0,
        description="an accepted turn ends within this long of its acceptance: a model call "
        "that meets a model over capacity waits for its turn until then, and past it the turn "
        "ends FAILED saying so (never a model error)",
    )
    turn_lease_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="a running turn's lease lasts this long, renewed every third of it; a turn "
        "whose driver died is taken again once it expires (at once when Ray reports its "
        "session actor dead)",
    )
    turn_max_attempts: int = Field(
        default=3,
        ge=1,
        description="times a turn is driven (first run and recoveries) before it ends FAILED",
    )
    turn_orphan_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="a turn not ended, with no live lease, accepted longer ago than this is "
        "an orphan the supervisor drives again",
    )
    turn_replay_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="a reconnecting client's event stream follows a running turn live; after "
        "this long without an event it ends with the turn's status (then reconnect again)",
    )
    reactivation_timeout_s: float = Field(
        default=15.0, gt=0, description="how long a call waits for a passivating actor to go"
    )
    run_retry_limit: int = Field(
        default=5,
        ge=0,
        description="failed attempts in a row to drive a run before the run is failed",
    )
    executor: Literal["actors", "in_process"] = Field(
        default="actors",
        description="what drives runs and turns where the API runs on Ray: one session actor "
        "per run or conversation (actors), or asyncio tasks of the API replica (in_process; "
        "one replica only)",
    )
    warm_actors: int = Field(
        default=2,
        ge=0,
        description="unbound session actors the directory keeps started (imports done, runtime "
        "open) to adopt the next session that needs an actor; 0: every session starts its own",
    )
    status_timeout_s: float = Field(
        default=5.0, gt=0, description="a restarted directory's wait for each actor's status"
    )
    passivate_timeout_s: float = Field(
        default=10.0, gt=0, description="the directory's wait for an evicted actor to answer"
    )
    directory_call_timeout_s: float = Field(
        default=5.0, gt=0, description="an actor's wait on a note to the directory"
    )
    drain_timeout_s: float = Field(
        default=2.0, ge=0, description="how long a leaving actor lets its notes land"
    )
    run_retry_backoff_max_s: float = Field(
        default=30.0,
        gt=0,
        description="longest pause between attempts to drive a failing run (doubling from 0.5 s)",
    )
    label_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Ray node labels the session actors and their directory must run on (JSON, "
        'e.g. {"cortex-ray.io/pool": "cpu"}): keeps them off GPU nodes that scale to zero '
        "(docs/deployment.md); empty: any node",
    )


class RunPolicy(BaseModel):
    """How runs are driven and resumed: ``Settings.runs``, ``CORTEX_RUNS__<FIELD>``.

    A driver holds a run's lease while it drives (renewed every ``lease_renew_s``); a crashed
    driver's lease expires after ``lease_ttl_s``, and the supervisor of the HTTP API resumes
    the run (docs/operations.md, "Interrupted runs")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lease_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="a run's lease lasts this long unless renewed: how soon a run whose driver "
        "died is resumed by another",
    )
    lease_renew_s: float = Field(
        default=10.0, gt=0, description="how often a driver renews its lease (below lease_ttl_s)"
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        description="times a run is taken by a driver without recording a step before it "
        "ends FAILED",
    )
    supervise_interval_s: float = Field(
        default=15.0,
        gt=0,
        description="how often the API's supervisor looks for RUNNING runs nobody drives "
        "(it also looks at start-up)",
    )
    orphan_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="a RUNNING run without a live lease is resumed by the supervisor only when "
        "older than this (a run just submitted is about to be taken by its executor)",
    )
    step_deadline_s: float = Field(
        default=900.0,
        gt=0,
        description="a run step's model calls wait for a model over capacity at most this long "
        "(or until the run's own deadline, if sooner); past it the run ends FAILED saying so",
    )
    max_in_progress: int = Field(
        default=0,
        ge=0,
        description="admission: turns not ended and RUNNING runs at once, across organisations; "
        "one more turn or run is refused (503 overloaded, Retry-After) before anything is "
        "stored; 0: the served model's capacity (replicas × (1 + max_waiting)), no limit "
        "with other model backends",
    )
    schedule_poll_s: float = Field(
        default=1.0,
        gt=0,
        description="the scheduler sleeps until the earliest schedule is due, but at most this "
        "long: how late a schedule made or resumed through another process may fire",
    )

    @model_validator(mode="after")
    def _check(self) -> RunPolicy:
        if self.lease_renew_s >= self.lease_ttl_s:
            raise ValueError("lease_renew_s must be below lease_ttl_s")
        return self


class IngestJobOptions(BaseModel):
    """The ingestion and backfill jobs (``jobs/``): ``Settings.ingest``,
    ``CORTEX_INGEST__<FIELD>``. The jobs' command-line flags take these as their defaults
    (a flag given wins)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_passage_bytes: int = Field(
        default=1200, ge=16, description="the splitter's largest passage, in UTF-8 bytes"
    )
    max_line_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        description="a file with a longer line is skipped (generated data, not prose)",
    )
    embed: bool = Field(
        default=True,
        description="embed section summaries while ingesting; false leaves every vector to "
        "the queries and the backfill job",
    )
    object_store_budget_bytes: int = Field(
        default=256 << 20,
        ge=16 << 20,
        description="Ray Data output kept in the object store before the read tasks pause "
        "(Ray's own default is a share of the store: gigabytes on a big machine)",
    )
    num_cpus: int | None = Field(
        default=None, ge=1, description="CPUs of a local Ray a job starts; unset → all"
    )
    backfill_batch: int = Field(
        default=256, ge=1, description="passages per embedding call of the backfill job"
    )
    backfill_num_gpus: float = Field(
        default=0.0, ge=0, description="GPUs the backfill's embedding actor reserves"
    )
    graph: bool = Field(
        default=True,
        description="extract the context graph's facts from each written version "
        "(the deterministic extractor; docs/graph.md)",
    )
    # The model-based extractor (python -m jobs.graph_extract; off unless that job is run).
    graph_model_batch: int = Field(
        default=4, ge=1, le=64, description="passages per model call of jobs.graph_extract"
    )
    graph_model_batch_chars: int = Field(
        default=6000, ge=200, description="characters of passage text per model call, at most"
    )
    graph_model_actors: int = Field(
        default=1, ge=1, description="jobs.graph_extract's actors (each opens the model once)"
    )
    graph_model_in_flight: int = Field(
        default=2, ge=1, le=64, description="model calls each extractor actor keeps going"
    )
    graph_model_num_gpus: float = Field(
        default=0.0, ge=0, description="GPUs each extractor actor reserves (models.backend=local)"
    )
    graph_model_confidence: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="confidence of a model-extracted fact (rule-based facts have 0.9-1.0)",
    )
    graph_model_retries: int = Field(
        default=1, ge=0, le=5, description="retries of a model answer that does not validate"
    )
    graph_model_max_tokens: int = Field(
        default=1024, ge=64, description="the longest answer of one model call, in tokens"
    )
    graph_model_wait_s: float = Field(
        default=3600.0,
        gt=0,
        description="how long one model call of jobs.graph_extract waits for a model over "
        "capacity (it asks behind interactive work, keeping its place or trying again), "
        "after which the job fails",
    )


class GraphProjectionOptions(BaseModel):
    """The context graph's projection into Neo4j (``python -m jobs.graph_project``):
    ``Settings.graph``, ``CORTEX_GRAPH__<FIELD>`` (docs/graph.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str | None = Field(
        default=None, description="the Bolt server projected into (bolt://host:7687); unset: none"
    )
    user: str = Field(default="neo4j", description="its user")
    password: str | None = Field(default=None, description="its password")
    database: str | None = Field(default=None, description="its database; unset: its default")
    batch: int = Field(default=1000, ge=1, le=50_000, description="outbox rows per transaction")
    poll_s: float = Field(
        default=2.0, gt=0, description="how often a following projector reads the outbox"
    )
