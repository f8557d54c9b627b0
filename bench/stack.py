"""What a stacked start (`base = "parents"`) adds to a task's dispatch, against the pinned base.

One real `stella fleet` run on a repository of FILES files (default 20,000) holds both shapes: a fan-in
(FAN isolated parents, default 50, each committing its own file, and one task stacked on all of them)
and a chain (DEPTH isolated tasks, default 20, each stacked on the one before). A pinned start is the
run's base commit as it is: nothing to build. A stacked one is built as the task is dispatched, from the
ledger and the parents' branches (the dependencies' work looked up, then git merge-tree and commit-tree);
after the run the bench builds each stacked task's start again from the same ledger and branches, timed
(the median of --repeat), and checks it is the very commit the run recorded (the same inputs give the
same commit). Target: under 0.5 s per task on 2 cores.

    python bench/stack.py [--files 20000] [--fan 50] [--depth 20] [--repeat 3] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import commit_all, new_repo

from stellafleet.core.paths import StatePaths
from stellafleet.git import stack
from stellafleet.run.steps import RunSettings
from stellafleet.run.steps.startcommit import contributions
from stellafleet.state.ledger import Ledger

STELLA = [sys.executable, "-m", "stellafleet"]
TARGET_S = 0.5
COMMIT_OWN_FILE = (
    'mkdir -p out && echo "$STELLA_TASK_ID" > "out/$STELLA_TASK_ID.txt" && '
    'git add "out/$STELLA_TASK_ID.txt" && git commit -q -m "$STELLA_TASK_ID" && echo ok'
)


def make_repo(root: Path, files: int) -> Path:
    new_repo(root)
    for n in range(files):
        path = root / f"src/d{n % 100:02d}/f{n}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {n}\n")
    config = StatePaths(root).config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[pipelines.command]\nrun = '''" + COMMIT_OWN_FILE + "'''\n")
    return commit_all(root, "initial")


def plan_text(fan: int, depth: int) -> str:
    tasks = [f'[[tasks]]\nid = "p{n}"\nprompt = "parent {n}"\nisolation = "isolated"\n' for n in range(fan)]
    parents = ", ".join(f'"p{n}"' for n in range(fan))
    tasks.append(
        f'[[tasks]]\nid = "fan"\nprompt = "on all parents"\nisolation = "isolated"\nbase = "parents"\n'
        f"depends_on = [{parents}]\n"
    )
    for n in range(depth):
        after = f'depends_on = ["c{n - 1}"]\n' if n else ""
        tasks.append(
            f'[[tasks]]\nid = "c{n}"\nprompt = "link {n}"\nisolation = "isolated"\nbase = "parents"\n{after}'
        )
    return "\n".join(tasks)


def rebuild(
    root: Path, ledger: Ledger, run: dict[str, object], task_id: str, repeat: int
) -> tuple[float, str]:
    """The median seconds to build task_id's start again as dispatch does, and the commit built."""
    settings = RunSettings(root, str(run["id"]), str(run["base_commit"]), default_pipeline="command")
    times, built = [], ""
    for _ in range(repeat):
        started = time.perf_counter()
        result = stack.build_start(root, settings.base_commit, contributions(settings, ledger, task_id))
        times.append(time.perf_counter() - started)
        assert isinstance(result, str), result
        built = result
    return statistics.median(times), built


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--fan", type=int, default=50)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stella-bench-stack-") as scratch:
        root = make_repo(Path(scratch) / "repo", args.files)
        plan = Path(scratch) / "plan.toml"
        plan.write_text(plan_text(args.fan, args.depth))
        started = time.perf_counter()
        fleet = [*STELLA, "-q", "fleet", "--plan", str(plan), "--pipeline", "command"]
        ran = subprocess.run(
            [*fleet, "--max-concurrency", str(args.concurrency)], cwd=root, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        if ran.returncode != 0:
            sys.stderr.write(ran.stdout[-3000:] + ran.stderr[-3000:])
            return 1
        with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
            run = ledger.get_run(ledger.runs.resolve("latest"))
            recorded = {a["task_id"]: a["start_commit"] for a in run["attempts"] if a["start_commit"]}
            figures = {}
            for task_id in ["fan", *(f"c{n}" for n in range(args.depth))]:
                seconds, built = rebuild(root, ledger, run["run"], task_id, args.repeat)
                same = "same" if built == recorded.get(task_id) else f"DIFFERENT from {recorded.get(task_id)}"
                figures[task_id] = (seconds, same)
    tasks = args.fan + 1 + args.depth
    print(
        f"stella fleet: {tasks} isolated tasks on {args.files} files, {wall:.1f} s wall at {args.concurrency}"
    )
    print("pinned base: 0 s to build (the run's base commit, as it is)")
    fan_s, fan_same = figures["fan"]
    print(f"fan-in of {args.fan} parents: {fan_s:.3f} s to build its start ({fan_same} commit as the run's)")
    chain = [figures[f"c{n}"][0] for n in range(args.depth)]
    chain_same = all(figures[f"c{n}"][1] == "same" for n in range(args.depth))
    print(
        f"chain of {args.depth}: {statistics.mean(chain):.3f} s per task (max {max(chain):.3f} s, "
        f"the deepest), {'the same' if chain_same else 'NOT the same'} commits as the run's"
    )
    worst = max(fan_s, *chain)
    verdict = "met" if worst < TARGET_S else "MISSED"
    print(f"worst per task: {worst:.3f} s (target under {TARGET_S} s): {verdict}")
    return 0 if fan_same == "same" and chain_same else 1


if __name__ == "__main__":
    sys.exit(main())
