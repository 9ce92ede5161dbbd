"""One settings tree: every ``CORTEX_`` variable is a setting, a known project variable or
reported; model serving and the jobs take their defaults from the same tree; the embedding
dimension is the schema's, not a setting. No Ray is started here."""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path
from typing import cast

import pytest
import yaml

from cortex_ray import ConfigurationError, InvalidRequestError, Runtime, Settings, load_settings
from cortex_ray.knowledge import DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_PASSAGE_BYTES, VECTOR_DIM
from cortex_ray.memory import EMBEDDING_DIM
from cortex_ray.models import HashEmbedder
from cortex_ray.settings import (
    PROJECT_VARIABLES,
    setting_field,
    setting_variables,
    unknown_variables,
)
from cortex_ray.storage import Database

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment without any CORTEX_ variable of the shell that runs the tests."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CORTEX_"):
            monkeypatch.delenv(name)
    return monkeypatch


# unknown variables -----------------------------------------------------------------------


def test_every_group_is_walked() -> None:
    names = set(setting_variables())
    for variable in (
        "CORTEX_DATABASE_URL",
        "CORTEX_API",  # a whole group, as JSON
        "CORTEX_API__PORT",
        "CORTEX_SESSIONS__IDLE_TIMEOUT_S",
        "CORTEX_KNOWLEDGE__POSTINGS_PER_TERM",
        "CORTEX_INGEST__BACKFILL_BATCH",
        "CORTEX_STRICT_SETTINGS",
    ):
        assert variable in names
    assert "CORTEX_EMBEDDING_DIM" not in names


def test_each_unknown_variable_is_one_warning_with_the_closest_name(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("CORTEX_MODEL_MAX_TOKEN", "100")
    clean_env.setenv("CORTEX_API__PROT", "9001")
    clean_env.setenv("CORTEX_API__PORT", "9000")
    clean_env.setenv("CORTEX_SESSIONS__IDLE_TIMOUT_S", "5")
    clean_env.setenv("CORTEX_KNOWLEDGE__FUSON", "rrf")
    clean_env.setenv("CORTEX_INGEST__BACKFIL_BATCH", "8")
    with caplog.at_level(logging.WARNING, logger="cortex_ray.settings"):
        settings = load_settings()
    lines = [r.getMessage() for r in caplog.records if r.name == "cortex_ray.settings"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert sorted(lines) == [
        "CORTEX_API__PROT names no setting and is ignored: did you mean CORTEX_API__PORT?",
        "CORTEX_INGEST__BACKFIL_BATCH names no setting and is ignored: did you mean "
        "CORTEX_INGEST__BACKFILL_BATCH?",
        "CORTEX_KNOWLEDGE__FUSON names no setting and is ignored: did you mean "
        "CORTEX_KNOWLEDGE__FUSION?",
        "CORTEX_MODEL_MAX_TOKEN names no setting and is ignored: did you mean "
        "CORTEX_MODEL_MAX_TOKENS?",
        "CORTEX_SESSIONS__IDLE_TIMOUT_S names no setting and is ignored: did you mean "
        "CORTEX_SESSIONS__IDLE_TIMEOUT_S?",
    ]
    # A misspelt field of a group that forbids extras is reported like any other, not a
    # validation error, and the group's valid variables still apply.
    assert settings.api.port == 9000
    assert settings.models.max_tokens == setting_field("model_max_tokens").default


def test_valid_and_project_variables_are_not_reported(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in PROJECT_VARIABLES:
        clean_env.setenv(name, "x")
    clean_env.setenv("cortex_api__port", "9002")  # pydantic-settings ignores the case
    clean_env.setenv("CORTEX_SESSIONS", '{"namespace": "elsewhere"}')
    clean_env.setenv("CORTEXT_NOT_OURS", "1")
    with caplog.at_level(logging.WARNING, logger="cortex_ray.settings"):
        settings = load_settings()
    assert [r for r in caplog.records if r.name == "cortex_ray.settings"] == []
    assert settings.api.port == 9002 and settings.sessions.namespace == "elsewhere"


def test_the_removed_embedding_dim_says_why(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CORTEX_EMBEDDING_DIM", "768")
    hint = unknown_variables()["CORTEX_EMBEDDING_DIM"]
    assert "schema" in hint and "not a setting" in hint and "docs/operations.md" in hint


def test_the_hint_suggests_only_close_names() -> None:
    """The shared ``CORTEX_`` prefix does not make two names alike: a different word gets no
    suggestion (``CORTEX_CHECKOUT`` was told ``CORTEX_RECALL_K``), a typo still does."""
    hints = unknown_variables(
        {
            "CORTEX_CHECKOUT": "",
            "CORTEX_FOO": "",
            "CORTEX_LOG": "",
            "CORTEX_DATADIR": "",
            "CORTEX_MODLE_URL": "",
            "cortex_api__prot": "",
        }
    )
    assert hints == {
        "CORTEX_CHECKOUT": "no setting is close",
        "CORTEX_FOO": "no setting is close",
        "CORTEX_LOG": "no setting is close",
        "CORTEX_DATADIR": "did you mean CORTEX_DATA_DIR?",
        "CORTEX_MODLE_URL": "did you mean CORTEX_MODEL_URL?",
        "cortex_api__prot": "did you mean CORTEX_API__PORT?",
    }


def test_strict_mode_raises_naming_every_unknown_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CORTEX_API__PROT", "1")
    clean_env.setenv("CORTEX_EMBEDDING_DIM", "768")
    with pytest.raises(ConfigurationError) as raised:
        load_settings(strict=True)
    assert "CORTEX_API__PROT (did you mean CORTEX_API__PORT?)" in str(raised.value)
    assert "CORTEX_EMBEDDING_DIM" in str(raised.value)
    clean_env.setenv("CORTEX_STRICT_SETTINGS", "true")
    with pytest.raises(ConfigurationError, match="CORTEX_API__PROT"):
        load_settings()
    assert load_settings(strict=False).strict_settings  # the argument wins


def test_a_bad_value_names_its_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CORTEX_INGEST__MAX_PASSAGE_BYTES", "3")
    with pytest.raises(ConfigurationError, match="invalid setting CORTEX_INGEST__MAX_PASSAGE"):
        load_settings()


def test_every_cortex_variable_the_project_mentions_is_known() -> None:
    """Code, docs, config files and scripts name only settings, project variables or the
    removed ones (whose mention explains the removal)."""
    mentioned: dict[str, set[str]] = {}
    files = [
        p
        for folder in ("cortex_ray", "serve", "actors", "jobs", "tests", "bench", "docs", "cluster")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in {".py", ".md", ".yaml", ".yml"} and p.name != "test_settings.py"
    ]
    for path in [*files, ROOT / "README.md", ROOT / "dev"]:
        # "X names no setting" quotes the warning about a misspelt X: not a mention
        mentions = r"(?<![A-Za-z0-9_])CORTEX_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]| names no setting)"
        for name in re.findall(mentions, path.read_text()):
            mentioned.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    known = set(setting_variables()) | set(PROJECT_VARIABLES)
    removed = {n for n in mentioned if "not a setting" in unknown_variables({n: ""}).get(n, "")}
    stale = {n: sorted(paths) for n, paths in mentioned.items() if n not in known | removed}
    assert stale == {}


# model serving reads the same tree -------------------------------------------------------


def test_serving_defaults_are_the_settings_defaults() -> None:
    from serve.models import EmbedderConfig, LlmConfig
    from serve.models._config import SETTINGS_MIRROR

    assert {part for part, _ in SETTINGS_MIRROR} == {EmbedderConfig, LlmConfig}
    for (part, field), setting in SETTINGS_MIRROR.items():
        ours = part.model_fields[field].get_default(call_default_factory=True)
        theirs = setting_field(setting).get_default(call_default_factory=True)
        assert ours == theirs, f"{part.__name__}.{field} {ours!r} != Settings.{setting}"
    # What the in-process backends configure, the served ones must too.
    mirrored = set(SETTINGS_MIRROR.values())
    for setting in (
        "model_name",
        "local_model_path",
        "data_dir",
        "local_model_context",
        "local_model_threads",
        "model_max_tokens",
        "model_temperature",
        "embedding_model",
        "embedding_device",
    ):
        assert setting in mirrored


def test_serving_config_for_carries_every_mirrored_setting(tmp_path: Path) -> None:
    from serve.models import serving_config_for
    from serve.models._config import SETTINGS_MIRROR

    values = {
        "model_name": "other-llm",
        "local_model_path": tmp_path / "model.gguf",
        "data_dir": tmp_path / "data",
        "local_model_context": 2048,
        "local_model_threads": 3,
        "model_max_tokens": 99,
        "model_temperature": 0.7,
        "embedding_model": "/models/minilm",
        "embedding_device": "cpu",
    }
    settings = Settings(model_backend="served", embedding_backend="served", **values)  # type: ignore[arg-type]
    config = serving_config_for(settings)
    assert config is not None and config.llm is not None and config.embedder is not None
    parts = {type(config.llm): config.llm, type(config.embedder): config.embedder}
    for (part, field), setting in SETTINGS_MIRROR.items():
        assert getattr(parts[part], field) == values[setting], f"{part.__name__}.{field}"


@pytest.mark.parametrize("name", ["serve-cpu.yaml", "serve-gpu.yaml"])
def test_serve_config_files_are_valid(name: str) -> None:
    from serve.models import ModelServingConfig

    config = yaml.safe_load((ROOT / "cluster" / name).read_text())
    apps = [a for a in config["applications"] if a["import_path"] == "serve.models:build_app"]
    assert apps
    for app in apps:
        ModelServingConfig.model_validate(app.get("args") or {})


# the embedding dimension is the schema's ---------------------------------------------------


def test_one_dimension_everywhere_in_the_schema() -> None:
    assert "embedding_dim" not in Settings.model_fields
    assert VECTOR_DIM == EMBEDDING_DIM
    assert Settings().embedding_dim == EMBEDDING_DIM  # the read-only compatibility property
    sources = [*(ROOT / "cortex_ray").rglob("*.py")]
    dims = {
        (str(p.relative_to(ROOT)), int(d))
        for p in sources
        for d in re.findall(r"\b(?:half)?vec(?:tor)?\((\d+)\)", p.read_text())
    }
    assert any("migrations" in p for p, _ in dims)
    assert {d for _, d in dims} == {EMBEDDING_DIM}, sorted(dims)


async def test_an_embedder_of_another_dimension_is_refused_at_open() -> None:
    # Refused before the database is touched: a stand-in that is not a database will do.
    stand_in = cast(Database, object())
    with pytest.raises(ConfigurationError) as raised:
        await Runtime.open(Settings(), model=None, embedder=HashEmbedder(768), db=stand_in)
    assert "768" in str(raised.value) and str(EMBEDDING_DIM) in str(raised.value)
    assert "HashEmbedder" in str(raised.value)  # names the embedder


def test_a_served_embedder_of_another_dimension_is_refused() -> None:
    from serve.models._handles import _check_embedder_dim

    _check_embedder_dim(EMBEDDING_DIM, "'minilm' of the Serve app 'm'")
    with pytest.raises(ConfigurationError) as raised:
        _check_embedder_dim(768, "'bge-base' of the Serve app 'm'")
    message = str(raised.value)
    assert "'bge-base'" in message and "768-d" in message and f"{EMBEDDING_DIM}-d" in message


def test_the_openai_embedder_takes_the_schema_dimension_and_the_settings() -> None:
    from cortex_ray.models.openai_embeddings import OpenAICompatibleEmbedder

    settings = Settings(
        embedding_backend="openai",
        embedding_url="http://127.0.0.1:1/v1",
        model_max_retries=5,
        model_timeout_s=7.0,
    )
    embedder = OpenAICompatibleEmbedder.from_options(settings.embeddings, settings.models)
    assert embedder.dim == EMBEDDING_DIM
    assert embedder._client.max_retries == 5 and embedder._client.timeout == 7.0


# the jobs take their defaults from Settings.ingest -------------------------------------------


def test_job_defaults_are_the_settings_defaults() -> None:
    from jobs._entry import job_default
    from jobs.backfill import backfill
    from jobs.ingest import run_ingest

    assert job_default("max_passage_bytes") == DEFAULT_MAX_PASSAGE_BYTES
    assert job_default("max_line_bytes") == DEFAULT_MAX_LINE_BYTES
    ingest = inspect.signature(run_ingest).parameters
    for name in ("max_passage_bytes", "max_line_bytes", "embed", "object_store_budget_bytes"):
        assert ingest[name].default == job_default(name), name
    filling = inspect.signature(backfill).parameters
    assert filling["batch"].default == job_default("backfill_batch")
    assert filling["num_gpus"].default == job_default("backfill_num_gpus")


def test_job_flags_override_the_settings_within_their_limits(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from jobs._entry import job_options

    clean_env.setenv("CORTEX_INGEST__BACKFILL_BATCH", "64")
    clean_env.setenv("CORTEX_INGEST__NUM_CPUS", "2")
    settings = load_settings()
    job = job_options(settings, backfill_batch=None, num_cpus=1, embed=False)
    assert (job.backfill_batch, job.num_cpus, job.embed) == (64, 1, False)
    with pytest.raises(InvalidRequestError, match="--max-passage-bytes"):
        job_options(settings, max_passage_bytes=3)
    # A job whose flag is not the setting's name (jobs.backfill's --batch) names its flag.
    with pytest.raises(InvalidRequestError, match="invalid option --batch: "):
        job_options(settings, {"backfill_batch": "--batch"}, backfill_batch=0)


def test_no_entry_point_builds_settings_by_hand() -> None:
    """``load_settings()``, not ``Settings()``: the one that names a bad variable and reports
    the unknown ones."""
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("cortex_ray", "serve", "actors", "jobs", "bench")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "_settings.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bSettings\(\)", line)
    ]
    assert offenders == []


# the groups and the old flat names -----------------------------------------------------------


def test_every_old_flat_name_has_one_place() -> None:
    from cortex_ray.settings import ALIASES, DECIDE_SETTINGS, alias_variables

    places = list(ALIASES.values())
    assert len(places) == len(set(places))  # no two old names share a place
    for old, (group, field) in ALIASES.items():
        assert setting_field(old) is setting_field(f"{group}.{field}")
        assert old not in Settings.model_fields
    assert set(DECIDE_SETTINGS) <= set(ALIASES)
    assert set(alias_variables()) <= set(setting_variables())


def test_an_old_variable_sets_its_new_place_and_the_new_one_wins(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("CORTEX_MODEL_MAX_TOKENS", "99")
    clean_env.setenv("CORTEX_RECALL_ALPHA", "0.5")
    clean_env.setenv("CORTEX_MEMORY__RECALL_ALPHA", "0.7")
    clean_env.setenv("CORTEX_DECIDE__CANDIDATES", "3")
    with caplog.at_level(logging.WARNING, logger="cortex_ray.settings"):
        settings = load_settings(strict=True)  # old names are known: no warning, no error
    assert caplog.records == []
    assert settings.models.max_tokens == 99
    assert settings.memory.recall_alpha == 0.7
    assert settings.decide.candidates == 3


def test_an_invalid_old_variable_is_named_as_it_was_set(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CORTEX_MODEL_BACKEND", "bogus")
    with pytest.raises(ConfigurationError, match="invalid setting CORTEX_MODEL_BACKEND: "):
        load_settings()
    clean_env.delenv("CORTEX_MODEL_BACKEND")
    clean_env.setenv("CORTEX_MODELS__BACKEND", "bogus")
    with pytest.raises(ConfigurationError, match="invalid setting CORTEX_MODELS__BACKEND: "):
        load_settings()


def test_old_keywords_copies_and_reads_reach_the_groups(clean_env: pytest.MonkeyPatch) -> None:
    from cortex_ray.settings import ModelOptions

    settings = Settings(model_name="m", pool_max_size=3, models=ModelOptions(max_tokens=99))
    assert (settings.models.name, settings.models.max_tokens) == ("m", 99)
    assert settings.storage.pool_max_size == 3
    copied = settings.model_copy(update={"pool_min_size": 2, "candidates": 4})
    assert (copied.storage.pool_min_size, copied.storage.pool_max_size) == (2, 3)
    assert copied.decide.candidates == 4 and settings.decide.candidates == 1
    flat = "model_name"  # a deprecated read, as older code makes it
    with pytest.warns(DeprecationWarning, match="Settings.models.name"):
        assert getattr(settings, flat) == "m"
    with pytest.raises(AttributeError):
        _ = settings.no_such_setting  # type: ignore[attr-defined]


def test_settings_import_nothing_above_them() -> None:
    """The settings are the bottom layer: their modules import no room of the core."""
    allowed = {"cortex_ray._exceptions", "cortex_ray._types"}
    for path in (ROOT / "cortex_ray" / "settings").glob("*.py"):
        imported = set(re.findall(r"^from (cortex_ray[\w.]*) import", path.read_text(), re.M))
        above = {m for m in imported if not m.startswith("cortex_ray.settings")} - allowed
        assert above == set(), path.name
