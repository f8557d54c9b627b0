"""The user's own git beside a shared fleet: how many of the user's `git add`/`git commit` calls fail.

A 40-task, 4-wide fleet of the command pipeline, each task writing its own file and committing it with
`stella commit` through the commit lane, while a user process loops `git add` + `git commit` of files of its
own in the same tree, never retrying: every call that meets the lane's index.lock (or a HEAD that moved
under it) counts as a failure. Run against one or more copies of the code (`--code DIR`, each put first on
PYTHONPATH; `git archive REV stellafleet | tar -x -C DIR` makes one), the same repository shape and fleet
for each, `--rounds` times in turn so that each copy sees the same load. A worker's file missing from the
final HEAD, or deleted by a later commit, counts as lost.

    python bench/lane_user_git.py [--tasks 40] [--concurrency 4] [--code DIR]... [--rounds N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

USER_LOOP = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    root, stop = Path(sys.argv[1]), Path(sys.argv[2])
    calls = failed = lock_failed = n = 0
    (root / "mine").mkdir(exist_ok=True)
    def git(*args):
        global calls, failed, lock_failed
        calls += 1
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if done.returncode:
            failed += 1
            lock_failed += "index.lock" in done.stderr
        return done.returncode == 0
    while not stop.exists():
        n += 1
        (root / "mine" / f"{n}.txt").write_text(f"user file {n}\\n")
        if git("add", f"mine/{n}.txt"):
            git("commit", "-q", "-m", f"user commit {n}")
        time.sleep(0.005)
    print(calls, failed, lock_failed)
""")

COMMITTER = (
    'mkdir -p out && echo "written by $STELLA_TASK_ID" > "out/$STELLA_TASK_ID.txt" && '
    'stella commit -m "$STELLA_TASK_ID: add out/$STELLA_TASK_ID.txt" "out/$STELLA_TASK_ID.txt"'
)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path) -> None:
    path.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=path)
    git("config", "user.name", "Bench", cwd=path)
    git("config", "user.email", "bench@example.invalid", cwd=path)
    for n in range(200):  # a small project's worth of tracked files
        (path / "src").mkdir(exist_ok=True)
        (path / "src" / f"m{n}.py").write_text(f"VALUE = {n}\n")
    (path / ".stella").mkdir()
    (path / ".stella" / "config.toml").write_text(f"[pipelines.command]\nrun = {json.dumps(COMMITTER)}\n")
    git("add", ".", cwd=path)
    git("commit", "-q", "-m", "init", cwd=path)


def one_run(code: Path, work: Path, tasks: int, concurrency: int) -> dict[str, float]:
    repo = work / "repo"
    make_repo(repo)
    env = {**os.environ, "PYTHONPATH": str(code)}
    bin_dir = work / "bin"  # `stella` for the workers' commit line, from this copy of the code
    bin_dir.mkdir()
    (bin_dir / "stella").write_text(f'#!/bin/sh\nexec {sys.executable} -m stellafleet "$@"\n')
    (bin_dir / "stella").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    stop = work / "stop"
    user = subprocess.Popen(
        [sys.executable, "-c", USER_LOOP, str(repo), str(stop)], stdout=subprocess.PIPE, text=True, env=env
    )
    started = time.monotonic()
    prompts = [f"write file number {n}" for n in range(1, tasks + 1)]
    fleet = subprocess.run(
        [sys.executable, "-m", "stellafleet", "fleet", "--pipeline", "command", "--max-concurrency",
         str(concurrency), *prompts],
        cwd=repo, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    stop.touch()
    out, _ = user.communicate(timeout=120)
    calls, failed, lock_failed = (int(x) for x in out.split())
    landed = len(git("log", "--format=%s", "--grep=^t[0-9]*: add", cwd=repo).split("\n")) - 1
    kept = set(git("ls-tree", "--name-only", "HEAD", "out/", cwd=repo).split())
    deleted = git("log", "--diff-filter=D", "--format=", "--name-only", "--", "out/", cwd=repo).split()
    lost = len({f"out/t{n}.txt" for n in range(1, tasks + 1)} - kept) + len(deleted)
    return {
        "fleet_exit": fleet.returncode,
        "seconds": elapsed,
        "calls": calls,
        "failed": failed,
        "lock_failed": lock_failed,
        "worker_commits": landed,
        "lost": lost,
        "load": os.getloadavg()[0],
        "index_lock_left": (repo / ".git" / "index.lock").exists(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--code", action="append", type=Path, help="a copy of the code to measure (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each copy, in turn")
    parser.add_argument("--dir", type=Path, help="where to build the repositories (default: a temp dir)")
    args = parser.parse_args()
    codes = args.code or [Path(__file__).resolve().parent.parent]
    totals: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
    with tempfile.TemporaryDirectory(prefix="stella-bench-lane-", dir=args.dir) as tmp:
        print(f"{args.tasks} tasks, {args.concurrency} wide; the user's git add + git commit loop beside it")
        for number in range(args.rounds * len(codes)):
            code = codes[number % len(codes)]
            load = os.getloadavg()[0]
            figures = one_run(code.resolve(), Path(tmp) / f"run{number}", args.tasks, args.concurrency)
            totals[code].append(figures)
            rate = figures["failed"] / figures["calls"] if figures["calls"] else 0.0
            print(
                f"{code}: user git calls {figures['calls']}, failed {figures['failed']} ({rate:.1%}; "
                f"{figures['lock_failed']} on index.lock); worker commits {figures['worker_commits']}/"
                f"{args.tasks}, lost {figures['lost']}; fleet exit {figures['fleet_exit']} in "
                f"{figures['seconds']:.1f}s; load {load:.1f}-{figures['load']:.1f}; "
                f"index.lock left: {figures['index_lock_left']}",
                flush=True,
            )
        for code, runs in totals.items():
            calls, failed = sum(r["calls"] for r in runs), sum(r["failed"] for r in runs)
            walls = sorted(r["seconds"] for r in runs)
            print(
                f"{code}: {len(runs)} runs, failed {failed}/{calls} ({failed / max(calls, 1):.1%}), "
                f"lost {sum(r['lost'] for r in runs)}, wall median {walls[len(walls) // 2]:.1f}s "
                f"({', '.join(f'{w:.1f}' for w in walls)})"
            )


if __name__ == "__main__":
    main()
