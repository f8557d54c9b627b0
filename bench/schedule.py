"""Waves against the eager schedule on a seeded random task graph with long-tailed durations.

Each task of the plan is a `sleep` of its duration through the command pipeline, so the wall time is the
schedule's (and the fleet's own per-task cost). The graph has `--tasks` tasks, each depending on up to
three of the tasks before it; the durations are log-normal (a few tasks take many times the median), scaled
so the whole run stays well under a minute. Printed: the wall time with waves, with eager, and the lower
bound no schedule can beat, max(critical path, total work / concurrency); the target is eager within 10%
of the lower bound. Wall time is measured from the ledger: first attempt started to last attempt ended.

Eager runs twice: on a plan the ledger has never seen (no durations known: the longest chain in tasks
starts first), and on the same plan run again, when the ledger knows how long each task took (the longest
chain of work by those durations starts first). Waves run first, so the second eager run has durations
from its first repeat on.

    python bench/schedule.py [--tasks 60] [--concurrency 8] [--seed 7] [--scale 0.4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.paths import StatePaths
from stellafleet.plan.model import Plan, load_plan
from stellafleet.run.eager import critical_path, lower_bound, start_order
from stellafleet.state.ledger import Ledger

STELLA = [sys.executable, "-m", "stellafleet"]
COLD, KNOWN = "eager, first run", "eager, run again"


def random_graph(tasks: int, seed: int, scale: float) -> tuple[list[tuple[str, list[str]]], dict[str, float]]:
    """(task id, dependencies) in plan order and each task's duration in seconds."""
    rng = random.Random(seed)
    graph: list[tuple[str, list[str]]] = []
    durations: dict[str, float] = {}
    for n in range(tasks):
        task_id = f"t{n:02d}"
        window = [other for other, _ in graph[-12:]]
        deps = sorted(rng.sample(window, k=min(len(window), rng.choice((0, 0, 1, 1, 2, 3)))))
        graph.append((task_id, deps))
        # log-normal: median `scale` s, one task in ~20 over 5x the median; capped so one task cannot
        # make the critical path the whole story
        durations[task_id] = round(min(scale * rng.lognormvariate(0, 1.0), scale * 8), 2)
    return graph, durations


def write_repo(root: Path, graph: list[tuple[str, list[str]]], durations: dict[str, float]) -> Path:
    root.mkdir(parents=True)
    for args in (
        ("init", "-q", "-b", "main"),
        ("config", "user.name", "bench"),
        ("config", "user.email", "bench@example.invalid"),
        ("commit", "-q", "--allow-empty", "-m", "init"),
    ):
        subprocess.run(["git", *args], cwd=root, check=True)
    plan = root.parent / "plan.toml"
    plan.write_text(
        "\n".join(
            f'[[tasks]]\nid = "{task_id}"\nprompt = "sleep"\ndepends_on = {json.dumps(deps)}\n'
            for task_id, deps in graph
        )
    )
    config = StatePaths(root).config_file
    config.parent.mkdir(parents=True)
    lines = ['[pipelines.command]\nrun = "true"\n']
    for task_id, seconds in durations.items():
        lines.append(f'[pipelines.command.tasks."{task_id}"]\nrun = "sleep {seconds}"\n')
    config.write_text("\n".join(lines))
    return plan


def simulate(plan: Plan, durations: dict[str, float], concurrency: int, schedule: str) -> float:
    """The wall time the schedule's own rule gives with no per-task cost at all (its algorithmic part)."""
    if schedule == "waves":
        return sum(max(durations[t] for t in wave) for wave in plan.waves(concurrency))
    first = start_order(plan, durations if schedule == KNOWN else {})
    waiting = {task.id: set(task.depends_on) for task in plan.tasks}
    running: list[tuple[float, str]] = []
    now = 0.0
    while waiting or running:
        ready = sorted((t for t, deps in waiting.items() if not deps), key=first.__getitem__)
        for task_id in ready[: concurrency - len(running)]:
            del waiting[task_id]
            heapq.heappush(running, (now + durations[task_id], task_id))
        now, finished = heapq.heappop(running)
        for deps in waiting.values():
            deps.discard(finished)
    return now


def run_once(root: Path, plan: Path, schedule: str, concurrency: int, durations: dict[str, float]) -> Run:
    """One fleet run, timed from its ledger: first attempt start to last attempt end. A first run of the
    plan has an empty ledger: nothing is known about its tasks."""
    if schedule == COLD:
        for leftover in StatePaths(root).private.glob("fleet.db*"):
            leftover.unlink()
    schedule = "eager" if schedule in (COLD, KNOWN) else schedule
    argv = ["fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", str(concurrency)]
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [*STELLA, *argv, "--schedule", schedule, "--json"], cwd=root, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"stella fleet --schedule {schedule} failed ({proc.returncode}): {proc.stderr}")
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        attempts = ledger.get_run(ledger.runs.resolve("latest"))["attempts"]
    wall = (max(a["finished_at_ms"] for a in attempts) - min(a["started_at_ms"] for a in attempts)) / 1000
    extra = [(a["finished_at_ms"] - a["started_at_ms"]) / 1000 - durations[a["task_id"]] for a in attempts]
    return Run(wall, statistics.median(extra))


@dataclass(frozen=True)
class Run:
    wall_s: float
    overhead_s: float  # median of (attempt wall - its sleep): the fleet's own cost per task


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=0.4, help="median task duration in seconds")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    graph, durations = random_graph(args.tasks, args.seed, args.scale)
    with tempfile.TemporaryDirectory(prefix="stella-schedule-") as tmp:
        root = Path(tmp) / "repo"
        plan = write_repo(root, graph, durations)
        loaded = load_plan(plan)
        path = critical_path(loaded, durations)
        work = sum(durations.values())
        bound = lower_bound(loaded, durations, args.concurrency)
        cold = Path(tmp) / "cold"
        write_repo(cold / "repo", graph, durations)
        runs: dict[str, list[Run]] = {"waves": [], COLD: [], KNOWN: []}
        for _ in range(args.repeat):
            for schedule in runs:  # interleaved, so a load swing hits them alike
                where = cold / "repo" if schedule == COLD else root
                runs[schedule].append(
                    run_once(where, where.parent / "plan.toml", schedule, args.concurrency, durations)
                )
    print(
        f"{args.tasks} tasks (seed {args.seed}), concurrency {args.concurrency}: "
        f"total work {work:.1f}s, longest task {max(durations.values()):.2f}s, critical path {path:.2f}s"
    )
    print(f"{'lower bound':<17} {bound:6.2f}s  max(critical path, work / concurrency)")
    for schedule, done in runs.items():
        values = [run.wall_s for run in done]
        wall = statistics.median(values)
        spread = f" [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else ""
        overhead = statistics.median(run.overhead_s for run in done)
        ideal = simulate(loaded, durations, args.concurrency, schedule)
        print(
            f"{schedule:<17} {wall:6.2f}s{spread}  {wall / bound:.2f}x the lower bound "
            f"(fleet cost per task {overhead:.3f}s beyond its sleep; with no such cost: {ideal:.2f}s, "
            f"{ideal / bound:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
