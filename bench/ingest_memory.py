"""Ingestion memory (issue 5): the job's peak memory does not grow with the input.

For each size (default 500 MB and 5 GB) the script writes ONE Markdown file of that size
under a scratch folder (a heading every ~1 MB, paragraphs of prose, code fences, a few long
lines), runs the real job as its own process (``python -m jobs.ingest`` on a fresh local Ray
with 2 CPUs) and samples, every 0.25 s, the memory of the whole process tree of the job: the
driver, Ray's own processes (GCS, raylet, dashboard, ...) and every Ray worker, all of which
are descendants of the driver. Reported: peak of the summed PSS (proportional set size:
shared pages split between the processes that share them, so the sum is what the tree
really uses) and peak of the summed RSS (counts shared pages once per process, so it
overstates), the PSS of the driver and the Ray workers alone (``ray::...`` processes; the
GCS, raylet and dashboard are Ray's own, as large for an empty job), and separately the
embedded PostgreSQL server's PSS (its processes are not children of the job), and the
peak PSS of the largest processes. Target: the largest size's peak PSS within 20% of the
smallest's, and under 2 GB. The files and the scratch database are deleted afterwards.

Modes: ``--dry-run`` runs the job with ``--dry-run`` (check and split every byte, write
nothing); without it the job writes to an embedded PostgreSQL in the scratch folder and
embeds section summaries with MiniLM (the whole default job).

Run: ``.venv/bin/python bench/ingest_memory.py [--sizes 500M,5G] [--dry-run]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._scratch import scratch_data_dir
from cortex_ray import run_main

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _block(i: int) -> bytes:
    """About 1 MB of Markdown: one heading, prose paragraphs, a code fence, a long line."""
    sentence = "The quick brown fox jumps over the lazy dog near the river bank. "
    parts = [f"## Part {i}\n\nIntro for part {i}.\n\n"]
    size = 0
    n = 0
    while size < MB:
        n += 1
        if n % 50 == 0:
            text = "```python\n# not a heading\nprint('hello')\n```\n\n"
        elif n % 97 == 0:
            text = "word " * 1000 + "\n\n"  # a 5 KB line: split at character boundaries
        else:
            text = sentence * (3 + n % 9) + "\n" + sentence * (n % 4) + "\n\n"
        parts.append(text)
        size += len(text)
    return "".join(parts).encode()


def write_markdown(path: Path, size: int) -> None:
    template = _block(0)
    with open(path, "wb") as f:
        f.write(b"# Benchmark corpus\n\n")
        written = 0
        i = 0
        while written < size:
            head = f"## Part {i}\n".encode()
            body = template[template.index(b"\n") + 1 :]
            f.write(head + body)
            written += len(head) + len(body)
            i += 1


@dataclass
class Peak:
    pss: int = 0
    rss: int = 0
    pg_pss: int = 0
    processes: int = 0
    job_pss: int = 0  # the driver and the Ray worker processes only (no GCS, raylet, dashboard)
    by_name: dict[str, int] = field(default_factory=dict)  # peak PSS per process name


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _tree(root: int) -> list[int]:
    children = _children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _mem(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in bytes; (0, 0) if it is gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss


def _postgres_pids(data_dir: Path) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"postgres" in cmdline and str(data_dir).encode() in cmdline:
            pids.append(int(entry))
    # the postmaster's children (backends, walwriter, ...) carry no data dir in their cmdline
    children = _children_map()
    out: list[int] = []
    for pid in pids:
        out.append(pid)
        out.extend(children.get(pid, []))
    return sorted(set(out))


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    if argv[0].startswith(b"ray::"):
        return argv[0].decode(errors="replace")
    script = next((a for a in argv[1:] if a.endswith(b".py")), argv[0])
    return Path(script.decode(errors="replace")).name


def _is_worker(pid: int) -> bool:
    """Ray names its worker processes ``ray::<task or actor>`` (``ray::IDLE`` when idle)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::")
    except OSError:
        return False


def sample(
    proc: subprocess.Popen[str], data_dir: Path | None, peak: Peak, stop: threading.Event
) -> None:
    while not stop.is_set() and proc.poll() is None:
        pids = _tree(proc.pid)
        pss = rss = job = 0
        for pid in pids:
            p, r = _mem(pid)
            pss += p
            rss += r
            if pid == proc.pid or _is_worker(pid):
                job += p
            name = "driver" if pid == proc.pid else _name(pid)
            peak.by_name[name] = max(peak.by_name.get(name, 0), p)
        peak.job_pss = max(peak.job_pss, job)
        peak.pss = max(peak.pss, pss)
        peak.rss = max(peak.rss, rss)
        peak.processes = max(peak.processes, len(pids))
        if data_dir is not None:
            pg = sum(_mem(pid)[0] for pid in _postgres_pids(data_dir))
            peak.pg_pss = max(peak.pg_pss, pg)
        stop.wait(0.25)


def run_one(path: Path, data_dir: Path, dry_run: bool) -> tuple[Peak, float, dict[str, object]]:
    argv = [
        sys.executable,
        "-m",
        "jobs.ingest",
        "--org",
        "bench",
        "--collection",
        f"mem-{path.stat().st_size}",
        "--num-cpus",
        "2",
        "--no-progress",
    ]
    argv += ["--dry-run"] if dry_run else []
    argv.append(str(path))
    env = {
        **os.environ,
        "CORTEX_STORAGE__DATA_DIR": str(data_dir),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    for name in ("CORTEX_STORAGE__DATABASE_URL", "CORTEX_DATABASE_URL"):  # and its old name
        env.pop(name, None)  # the embedded server in the scratch folder
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peak = Peak()
    stop = threading.Event()
    sampler = threading.Thread(
        target=sample, args=(proc, None if dry_run else data_dir, peak, stop)
    )
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{err[-4000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    return peak, seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500M,5G")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    mode = (
        "dry run (check + split, no writes)"
        if args.dry_run
        else ("full job (PostgreSQL writes + MiniLM section vectors)")
    )
    print(f"Ingestion memory: one Markdown file per size; {mode}; local Ray, 2 CPUs")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at start"
    )
    print()
    print(
        f"{'size':>9} {'seconds':>8} {'MB/s':>6} {'passages':>10} {'peak PSS':>9} "
        f"{'peak RSS':>9} {'PG PSS':>8} {'procs':>5} {'driver+workers PSS':>18}"
    )
    results = []
    with scratch_data_dir(args.data_dir) as data_dir:
        for size in sizes:
            folder = Path(tempfile.mkdtemp(prefix="cortex-ray-ingest-mem-", dir="/tmp"))
            try:
                path = folder / "corpus.md"
                write_markdown(path, size)
                actual = path.stat().st_size
                peak, seconds, report = run_one(path, data_dir, args.dry_run)
            finally:
                for child in folder.iterdir():
                    child.unlink()
                folder.rmdir()
            results.append((actual, peak))
            pg = f"{peak.pg_pss / MB:7.0f}M" if not args.dry_run else "      –"
            print(
                f"{actual / MB:8.0f}M {seconds:8.1f} {actual / MB / seconds:6.1f} "
                f"{report['passages']:>10} {peak.pss / MB:8.0f}M {peak.rss / MB:8.0f}M "
                f"{pg} {peak.processes:>5} {peak.job_pss / MB:17.0f}M",
                flush=True,
            )
    small, large = results[0][1], results[-1][1]
    ratio = large.pss / small.pss
    job_ratio = large.job_pss / small.job_pss
    ok = ratio <= 1.2 and large.pss < 2 * 1024 * MB
    print()
    print(
        f"peak PSS {results[-1][0] / MB:.0f}M / {results[0][0] / MB:.0f}M input: {ratio:.2f}x "
        f"(target <= 1.20x), largest {large.pss / MB:.0f} MB (target < 2048 MB)   "
        f"{'PASS' if ok else 'FAIL'}"
    )
    print(
        f"driver + Ray workers only (no GCS, raylet, dashboard): {large.job_pss / MB:.0f} MB "
        f"vs {small.job_pss / MB:.0f} MB, {job_ratio:.2f}x"
    )
    top = sorted(large.by_name.items(), key=lambda kv: -kv[1])[:8]
    print(
        "largest processes at the largest size (peak PSS each): "
        + ", ".join(f"{name} {pss / MB:.0f}M" for name, pss in top)
    )
    if args.check and not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(run_main(main))
