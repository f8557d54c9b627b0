"""Why stella's git and gh run on plain subprocess, not plumbum: its cost per call, per process, over a
realistic run and landing, and what its timeout does to a command whose child keeps the pipe.

1. Per call: N rounds (default 300) of two read-only git calls (`rev-parse HEAD`, `status --short`) in a
   scratch repository, each round four ways, interleaved so a load swing hits them alike: the process
   runner (plain Popen); a plumbum command's Popen waited for as the runner waits (how gitops ran git
   before); plumbum's own `Command(git)["-C", root].run(args, retcode=0)`; and the same with `timeout=120`
   (plumbum's timeout thread). Printed: mean and median ms per call, each way's ratio to plain Popen.

2. Per process: a fresh Python importing the runner, with and without `plumbum.machines.local` (what the
   first git or gh call of a process loaded), R times each (default 20), interleaved; the median difference
   is paid once by every stella process that runs git (the fleet, each worker, each `stella commit`).

3. A timeout: `sh -c 'sleep 5 & exec sleep 30'` given 1 s, through the runner and through plumbum's
   `.run(timeout=1)`: when each returns, and whether it kept what the command printed.

4. A run and its landing: `stella fleet` of T tasks (default 8: half shared, half isolated, each writing
   a file and committing it with `stella commit`), then `stella merge --unwatched`, with a logging `git`
   first on PATH: the git calls made, the processes that made them, and what 1 and 2 make of plumbum's share.

plumbum is no dependency of stellafleet: `pip install plumbum` to run this.

    python bench/plumbum_git.py [--calls 300] [--imports 20] [--tasks 8] [--skip-fleet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchrepo import commit_all, new_repo, sh

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops
from stellafleet.proc import runner

STELLA = [sys.executable, "-m", "stellafleet"]
READS = (["rev-parse", "HEAD"], ["status", "--short"])
WORKER = """import os, pathlib, subprocess, sys
ws, task = pathlib.Path(os.environ["STELLA_WORKSPACE"]), os.environ["STELLA_TASK_ID"]
(ws / f"{task}.txt").write_text(task + "\\n")
sys.exit(subprocess.run(["stella", "commit", "-m", task, f"{task}.txt"]).returncode)
"""
LOGGING_GIT = '#!/bin/sh\necho "$PPID $1" >> {log}\nexec {git} "$@"\n'


def ms(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def exact_env_command() -> type[Any]:
    """plumbum's LocalCommand on a machine whose own environment is empty, as the runner built it: a command
    then runs with exactly the environment given (plumbum's `local` adds the copy of ours it took)."""
    from plumbum.machines.local import LocalCommand, LocalEnv, LocalMachine

    class ExactEnvMachine(LocalMachine):
        env = LocalEnv()

    ExactEnvMachine.env.clear()
    machine = ExactEnvMachine()

    class Command(LocalCommand):
        @property
        def machine(self) -> LocalMachine:
            return machine

    return Command


def runners(repo: Path) -> dict[str, Callable[[list[str]], object]]:
    git = gitops.git_program()
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    command = exact_env_command()
    bound = command(git)["-C", str(repo)]

    def plain(args: list[str]) -> object:
        done = runner.run([git, *args], cwd=repo, env=env, session=False)
        assert done.returncode == 0, done.stderr
        return done

    def plumbum_popen(args: list[str]) -> object:
        options = {"stdin": subprocess.DEVNULL, "close_fds": True}
        with command(git)[args].popen(cwd=str(repo), env=env, **options) as proc:
            out, err = proc.communicate()
        assert proc.returncode == 0, err
        return out

    return {
        "runner (Popen)": plain,
        "plumbum Popen, waited": plumbum_popen,
        "plumbum .run(retcode)": lambda args: bound.run(args, retcode=0, env=env),
        "  ... and timeout=120": lambda args: bound.run(args, retcode=0, timeout=120, env=env),
    }


def bench_calls(work: Path, rounds: int) -> tuple[float, dict[str, float]]:
    """(plain Popen's median ms per call, what each way adds to it)."""
    repo = new_repo(work / "calls")
    for n in range(50):
        (repo / f"f{n}.txt").write_text(f"{n}\n")
    commit_all(repo, "init")
    ways = runners(repo)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():  # warm: imports, the timeout thread, the page cache
        way(list(READS[0]))
    for _ in range(rounds):
        for args in READS:
            for name, way in ways.items():
                times[name].append(ms(lambda way=way, args=args: way(list(args))))
    plain = statistics.median(times["runner (Popen)"])
    print(f"per call: {rounds * len(READS)} git calls each way ({', '.join(' '.join(a) for a in READS)})")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(
            f"  {name:22} mean {statistics.mean(spent):6.2f} ms  median {median:6.2f} ms  "
            f"x{median / plain:5.3f}  adds {median - plain:+6.2f} ms"
        )
    return plain, {name: statistics.median(spent) - plain for name, spent in times.items()}


def bench_import(repeats: int) -> float:
    base = "import stellafleet.proc.runner"
    argvs = {
        "runner alone": [sys.executable, "-c", base],
        "runner + plumbum": [sys.executable, "-c", f"{base}; import plumbum.machines.local"],
    }
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(repeats):
        for name, argv in argvs.items():
            times[name].append(ms(lambda argv=argv: subprocess.run(argv, check=True)))
    alone, loaded = (statistics.median(spent) for spent in times.values())
    print(f"per process: a fresh Python, {repeats} times each")
    print(
        f"  runner alone {alone:6.1f} ms  runner + plumbum {loaded:6.1f} ms  "
        f"plumbum adds {loaded - alone:+6.1f} ms"
    )
    return loaded - alone


def bench_timeout() -> None:
    from plumbum.commands.processes import ProcessTimedOut

    argv = ["/bin/sh", "-c", "sleep 5 & echo started; exec sleep 30"]  # the child keeps stdout open
    started = time.perf_counter()
    done = runner.run(argv, timeout=1, grace_s=0.3)
    took = time.perf_counter() - started
    print(f"a timeout of 1 s on a command whose child keeps the pipe (`{argv[-1]}`)")
    print(f"  runner                 returns after {took:4.1f} s, printed {done.stdout!r}, its group stopped")
    started, kept = time.perf_counter(), None
    try:
        exact_env_command()(argv[0])[argv[1:]].run(retcode=0, timeout=1, env=dict(os.environ))
    except ProcessTimedOut as timed_out:
        kept = getattr(timed_out, "stdout", None)
    took = time.perf_counter() - started
    print(f"  plumbum .run(timeout)  returns after {took:4.1f} s, printed {kept!r}, only the command killed")


def fleet_and_merge(work: Path, tasks: int) -> tuple[int, int, float]:
    """(git calls, processes that made them, wall s) of a fleet of tasks and its `stella merge`."""
    repo = new_repo(work / "fleet")
    (repo / "README").write_text("bench\n")
    commit_all(repo, "init")
    log, shim = work / "git.log", work / "shim"
    shim.mkdir()
    (shim / "git").write_text(LOGGING_GIT.format(log=log, git=gitops.git_program()))
    (shim / "git").chmod(0o755)
    (work / "worker.py").write_text(WORKER)
    config = StatePaths(repo).config_file
    config.parent.mkdir(parents=True)
    config.write_text(f'[pipelines.command]\nrun = "{sys.executable} {work / "worker.py"}"\n')
    plan = work / "plan.toml"
    plan.write_text(
        "".join(
            f'[[tasks]]\nid = "t{n}"\nprompt = "p"\nclaims = ["t{n}.txt"]\n'
            f'isolation = "{"isolated" if n % 2 else "shared"}"\n\n'
            for n in range(tasks)
        )
    )
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    started = time.perf_counter()
    fleet = [*STELLA, "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4"]
    for argv in (fleet, [*STELLA, "merge", "--unwatched"]):
        done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    wall = time.perf_counter() - started
    calls = log.read_text().splitlines()
    landed = sh("git", "log", "--oneline", cwd=repo).count("\n")
    print(f"a run and its landing: {tasks} tasks (half isolated), {landed} commits on main")
    return len(calls), len({line.split()[0] for line in calls}), wall


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--imports", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--skip-fleet", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain, added = bench_calls(work, args.calls)
        imported = bench_import(args.imports)
        bench_timeout()
        if args.skip_fleet:
            return 0
        calls, processes, wall = fleet_and_merge(work, args.tasks)
        own = calls * plain
        print(
            f"  {calls} git calls from {processes} processes, wall {wall:.2f} s; git's own time {own:.0f} ms"
        )
        for name in list(added)[1:]:
            share = calls * added[name] + processes * imported
            print(f"  {name:22} adds {share:4.0f} ms in all, x{share / own:4.2f} git's own time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
