"""Fleet overhead as a user meets it: N tasks of `sleep S` through `stella fleet`, a fresh worker per task.

Every task's command is `sleep S` (S = 10 s by default), run at concurrency C, so the run can end no sooner
than the lower bound ceil(N / C) x S (48 tasks at 8: 60 s); the bench prints the wall time against it
(target: within 10 %). The same N sleeps go through raw `doit -n C` in the same run, as the reference: a
task runner with no ledger, no worker process and no worktree, measured against the same bound.

CPU is counted from the kernel's rusage of the whole `stella fleet` process tree (wait4 on the fleet: the
fleet, every worker it waited for, every command a worker waited for). The commands' own share is
measured apart: the same command line with a duration of 0 (`/bin/sh -c 'sleep 0'`), N times in a row
(sleeping costs no CPU; starting the shell and `sleep` does). What is left, tree minus commands, is the
fleet plus its workers (the fleet's start-up included); divided by N, the target is under 0.3 s per task.
The ledger splits it further: each attempt records its worker's CPU (the worker with the command it
waited for).

A one-task run of a no-op (`true`) gives the fixed cost of a run: start-up, reading the plan, one worker,
teardown. A second figure times one isolated task's worktree creation (the worktrees call the dispatcher
makes) against a raw `git worktree add` on a repository of many files.

Python tools get compiled bytecode in a private cache, as an installed package has; a one-task run of
each tool first, untimed, writes it. With --repeat above 1 the tools run interleaved, so a load swing on a
shared machine hits them alike, and every figure is the median of the repeats.

    python bench/fleet_overhead.py [--tasks 48] [--concurrency 8] [--seconds 10] [--repeat 1]
                                   [--files 20000] [--skip-worktree]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, worktrees
from stellafleet.state.ledger import Ledger

STELLA = [sys.executable, "-m", "stellafleet"]
DOIT = [sys.executable, "-m", "doit"]
CPU_TARGET_S = 0.3  # fleet plus worker CPU per task
WALL_TARGET = 1.10  # wall time against the lower bound


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


@dataclass(frozen=True)
class Sample:
    wall: float  # seconds
    cpu: float  # user + system seconds of the whole process tree (every descendant that was waited for)


def measure(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with {proc.returncode}: {err.decode(errors='replace')}")
    return Sample(wall, usage.ru_utime + usage.ru_stime)


def command_cpu(command: str, times: int, cwd: Path) -> float:
    """CPU seconds of running `/bin/sh -c command` times times in a row (this process's children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(times):
        sh("/bin/sh", "-c", command, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@dataclass(frozen=True)
class Inputs:
    repo: Path
    config: Path
    plans: dict[str, Path]  # "many" (N sleeps), "one" (one no-op)
    dodo: Path


def write_inputs(work: Path, tasks: int, seconds: float) -> Inputs:
    repo = make_repo(work / "fleet-repo")
    (repo / ".stella").mkdir()
    config = repo / ".stella" / "bench.toml"
    config.write_text(
        f'[pipelines.command]\nrun = "sleep {seconds:g}"\n\n[pipelines.command.tasks.noop]\nrun = "true"\n'
    )
    plans = {"many": work / "plan-many.toml", "one": work / "plan-one.toml"}
    plans["many"].write_text("".join(f'[[tasks]]\nid = "t{i}"\nprompt = "wait"\n\n' for i in range(tasks)))
    plans["one"].write_text('[[tasks]]\nid = "noop"\nprompt = "nothing"\n')
    dodo = work / "dodo.py"
    dodo.write_text(
        "DOIT_CONFIG = {'verbosity': 0, 'backend': 'json', 'dep_file': 'doit-db.json'}\n"
        f"def task_wait():\n    for n in range({tasks}):\n"
        f"        yield {{'name': str(n), 'actions': ['sleep {seconds:g}'], 'uptodate': [False]}}\n"
    )
    return Inputs(repo, config, plans, dodo)


@dataclass
class Results:
    stella: list[Sample]
    stella_one: list[Sample]
    doit: list[Sample]
    worker_cpu: list[float]  # the ledger's CPU of every worker of the last N-task run (its command included)


def bench_dispatch(work: Path, tasks: int, concurrency: int, seconds: float, repeat: int) -> Results:
    inputs = write_inputs(work, tasks, seconds)
    c = str(concurrency)

    def stella(plan: str) -> list[str]:
        return [
            *STELLA, "--config", str(inputs.config), "-q", "fleet", "--plan", str(inputs.plans[plan]),
            "--pipeline", "command", "--max-concurrency", c,
        ]  # fmt: skip

    doit = [*DOIT, "-f", str(inputs.dodo), "-n", c]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    measure(stella("one"), inputs.repo, env)  # warm-up, untimed: bytecode written, files in the page cache
    measure([*DOIT, "list", "-f", str(inputs.dodo)], work, env)
    results = Results([], [], [], [])
    for _ in range(repeat):
        results.stella_one.append(measure(stella("one"), inputs.repo, env))
        results.stella.append(measure(stella("many"), inputs.repo, env))
        results.doit.append(measure(doit, work, env))
    with Ledger.open(StatePaths(inputs.repo).fleet_db, readonly=True) as ledger:
        attempts = ledger.get_run(ledger.runs.resolve(None))["attempts"]
    results.worker_cpu = [attempt["cpu_seconds"] or 0.0 for attempt in attempts]
    return results


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def report_dispatch(results: Results, work: Path, n: int, c: int, seconds: float) -> None:
    bound = math.ceil(n / c) * seconds
    stella_wall, doit_wall = med([s.wall for s in results.stella]), med([s.wall for s in results.doit])
    print(
        f"dispatch: {n} tasks of `sleep {seconds:g}` at concurrency {c} on {os.cpu_count() or 1} cores, "
        f"median of {len(results.stella)}; lower bound {math.ceil(n / c)} x {seconds:g} s = {bound:g} s"
    )
    ok = "yes" if stella_wall <= bound * WALL_TARGET else "NO"
    print(
        f"  stella fleet  wall {stella_wall:7.2f} s  {stella_wall / bound:.3f}x the lower bound "
        f"(target <= {WALL_TARGET:.2f}x: {ok})"
    )
    print(f"  doit -n {c}     wall {doit_wall:7.2f} s  {doit_wall / bound:.3f}x the lower bound (reference)")
    print(f"  stella / doit  {stella_wall / doit_wall:.3f}x")
    tree = med([s.cpu for s in results.stella])
    commands = command_cpu("sleep 0", n, work)
    workers = sum(results.worker_cpu)
    per_task = (tree - commands) / n
    ok = "yes" if per_task < CPU_TARGET_S else "NO"
    print(
        f"  CPU: process tree {tree:.2f} s - the {n} commands {commands:.2f} s (`sh -c 'sleep 0'` x {n}) "
        f"= {tree - commands:.2f} s fleet plus workers"
    )
    print(f"    per task {per_task:.3f} s (target < {CPU_TARGET_S:g} s: {ok}), of which")
    print(f"      each worker {(workers - commands) / n:.3f} s (its ledger CPU, less its command's)")
    print(f"      the fleet   {(tree - workers) / n:.3f} s (the tree's CPU, less the workers')")
    one_wall, one_cpu = med([s.wall for s in results.stella_one]), med([s.cpu for s in results.stella_one])
    print(f"  a one-task run (`true`): {one_wall:.2f} s wall, {one_cpu:.2f} s CPU: the fixed cost of a run")


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
        name = worktrees.isolated_name(f"r-bench-{next(counter)}", "docs")
        worktrees.worktree_add(repo, trees / name, f"fleet/{name}", base)

    def timed(run: Callable[[], None]) -> float:
        reset()
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    raw_times, our_times = [], []
    for _ in range(repeat):  # interleaved, so load and cache swings hit both alike
        raw_times.append(timed(raw))
        our_times.append(timed(ours))
    ratios = [o / r for o, r in zip(our_times, raw_times, strict=True)]
    return {"raw": med(raw_times), "stella": med(our_times), "ratio": med(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="each task's sleep")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--skip-worktree", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stella-bench-") as tmp:
        work = Path(tmp)
        os.environ["HOME"] = str(work / "home")  # no user config leaks into the measured tools
        n, c = args.tasks, args.concurrency
        results = bench_dispatch(work, n, c, args.seconds, args.repeat)
        report_dispatch(results, work, n, c, args.seconds)
        if not args.skip_worktree:
            w = bench_worktree(work, args.files, args.repeat)
            print(f"worktree: one isolated task's, {args.files}-file repository (median of {args.repeat})")
            print(f"  git worktree add        {w['raw']:6.3f} s")
            print(f"  worktrees.worktree_add  {w['stella']:6.3f} s  {w['ratio']:.2f}x raw git")


if __name__ == "__main__":
    main()
