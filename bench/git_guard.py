"""What the shared tree's git safety costs: the git guard per call, and serialised stash-using hooks.

1. Guard: N calls (default 200) of each of a few read-only git commands a worker runs (`status --short`,
   `rev-parse HEAD`, `log -1`, `diff --stat`), through the guard on PATH and through the real git,
   interleaved in one run, in a repository of F files (default 500). The figure is the guard's added
   milliseconds per call (mean and 95th percentile); one refused call (`git stash`, which starts Python)
   is timed as well.

2. Hooks: a real `stella fleet` of W shared workers (default 6), each committing one file, whose pre-commit
   hook keeps a backup in the stash lint-staged's way and works S seconds (default 1). Run with
   `[commit] serialize_hooks = true` and `= false`: the fleet's wall time, the commits that landed, and
   whether the user's own stash came through unchanged.

    python bench/git_guard.py [--calls 200] [--files 500] [--workers 6] [--hook-seconds 1] [--skip-fleet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import commit_all, new_repo, sh

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, guard
from stellafleet.state.ledger import Ledger

STELLA = [sys.executable, "-m", "stellafleet"]
READS = (["status", "--short"], ["rev-parse", "HEAD"], ["log", "-1", "--oneline"], ["diff", "--stat"])
HOOK = """#!/bin/sh
set -e
index=$(git commit-tree "HEAD^{tree}" -p HEAD -m index)
backup=$(git commit-tree "HEAD^{tree}" -p HEAD -p "$index" -m backup)
git stash store -m "lint-staged automatic backup" "$backup"
sleep %s
at=$(git stash list --format='%%gd %%gs' | grep -m1 'lint-staged automatic backup' | cut -d' ' -f1)
if [ -z "$at" ]; then echo "lint-staged automatic backup is missing!"; exit 1; fi
git stash drop -q "$at"
"""
WORKER = """import os, pathlib, subprocess, sys
ws, task = pathlib.Path(os.environ["STELLA_WORKSPACE"]), os.environ["STELLA_TASK_ID"]
(ws / f"{task}.txt").write_text(task + "\\n")
sys.exit(subprocess.run(["stella", "commit", "-m", task, f"{task}.txt"]).returncode)
"""


def make_repo(root: Path, files: int) -> Path:
    new_repo(root)
    for n in range(files):
        (root / f"src{n % 20}").mkdir(exist_ok=True)
        (root / f"src{n % 20}" / f"f{n}.txt").write_text(f"file {n}\n" * 20)
    return commit_all(root, "init")


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - started) * 1000


def bench_guard(work: Path, calls: int, files: int) -> None:
    repo = make_repo(work / "guard-repo", files)
    folder = guard.install(work / "gitguard")
    real_env = dict(os.environ)
    guarded = guard.guarded_env(real_env, folder)
    real, through = [], []
    for _ in range(calls):
        for args in READS:  # interleaved: both see the same load
            real.append(timed([gitops.git_program(), *args], repo, real_env))
            through.append(timed(["git", *args], repo, guarded))
    added = [t - r for t, r in zip(through, real, strict=True)]
    print(f"guard: {len(real)} read-only git calls each way, {files} files, {os.cpu_count()} cores")
    for label, times in (("real git", real), ("through guard", through)):
        print(
            f"  {label:15} mean {statistics.mean(times):7.2f} ms  median {statistics.median(times):7.2f} ms"
        )
    p95 = sorted(added)[int(len(added) * 0.95)]
    print(f"  guard adds      mean {statistics.mean(added):7.2f} ms  p95 {p95:7.2f} ms per call")
    refused = [timed(["git", "stash"], repo, guarded) for _ in range(max(3, calls // 20))]
    print(f"  a refused call (git stash, Python) median {statistics.median(refused):7.2f} ms")


def fleet_once(work: Path, name: str, workers: int, hook_s: float, serialise: bool) -> None:
    repo = make_repo(work / name, 1)
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(HOOK % hook_s)
    hook.chmod(0o755)
    script = work / "worker.py"
    script.write_text(WORKER)
    config = StatePaths(repo).config_file
    config.parent.mkdir(parents=True)
    config.write_text(
        f'[pipelines.command]\nrun = "{sys.executable} {script}"\n\n[commit]\n'
        f"serialize_hooks = {'true' if serialise else 'false'}\n"
    )
    (repo / "user.txt").write_text("the user's\n")
    sh("git", "add", "user.txt", cwd=repo)
    sh("git", "stash", "push", "-q", "-m", "the user's own", cwd=repo)
    stash = sh("git", "stash", "list", "--format=%H %gs", cwd=repo)
    plan = work / f"{name}.toml"
    plan.write_text(
        "".join(f'[[tasks]]\nid = "w{n}"\nprompt = "p"\nclaims = ["w{n}.txt"]\n\n' for n in range(workers))
    )
    started = time.perf_counter()
    argv = [*STELLA, "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", str(workers)]
    subprocess.run(argv, cwd=repo, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    with Ledger.open(StatePaths(repo).fleet_db, readonly=True) as ledger:
        landed = len(ledger.get_run(ledger.runs.resolve(None))["commits"])
    kept = sh("git", "stash", "list", "--format=%H %gs", cwd=repo) == stash
    print(
        f"  serialize_hooks = {str(serialise).lower():5}  wall {wall:6.2f} s  commits {landed}/{workers}  "
        f"user's stash {'unchanged' if kept else 'CHANGED'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--hook-seconds", type=float, default=1.0)
    parser.add_argument("--skip-fleet", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="where to work (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        bench_guard(work, args.calls, args.files)
        if not args.skip_fleet:
            print(
                f"hooks: {args.workers} shared workers, a {args.hook_seconds:g} s stash-using pre-commit hook"
            )
            fleet_once(work, "serialised", args.workers, args.hook_seconds, True)
            fleet_once(work, "unserialised", args.workers, args.hook_seconds, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
