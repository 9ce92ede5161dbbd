"""The dependency lock: `./dev lock` resolves it with uv, `./dev check` checks it.

`requirements/` holds one lock per install target, each resolved by uv for CPython 3.11 on
x86_64 Linux (CI's machines and Ray's official images), never written by hand:

    dev.txt            extras local, ray, graph, dev + the CPU torch   ./dev setup, CI
    image-cpu.txt      extras local, ray + the CPU torch, at dev.txt's pins   Containerfile (cpu)
    image-gpu.txt      extras local, ray + ray[llm] (vLLM, CUDA torch)  Containerfile (gpu)
    qwen-coder-15b.txt, qwen-coder-05b.txt   the model extras (packages of their own alone)
    dev.no-deps.txt, image.no-deps.txt       packages installed with --no-deps

`requirements/inputs.json` records what each lock was resolved from (the requirements of
pyproject.toml, the pins ./dev adds, the resolver and the platform). `check` recomputes
that from today's pyproject.toml and ./dev and compares, and checks that every pin in a lock
satisfies what pyproject.toml asks for: a dependency added, removed or changed without
`./dev lock`, or a lock edited by hand, fails CI with what differs.

    python scripts/lock.py lock  --uv PATH [--upgrade | --upgrade-package NAME ...] PINS
    python scripts/lock.py check PINS
    PINS: --torch-cpu REQ --ray-llm REQ --no-deps REQ ... --no-deps-dev REQ ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
INPUTS = LOCKS / "inputs.json"
PYTHON = "3.11"
# manylinux_2_34: arcadedb-embedded (a test dependency) ships no older wheel; Debian 12 and
# the Ubuntu of Ray's images are newer still.
PLATFORM = "x86_64-manylinux_2_34"
COMPILE_COMMAND = "./dev lock"
# Where the resolver finds the CPU build of torch (PyPI's Linux torch is the CUDA build):
# the copy on this machine's disk, else PyTorch's CPU index. `LOCK_TORCH_CPU_WHEELS`
# overrides it (a folder or a page of links).
TORCH_CPU_WHEELS = ("/opt/wheels", "https://download.pytorch.org/whl/cpu/torch/")


@dataclass(frozen=True)
class Target:
    """One lock file: what it resolves and how."""

    name: str
    extras: tuple[str, ...] = ()
    core: bool = True  # with [project.dependencies]
    torch_cpu: bool = False
    ray_llm: bool = False
    no_deps: tuple[str, ...] = ()  # resolved without dependencies (nothing else)
    keep_pins_of: str | None = None  # another lock whose pins this one must keep

    @property
    def path(self) -> Path:
        return LOCKS / f"{self.name}.txt"


TARGETS = (
    Target("dev", extras=("local", "ray", "graph", "dev"), torch_cpu=True),
    Target("image-cpu", extras=("local", "ray"), torch_cpu=True, keep_pins_of="dev"),
    # vLLM pins its own fastapi, numpy, protobuf and CUDA torch: dev.txt's pins are kept
    # where they fit (preferred, not forced); `check` reports none of the differences.
    Target("image-gpu", extras=("local", "ray"), ray_llm=True),
    Target("qwen-coder-15b", extras=("qwen-coder-15b",), core=False),
    Target("qwen-coder-05b", extras=("qwen-coder-05b",), core=False),
    Target("dev.no-deps", core=False, no_deps=("no-deps", "no-deps-dev")),
    Target("image.no-deps", core=False, no_deps=("no-deps",)),
)


@dataclass(frozen=True)
class Pins:
    """The requirements ./dev adds to pyproject.toml's (they are not extras: see ./dev)."""

    torch_cpu: str
    ray_llm: str
    no_deps: tuple[str, ...]
    no_deps_dev: tuple[str, ...]


def _pyproject(root: Path) -> dict[str, object]:
    with (root / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    assert isinstance(project, dict)
    return project


def requirements_of(target: Target, pins: Pins, root: Path = ROOT) -> list[str]:
    """What the target asks for, normalised (`packaging`'s spelling) and sorted."""
    project = _pyproject(root)
    wanted: list[str] = []
    if target.core:
        wanted += list(project.get("dependencies", []))  # type: ignore[call-overload]
    optional = project.get("optional-dependencies", {})
    assert isinstance(optional, dict)
    for extra in target.extras:
        if extra not in optional:
            raise SystemExit(f"error: pyproject.toml has no extra {extra!r} (lock {target.name})")
        wanted += optional[extra]
    if target.torch_cpu:
        wanted.append(pins.torch_cpu)
    if target.ray_llm:
        wanted.append(pins.ray_llm)
    for group in target.no_deps:
        wanted += pins.no_deps if group == "no-deps" else pins.no_deps_dev
    return sorted({str(Requirement(line)) for line in wanted})


def _pins_of(path: Path, found: list[str] | None = None) -> dict[str, str]:
    """name -> version of every `name==version` line of a lock file (a second pin of the
    same name is added to `found`)."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)", line)
        if match:
            name = canonicalize_name(match.group(1))
            if name in pins and found is not None:
                found.append(f"{path.parent.name}/{path.name} pins {name} twice")
            pins[name] = match.group(3)
    return pins


def inputs_of(target: Target, pins: Pins, uv_version: str, root: Path = ROOT) -> dict[str, object]:
    """Everything the target's lock depends on, as recorded in requirements/inputs.json."""
    project = _pyproject(root)
    inputs: dict[str, object] = {
        "requires-python": project.get("requires-python", ""),
        "python": PYTHON,
        "platform": PLATFORM,
        "uv": uv_version,
        "requirements": requirements_of(target, pins, root),
    }
    if target.keep_pins_of:
        kept = (root / "requirements" / f"{target.keep_pins_of}.txt").read_bytes()
        inputs["keeps pins of"] = {target.keep_pins_of: hashlib.sha256(kept).hexdigest()}
    return inputs


def _torch_cpu_wheels() -> str:
    chosen = os.environ.get("LOCK_TORCH_CPU_WHEELS")
    if chosen:
        return chosen
    local, index = TORCH_CPU_WHEELS
    return local if Path(local).is_dir() else index


def lock(pins: Pins, uv: str, upgrade: Sequence[str]) -> None:
    """Resolve every target with uv, keeping today's pins unless told to upgrade."""
    uv_version = subprocess.run(
        [uv, "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    LOCKS.mkdir(exist_ok=True)
    recorded: dict[str, object] = {}
    for target in TARGETS:
        wanted = requirements_of(target, pins)
        command = [
            uv, "pip", "compile", "-", "--quiet",
            "--python-version", PYTHON, "--python-platform", PLATFORM,
            "--custom-compile-command", COMPILE_COMMAND, "--output-file", str(target.path),
            *upgrade,
        ]  # fmt: skip
        if target.no_deps:
            command.append("--no-deps")
        if target.torch_cpu:
            command += ["--find-links", _torch_cpu_wheels()]
        if target.keep_pins_of:
            command += ["--constraints", str(LOCKS / f"{target.keep_pins_of}.txt")]
        if target.ray_llm and not target.path.exists():
            # uv keeps the pins of an existing output file where they fit: a first
            # resolution starts from dev.txt's (less its CPU torch)
            dev = (LOCKS / "dev.txt").read_text().splitlines()
            target.path.write_text("\n".join(p for p in dev if not p.startswith("torch=")))
        print(f"==> lock {target.path.relative_to(ROOT)}", file=sys.stderr)
        subprocess.run(command, input="\n".join(wanted) + "\n", text=True, check=True, cwd=ROOT)
        recorded[target.name] = inputs_of(target, pins, uv_version)
    INPUTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


def problems(pins: Pins, root: Path = ROOT) -> list[str]:
    """Where pyproject.toml (and ./dev's pins) and the lock disagree; empty when they agree."""
    inputs_path = root / "requirements" / "inputs.json"
    if not inputs_path.exists():
        return [f"{inputs_path.relative_to(root)} is missing"]
    recorded = json.loads(inputs_path.read_text())
    found: list[str] = []
    for target in TARGETS:
        path = root / "requirements" / f"{target.name}.txt"
        name = path.relative_to(root)
        if not path.exists() or target.name not in recorded:
            found.append(f"{name}: missing")
            continue
        before = recorded[target.name]
        now = inputs_of(target, pins, str(before.get("uv", "")), root)
        for key in sorted(set(before) | set(now)):
            if before.get(key) == now.get(key):
                continue
            if key == "requirements":
                was, wants = set(before[key]), set(requirements_of(target, pins, root))
                added, gone = sorted(wants - was), sorted(was - wants)
                found.append(f"{name}: asked for now but not locked: {added}; locked but no "
                             f"longer asked for: {gone}")  # fmt: skip
            else:
                found.append(f"{name}: {key} was {before.get(key)!r}, is {now.get(key)!r}")
        locked = _pins_of(path, found)
        for line in requirements_of(target, pins, root):
            requirement = Requirement(line)
            environment = {"python_version": PYTHON, "sys_platform": "linux",
                           "platform_system": "Linux", "platform_machine": "x86_64"}  # fmt: skip
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            key = canonicalize_name(requirement.name)
            if key not in locked:
                found.append(f"{name}: {requirement} is not in the lock")
            elif not requirement.specifier.contains(Version(locked[key]), prereleases=True):
                found.append(f"{name}: {key}=={locked[key]} does not satisfy {requirement}")
        if target.keep_pins_of:
            kept = _pins_of(root / "requirements" / f"{target.keep_pins_of}.txt")
            for key, version in sorted(locked.items()):
                if kept.get(key, version) != version:
                    found.append(f"{name}: {key}=={version}, but {target.keep_pins_of}.txt "
                                 f"has {kept[key]}")  # fmt: skip
    return found


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/lock.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("lock", "check"))
    parser.add_argument("--torch-cpu", required=True)
    parser.add_argument("--ray-llm", required=True)
    parser.add_argument("--no-deps", action="append", default=[])
    parser.add_argument("--no-deps-dev", action="append", default=[])
    parser.add_argument("--uv", default="uv")
    parser.add_argument("--upgrade", action="store_true")
    parser.add_argument("--upgrade-package", action="append", default=[])
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    pins = Pins(args.torch_cpu, args.ray_llm, tuple(args.no_deps), tuple(args.no_deps_dev))
    if args.command == "lock":
        upgrade = ["--upgrade"] if args.upgrade else []
        for name in args.upgrade_package:
            upgrade += ["--upgrade-package", name]
        lock(pins, args.uv, upgrade)
    found = problems(pins)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if found:
        print("pyproject.toml and requirements/ disagree: run ./dev lock and commit "
              "requirements/", file=sys.stderr)  # fmt: skip
        return 1
    print(f"the lock agrees with pyproject.toml ({len(TARGETS)} files in requirements/)",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
