"""What readying a worktree costs: the `.worktreeinclude` copy against `cp -r`, and `[worktree] setup`.

1. Copy: a repository whose ignored `.worktreeinclude` set is MB megabytes (default 200: a few large files
   and many small ones, as a `.env` plus local data and fixtures), copied into W new worktrees (default 8)
   with stellafleet's copy (git lists the files, then a copy-on-write clone where the file system can,
   else copy_file_range) and, in the same run, with `cp -r` of the same set into W fresh directories.
   The figure is the ratio of the two wall times; the file system's name says whether clones were possible.

2. Setup: a real `stella fleet` of T isolated no-op tasks (default 4) run twice, without and with
   `[worktree] setup = "sleep S"` (default 0.5 s). Each attempt's recorded `setup_ms` is printed against
   S (what the ledger adds to the command's own time), and the attempts' median duration with and
   without setup (what a setup costs an attempt beyond the command itself).

    python bench/bootstrap.py [--mb 200] [--worktrees 8] [--tasks 4] [--setup-seconds 0.5] [--skip-fleet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import commit_all, new_repo, sh

from stellafleet.core.paths import StatePaths
from stellafleet.git import include
from stellafleet.state.ledger import Ledger

STELLA = [sys.executable, "-m", "stellafleet"]


def make_repo(root: Path) -> Path:
    new_repo(root)
    (root / ".gitignore").write_text("local/\n.env\n")
    (root / ".worktreeinclude").write_text("local/\n.env\n")
    (root / "README.md").write_text("bench\n")
    return commit_all(root, "init")


def fill_include_set(root: Path, mb: float) -> tuple[int, int]:
    """Half the bytes in 4 large files, half in 1 KB..64 KB small ones; (files, bytes)."""
    total = int(mb * 1_000_000)
    (root / ".env").write_text("API_TOKEN=bench\n")
    big = root / "local" / "data"
    small = root / "local" / "fixtures"
    big.mkdir(parents=True)
    small.mkdir(parents=True)
    files, written = 1, 16
    chunk = os.urandom(1 << 20)
    for n in range(4):
        size = total // 8
        with (big / f"blob{n}.bin").open("wb") as out:
            left = size
            while left > 0:
                out.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
        files, written = files + 1, written + size
    n = 0
    while written < total:
        size = min(1024 * (1 + n % 64), total - written)
        (small / f"f{n:05d}.json").write_bytes(chunk[:size])
        files, written, n = files + 1, written + size, n + 1
    return files, written


def filesystem(path: Path) -> str:
    out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout.splitlines()
    return out[-1].split()[1] if len(out) > 1 else "unknown"


def bench_copy(scratch: Path, mb: float, count: int) -> None:
    repo = make_repo(scratch / "repo")
    files, size = fill_include_set(repo, mb)
    trees = []
    for n in range(count):
        tree = scratch / "trees" / f"wt{n}"
        sh("git", "worktree", "add", "-q", "-b", f"fleet/wt{n}", str(tree), "HEAD", cwd=repo)
        trees.append(tree)
    sh("sync", cwd=repo)
    started = time.perf_counter()
    cloned = 0
    for tree in trees:
        copied = include.copy_into(repo, tree, include.included_files(repo))
        assert copied.files == files, (copied.files, files)
        cloned += copied.cloned
    ours = time.perf_counter() - started
    started = time.perf_counter()
    for n in range(count):
        target = scratch / "cp" / f"d{n}"
        target.mkdir(parents=True)
        sh("cp", "-r", str(repo / "local"), str(repo / ".env"), str(target), cwd=repo)
    plain = time.perf_counter() - started
    print(f"include set: {files} files, {size / 1e6:.0f} MB, into {count} worktrees on {filesystem(repo)}")
    clones = f"({cloned} of {files * count} copies were clones)"
    print(f"  stellafleet copy (listing included)  {ours:7.2f} s  {clones}")
    print(f"  cp -r of the same files               {plain:7.2f} s")
    print(f"  ratio stellafleet / cp -r             {ours / plain:7.2f}")


def fleet_durations(repo: Path, plan: Path, config: str) -> list[dict]:
    StatePaths(repo).config_file.parent.mkdir(parents=True, exist_ok=True)
    StatePaths(repo).config_file.write_text('[pipelines.command]\nrun = "true"\n\n' + config)
    done = subprocess.run(
        [*STELLA, "-q", "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the fleet failed: {done.stdout}{done.stderr}")
    with Ledger.open(StatePaths(repo).fleet_db, readonly=True) as ledger:
        return ledger.attempts.of_run(ledger.runs.resolve("latest"))


def bench_setup(scratch: Path, tasks: int, seconds: float) -> None:
    repo = make_repo(scratch / "fleet-repo")
    plan = scratch / "plan.toml"
    plan.write_text(
        "".join(f'[[tasks]]\nid = "t{n}"\nprompt = "p"\nisolation = "isolated"\n\n' for n in range(tasks))
    )
    without = fleet_durations(repo, plan, "")
    with_setup = fleet_durations(repo, plan, f'[worktree]\nsetup = "sleep {seconds}"\n')

    def median_ms(rows: list[dict]) -> float:
        return statistics.median(row["finished_at_ms"] - row["started_at_ms"] for row in rows)

    recorded = [int(row["setup_ms"]) for row in with_setup]
    print(f"setup = 'sleep {seconds:g}' on {tasks} isolated tasks (2 at a time)")
    print("  setup_ms recorded per attempt          " + ", ".join(str(ms) for ms in recorded))
    print(f"  recorded beyond the sleep (median)     {statistics.median(recorded) - seconds * 1000:7.0f} ms")
    print(f"  attempt without setup (median)         {median_ms(without):7.0f} ms")
    print(f"  attempt with setup (median)            {median_ms(with_setup):7.0f} ms")
    added = median_ms(with_setup) - median_ms(without) - seconds * 1000
    print(f"  setup's cost beyond the sleep          {added:7.0f} ms per attempt")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--worktrees", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--setup-seconds", type=float, default=0.5)
    parser.add_argument("--skip-fleet", action="store_true")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="stella-bench-bootstrap-"))
    try:
        bench_copy(scratch, args.mb, args.worktrees)
        if not args.skip_fleet:
            bench_setup(scratch, args.tasks, args.setup_seconds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
