"""Fleet dispatch overhead: N no-op tasks through `stella fleet`, `doit -n`, and `make -j`, same machine.

Every tool runs the same no-op (`true`) N times at the same concurrency, so the wall times are the tools'
own cost: for `stella fleet` that is a worker process per task (forked from a warm launcher by default,
a fresh Python interpreter with `[fleet] fork_workers = false`; both are measured), the ledger rows of
every run, task and attempt, and waves (a wave waits for its slowest task) instead of make's continuous
dispatch. A second figure times one isolated task's worktree creation (the gitops call the dispatcher
makes) against a raw `git worktree add` on a repository of many files.

    python bench/fleet_overhead.py [--tasks 200] [--concurrency 8] [--files 20000] [--repeat 3]
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
from collections.abc import Callable
from pathlib import Path

from stellafleet import gitops

STELLA = [sys.executable, "-m", "stellafleet"]
DOIT = [sys.executable, "-m", "doit"]


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def make_repo(root: Path, files: int = 1) -> Path:
    root.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "config", "user.name", "bench", cwd=root)
    sh("git", "config", "user.email", "bench@example.invalid", cwd=root)
    for n in range(files):
        path = root / f"src/d{n % 100:02d}/f{n}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {n}\n")
    (root / "README.md").write_text("bench\n")
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-q", "-m", "initial", cwd=root)
    return root


def timed(run: Callable[[], None], repeat: int, reset: Callable[[], None] | None = None) -> float:
    """The median wall time of repeat runs (reset runs before each, untimed)."""
    times = []
    for _ in range(repeat):
        if reset is not None:
            reset()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_dispatch(work: Path, tasks: int, concurrency: int, repeat: int) -> dict[str, float]:
    repo = make_repo(work / "fleet-repo")
    config = repo / ".stella" / "config.toml"
    config.parent.mkdir()
    plan = work / "plan.toml"
    plan.write_text("".join(f'[[tasks]]\nid = "t{n}"\nprompt = "nothing"\n\n' for n in range(tasks)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}

    def fleet(fork: bool) -> Callable[[], None]:
        def run() -> None:
            config.write_text(
                f'[fleet]\nfork_workers = {str(fork).lower()}\n[pipelines.command]\nrun = "true"\n'
            )
            argv = [*STELLA, "-q", "fleet", "--plan", str(plan), "--pipeline", "command"]
            sh(*argv, "--max-concurrency", str(concurrency), cwd=repo, env=env)

        return run

    dodo = work / "dodo.py"
    dodo.write_text(
        "DOIT_CONFIG = {'verbosity': 0, 'backend': 'json', 'dep_file': 'doit-db.json'}\n"
        f"def task_noop():\n    for n in range({tasks}):\n"
        "        yield {'name': str(n), 'actions': ['true'], 'uptodate': [False]}\n"
    )
    makefile = work / "Makefile"
    targets = " ".join(f"t{n}" for n in range(tasks))
    makefile.write_text(
        f".PHONY: all {targets}\nall: {targets}\n" + "".join(f"t{n}:\n\t@true\n" for n in range(tasks))
    )

    return {
        "make": timed(lambda: sh("make", "-s", f"-j{concurrency}", "-f", str(makefile), cwd=work), repeat),
        "doit": timed(lambda: sh(*DOIT, "-f", str(dodo), "-n", str(concurrency), cwd=work), repeat),
        "stella": timed(fleet(True), repeat),
        "stella-exec": timed(fleet(False), repeat),
        "python": timed(lambda: sh(sys.executable, "-c", "pass", cwd=work), repeat * 5),
    }


def bench_worktree(work: Path, files: int, repeat: int) -> dict[str, float]:
    repo = make_repo(work / "big-repo", files)
    base = gitops.head_commit(repo)
    trees = work / "trees"
    counter = iter(range(10_000))

    def reset() -> None:
        shutil.rmtree(trees, ignore_errors=True)
        sh("git", "worktree", "prune", cwd=repo)

    def raw() -> None:
        n = next(counter)
        sh("git", "worktree", "add", "-q", "-b", f"raw/{n}", str(trees / f"raw-{n}"), base, cwd=repo)

    def ours() -> None:
        name = gitops.isolated_name(f"r-bench-{next(counter)}", "docs")
        gitops.worktree_add(repo, trees / name, f"fleet/{name}", base)

    raw_times, our_times = [], []
    for _ in range(repeat):  # interleaved, so load and cache swings hit both alike
        raw_times.append(timed(raw, 1, reset))
        our_times.append(timed(ours, 1, reset))
    return {"raw": statistics.median(raw_times), "stella": statistics.median(our_times)}


def report_dispatch(d: dict[str, float], n: int, c: int, repeat: int) -> None:
    cores = os.cpu_count() or 1
    print(f"dispatch: {n} no-op tasks at concurrency {c} (median of {repeat}; {cores} cores)")
    rows = [
        ("make", "make -j"),
        ("doit", "doit -n"),
        ("stella", "stella fleet (workers forked by the warm launcher, the default)"),
        ("stella-exec", "stella fleet with fork_workers = false (a fresh interpreter per worker)"),
    ]
    for key, label in rows:
        per_task = d[key] / n * 1000
        print(f"  {d[key]:7.2f} s  {per_task:7.2f} ms/task  {d[key] / d['make']:6.1f}x make  {label}")
    print(f"  stella / doit: {d['stella'] / d['doit']:.1f}x")
    floor = d["python"] * n / min(c, cores)
    print(
        f"  a bare `python -c pass` takes {d['python'] * 1000:.0f} ms here: {n} fresh interpreters on "
        f"{min(c, cores)} cores need ~{floor:.2f} s, the floor of fresh-interpreter workers"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-worktree", action="store_true")
    parser.add_argument("--skip-dispatch", action="store_true")
    args = parser.parse_args()
    if not shutil.which("make"):
        sys.exit("make is not installed: the baseline needs it")
    with tempfile.TemporaryDirectory(prefix="stella-bench-") as tmp:
        work = Path(tmp)
        os.environ["HOME"] = str(work / "home")  # no user config leaks into the measured tools
        n, c = args.tasks, args.concurrency
        if not args.skip_dispatch:
            report_dispatch(bench_dispatch(work, n, c, args.repeat), n, c, args.repeat)
        if not args.skip_worktree:
            w = bench_worktree(work, args.files, args.repeat)
            print(f"worktree: one isolated task's, {args.files}-file repository (median of {args.repeat})")
            print(f"  git worktree add      {w['raw']:6.3f} s")
            print(f"  gitops.worktree_add   {w['stella']:6.3f} s  {w['stella'] / w['raw']:.2f}x raw git")


if __name__ == "__main__":
    main()
