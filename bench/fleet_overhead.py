"""Fleet dispatch overhead: N no-op tasks through `stella fleet`, `doit -n`, and `make -j`, same machine.

Every tool runs the same no-op (`true`) N times at the same concurrency, so the wall times are the tools'
own cost: for `stella fleet` that is starting each task's command (by default a direct command: the fleet
runs `/bin/sh -c true` itself; with `--worker` also `[pipelines.command] direct = false`, a worker process
per task forked from the warm launcher, and unless `--skip-exec` a fresh Python interpreter per worker
with `[fleet] fork_workers = false`), the ledger rows of every run, task and attempt, and waves (a wave
waits for its slowest task; `--eager` adds the eager schedule) instead of make's continuous dispatch.
Each tool also runs a single task, so its fixed cost (start-up, reading the plan, teardown) is told apart
from its marginal cost per task: (wall of N tasks - wall of 1 task) / (N - 1).

The tools run interleaved (make, doit, stella, ... then again), so a load swing on a shared machine hits
them alike; every figure is the median of the repeats with the range of them in brackets. Python tools
get compiled bytecode in a private cache, as an installed package has (a checkout run with
PYTHONDONTWRITEBYTECODE would otherwise recompile stellafleet on every start).

The breakdown of stella's figure comes from the last run's own ledger (when the run and each attempt
started and ended, each worker's CPU time, which includes its command's shell), from the CPU time of the
whole process tree, and from the ledger writes of one task timed alone on a ledger of the same size.

A second figure times one isolated task's worktree creation (the worktrees call the dispatcher makes)
against a raw `git worktree add` on a repository of many files.

    python bench/fleet_overhead.py [--tasks 200] [--concurrency 8] [--files 20000] [--repeat 3]
                                   [--eager] [--worker] [--skip-exec] [--skip-worktree] [--skip-dispatch]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, worktrees
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

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


@dataclass(frozen=True)
class Sample:
    wall: float  # seconds
    cpu: float  # user + system seconds of the whole process tree (every descendant that was waited for)
    run_id: str | None = None  # stella's: the run it recorded


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


@dataclass
class Tool:
    key: str
    label: str
    argv: Callable[[int], list[str]]  # the command line for a run of n tasks
    cwd: Path
    many: list[Sample] = field(default_factory=list)  # runs of N tasks
    one: list[Sample] = field(default_factory=list)  # runs of 1 task


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    low, mid, high = (fmt.format(v * scale) for v in (min(values), med(values), max(values)))
    return f"{mid} [{low}-{high}]"


def write_inputs(work: Path, tasks: int) -> dict[str, Path]:
    repo = make_repo(work / "fleet-repo")
    (repo / ".stella").mkdir()
    files = {"repo": repo}
    for n in {1, tasks}:
        plan = work / f"plan-{n}.toml"
        plan.write_text("".join(f'[[tasks]]\nid = "t{i}"\nprompt = "nothing"\n\n' for i in range(n)))
        files[f"plan-{n}"] = plan
        dodo = work / f"dodo{n}.py"
        dodo.write_text(
            "DOIT_CONFIG = {'verbosity': 0, 'backend': 'json', 'dep_file': 'doit-db.json'}\n"
            f"def task_noop():\n    for n in range({n}):\n"
            "        yield {'name': str(n), 'actions': ['true'], 'uptodate': [False]}\n"
        )
        files[f"dodo-{n}"] = dodo
        makefile = work / f"Makefile{n}"
        targets = " ".join(f"t{i}" for i in range(n))
        makefile.write_text(
            f".PHONY: all {targets}\nall: {targets}\n" + "".join(f"t{i}:\n\t@true\n" for i in range(n))
        )
        files[f"make-{n}"] = makefile
    return files


def bench_dispatch(
    work: Path,
    tasks: int,
    concurrency: int,
    repeat: int,
    exec_too: bool,
    eager_too: bool = False,
    worker_too: bool = False,
) -> list[Tool]:
    files = write_inputs(work, tasks)
    repo = files["repo"]
    c = str(concurrency)

    def stella(schedule: str = "waves", worker: str | None = None) -> Callable[[int], list[str]]:
        """A stella fleet run: direct commands (the default), or a worker process per task (worker
        "fork": forked from the warm launcher, "exec": a fresh interpreter)."""
        config = repo / ".stella" / f"config-{schedule}-{worker or 'direct'}.toml"
        fleet = f'[fleet]\nschedule = "{schedule}"\n'
        command = '[pipelines.command]\nrun = "true"\n'
        if worker is not None:
            fleet += f"fork_workers = {str(worker == 'fork').lower()}\n"
            command += "direct = false\n"
        config.write_text(fleet + command)
        return lambda n: [
            *STELLA,
            "--config",
            str(config),
            "-q",
            "fleet",
            "--plan",
            str(files[f"plan-{n}"]),
            "--pipeline",
            "command",
            "--max-concurrency",
            c,
        ]

    tools = [
        Tool("make", "make -j", lambda n: ["make", "-s", f"-j{c}", "-f", str(files[f"make-{n}"])], work),
        Tool("doit", "doit -n", lambda n: [*DOIT, "-f", str(files[f"dodo-{n}"]), "-n", c], work),
        Tool("stella", "stella fleet (the defaults: direct commands, waves)", stella(), repo),
    ]
    schedules = ("waves", "eager") if eager_too else ("waves",)
    if eager_too:
        tools.append(Tool("stella-eager", "stella fleet --schedule eager", stella("eager"), repo))
    if worker_too:
        for schedule in schedules:
            label = f"stella fleet, direct = false (a worker forked per task by the launcher), {schedule}"
            tools.append(Tool(f"stella-worker-{schedule}", label, stella(schedule, "fork"), repo))
    if exec_too:
        label = "stella fleet, direct = false and fork_workers = false (a fresh interpreter per worker)"
        tools.append(Tool("stella-exec", label, stella("waves", "exec"), repo))
    # Compiled bytecode in a private cache, for every Python tool alike (see the module docstring).
    env = {k: v for k, v in os.environ.items() if not k.startswith("STELLA_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    for tool in tools:  # warm-up, untimed: bytecode written, files in the page cache
        measure(tool.argv(tasks), tool.cwd, env)
    for _ in range(repeat):
        for tool in tools:
            sample = measure(tool.argv(tasks), tool.cwd, env)
            if tool.key.startswith("stella"):
                with Ledger.open(StatePaths(tool.cwd).fleet_db, readonly=True) as ledger:
                    sample = dataclasses.replace(sample, run_id=ledger.runs.latest_id())
            tool.many.append(sample)
            tool.one.append(measure(tool.argv(1), tool.cwd, env))
    return tools


def report_dispatch(tools: list[Tool], n: int, c: int, repeat: int) -> dict[str, float]:
    cores = os.cpu_count() or 1
    by_key = {tool.key: tool for tool in tools}
    print(
        f"dispatch: {n} no-op tasks at concurrency {c} on {cores} cores; median [min-max] of {repeat} "
        "interleaved runs"
    )
    print(
        f"  {'wall of N tasks':21s} {'per task (wall/N)':21s} {'1 task (fixed)':17s} marginal  CPU/task  tool"
    )
    per_task: dict[str, float] = {}
    marginal: dict[str, float] = {}
    for tool in tools:
        walls = [s.wall for s in tool.many]
        ones = [s.wall for s in tool.one]
        per_task[tool.key] = med(walls) / n
        marginal[tool.key] = (med(walls) - med(ones)) / (n - 1)
        cpu = med([s.cpu for s in tool.many]) / n
        print(
            f"  {spread(walls) + ' s':21s} {spread([w / n for w in walls], 1000) + ' ms':21s} "
            f"{spread(ones, 1000, '{:.0f}') + ' ms':17s} {marginal[tool.key] * 1000:5.2f} ms "
            f"{cpu * 1000:5.2f} ms  {tool.label}"
        )
    for key in [tool.key for tool in tools if tool.key.startswith("stella")]:
        vs_make, vs_doit = per_task[key] / per_task["make"], per_task[key] / per_task["doit"]
        print(
            f"  {key}: {vs_make:.1f}x make, {vs_doit:.1f}x doit per task (wall/N); "
            f"marginal {marginal[key] / marginal['make']:.1f}x make, "
            f"{marginal[key] / marginal['doit']:.1f}x doit"
        )
    for tool in tools:  # each run's ratio, for the spread of the ratio itself
        if tool.key == "stella":
            ratios = [s.wall / m.wall for s, m in zip(tool.many, by_key["make"].many, strict=True)]
            doit = [s.wall / d.wall for s, d in zip(tool.many, by_key["doit"].many, strict=True)]
            print(
                f"  stella / make per run: {spread(ratios, 1, '{:.1f}')}x; "
                f"stella / doit: {spread(doit, 1, '{:.1f}')}x"
            )
    return {"stella": per_task["stella"], "make": per_task["make"], "doit": per_task["doit"]}


def ledger_cost(work: Path, tasks: int, repeat: int = 5) -> tuple[int, float]:
    """The ledger and claim-store writes the dispatcher makes for one task, timed alone: (transactions,
    milliseconds per task). A fresh ledger holds a run of `tasks` tasks, as in the measured run."""
    from stellafleet.plan.model import plan_from_prompts

    root = work / "ledger-cost"
    paths = StatePaths(root)
    plan = plan_from_prompts([f"task {n}" for n in range(tasks)])
    per_task = []
    transactions = 0
    for rep in range(repeat):
        run_id = f"r-bench-{rep}"
        with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as claims:
            ledger.runs.create(
                run_id=run_id,
                plan_path=None,
                plan_sha256=None,
                base_ref="main",
                base_commit="0" * 40,
                max_concurrency=8,
                spend_limit_usd=None,
                pipeline="command",
                argv=[],
                root=str(root),
                pid=os.getpid(),
            )
            ledger.tasks.add(run_id, plan.tasks, {task.id: 1 for task in plan.tasks})
            counter = _count_transactions(ledger, claims)
            start = time.perf_counter()
            for task in plan.tasks:
                _one_task_of_bookkeeping(ledger, claims, run_id, task.id)
            per_task.append((time.perf_counter() - start) / tasks)
            transactions = counter() // tasks
    return transactions, med(per_task) * 1000


def _count_transactions(ledger: Ledger, claims: ClaimStore) -> Callable[[], int]:
    """Counts the write transactions (BEGIN IMMEDIATE) both stores run from now on."""
    count = [0]

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN"):
            count[0] += 1

    for store in (ledger, claims):
        store._conn.set_trace_callback(trace)
    return lambda: count[0]


def _one_task_of_bookkeeping(ledger: Ledger, claims: ClaimStore, run_id: str, task_id: str) -> None:
    """What Dispatcher.execute writes for a task without claims whose worker succeeded."""
    attempt = ledger.attempts.start(run_id, task_id, pipeline="command", log_path="l", transcript_path="t")
    ledger.attempts.set_pid(attempt, 4242)
    ledger.attempts.finish(
        attempt, outcome="succeeded", exit_code=0, summary="done", cpu_seconds=0.004, peak_rss_bytes=10**7
    )
    claims.release_attempt_if_held(run_id, attempt)


def report_breakdown(work: Path, tools: list[Tool], n: int) -> None:
    """Where a stella task's time goes, from the median run's ledger and the process tree's CPU time."""
    tool = next(t for t in tools if t.key == "stella")
    sample = sorted(tool.many, key=lambda s: s.wall)[len(tool.many) // 2]
    assert sample.run_id is not None
    with Ledger.open(StatePaths(tool.cwd).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(sample.run_id)
    run, attempts = record["run"], record["attempts"]
    wave_of = {task["id"]: task["wave"] for task in record["tasks"]}
    waves: dict[int, list[dict[str, int]]] = {}
    for attempt in attempts:
        waves.setdefault(wave_of[attempt["task_id"]], []).append(attempt)
    spans = []
    gaps = []
    previous_end = None
    for number in sorted(waves):
        first = min(a["started_at_ms"] for a in waves[number])
        last = max(a["finished_at_ms"] for a in waves[number])
        spans.append(last - first)
        if previous_end is not None:
            gaps.append(first - previous_end)
        previous_end = last
    run_ms = run["finished_at_ms"] - run["created_at_ms"]
    wall_ms = sample.wall * 1000
    cpu_ms = sample.cpu * 1000
    worker_cpu = [a["cpu_seconds"] * 1000 for a in attempts]
    alive = [a["finished_at_ms"] - a["started_at_ms"] for a in attempts]
    transactions, ledger_ms = ledger_cost(work, n)
    fixed_ms = med([s.wall for s in tool.one]) * 1000
    fixed_cpu = med([s.cpu for s in tool.one]) * 1000
    print(f"stella breakdown (the median {n}-task run, from its ledger):")
    print(
        f"  wall {wall_ms:.0f} ms = {wall_ms - run_ms:.0f} ms start-up and teardown around the recorded run "
        f"+ {run_ms:.0f} ms recorded"
    )
    print(f"  a 1-task run takes {fixed_ms:.0f} ms ({fixed_cpu:.0f} ms CPU): the fixed cost")
    print(
        f"  {len(spans)} waves of up to {max(len(w) for w in waves.values())}: {med(spans):.1f} ms each "
        f"(median; {sum(spans) / n:.2f} ms per task), {sum(gaps):.0f} ms between waves in all"
    )
    task_cpu = (cpu_ms - fixed_cpu) / (n - 1)
    print(f"  CPU per task {task_cpu:.2f} ms (the process tree's, less a 1-task run's), of which:")
    print(f"    worker process {statistics.mean(worker_cpu):.2f} ms (the command's /bin/sh)")
    print(f"    the fleet {task_cpu - statistics.mean(worker_cpu):.2f} ms")
    print(
        f"      of which ledger and claim-store writes {ledger_ms:.2f} ms ({transactions} transactions, "
        "timed alone)"
    )
    print(f"  an attempt lasts {med(alive):.1f} ms in the ledger (started to finished, median)")


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

    raw_times, our_times = [], []
    for _ in range(repeat):  # interleaved, so load and cache swings hit both alike
        raw_times.append(timed(raw, 1, reset))
        our_times.append(timed(ours, 1, reset))
    ratios = [o / r for o, r in zip(our_times, raw_times, strict=True)]
    return {
        "raw": statistics.median(raw_times),
        "stella": statistics.median(our_times),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def report_fresh_floor(work: Path, n: int, c: int) -> None:
    python = timed(lambda: sh(sys.executable, "-c", "pass", cwd=work), 5)
    cores = os.cpu_count() or 1
    floor = python * n / min(c, cores)
    print(
        f"  a bare `python -c pass` takes {python * 1000:.0f} ms here: {n} fresh interpreters on "
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
    parser.add_argument("--worker", action="store_true", help="also direct = false: a worker per task")
    parser.add_argument("--skip-exec", action="store_true", help="not the fresh-interpreter variant")
    parser.add_argument("--skip-worktree", action="store_true")
    parser.add_argument("--skip-dispatch", action="store_true")
    parser.add_argument("--eager", action="store_true", help="also the eager schedule (default: waves only)")
    args = parser.parse_args()
    if not shutil.which("make"):
        sys.exit("make is not installed: the baseline needs it")
    if args.tasks < 2:
        sys.exit("--tasks must be at least 2 (a 1-task run is the fixed-cost baseline)")
    with tempfile.TemporaryDirectory(prefix="stella-bench-") as tmp:
        work = Path(tmp)
        os.environ["HOME"] = str(work / "home")  # no user config leaks into the measured tools
        n, c = args.tasks, args.concurrency
        if not args.skip_dispatch:
            variants = {"exec_too": not args.skip_exec, "eager_too": args.eager, "worker_too": args.worker}
            tools = bench_dispatch(work, n, c, args.repeat, **variants)
            report_dispatch(tools, n, c, args.repeat)
            if not args.skip_exec:
                report_fresh_floor(work, n, c)
            report_breakdown(work, tools, n)
        if not args.skip_worktree:
            w = bench_worktree(work, args.files, args.repeat)
            print(f"worktree: one isolated task's, {args.files}-file repository (median of {args.repeat})")
            print(f"  git worktree add        {w['raw']:6.3f} s")
            print(
                f"  worktrees.worktree_add  {w['stella']:6.3f} s  {w['ratio']:.2f}x raw git "
                f"(per-run ratios {w['ratio_min']:.2f}-{w['ratio_max']:.2f})"
            )


if __name__ == "__main__":
    main()
