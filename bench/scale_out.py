"""Per-task overhead of the Ray executor beside the local one: N isolated no-op tasks, each way.

Starts a real 2-node Ray cluster on this machine in a private network namespace (root, unshare, nsenter,
ip; the `stellafleet[ray]` extra), or uses a running one with --address (the fleet then runs here). Both
fleets run the same plan of --tasks isolated tasks whose command does nothing, at the same concurrency
(the cluster's slots). Per-task overhead = wall time x concurrency / tasks: what one task costs a slot
when its work is nothing. The Ray path adds the base bundle, a clone on the node, the branch bundle back
and Ray's scheduling.

    python bench/scale_out.py [--tasks 16] [--concurrency 4] [--address HOST:PORT]
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

from stellafleet.core.paths import StatePaths
from stellafleet.state.ledger import Ledger
from stellafleet.testing import raycluster


def make_repo(root: Path, tasks: int) -> None:
    root.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.name", "Bench"],
        ["config", "user.email", "bench@example.invalid"],
        ["commit", "-q", "--allow-empty", "-m", "base"],
    ):
        subprocess.run(["git", *args], cwd=root, check=True)
    (root / ".stella").mkdir()
    (root / ".stella" / "config.toml").write_text('[pipelines.command]\nrun = "true"\n')
    task = '[[tasks]]\nid = "t{n}"\nprompt = "nothing"\nisolation = "isolated"\n\n'
    plan = "".join(task.format(n=n) for n in range(tasks))
    (root.parent / "plan.toml").write_text(plan)


def attempt_seconds(root: Path) -> tuple[float, float]:
    """Mean and median attempt duration of the latest run (started to recorded end, from the ledger); the
    median leaves out the first attempt on each fresh Ray worker, which pays for its start-up."""
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        attempts = ledger.get_run(ledger.runs.resolve(None))["attempts"]
    seconds = [(a["finished_at_ms"] - a["started_at_ms"]) / 1000 for a in attempts]
    return statistics.mean(seconds), statistics.median(seconds)


def run_fleet(
    argv_prefix: list[str], root: Path, concurrency: int, extra: list[str]
) -> tuple[float, tuple[float, float]]:
    argv = [sys.executable, "-m", "stellafleet", "--quiet", "fleet", "--plan", "../plan.toml"]
    argv += ["--pipeline", "command", "--max-concurrency", str(concurrency), *extra]
    env = raycluster.quiet_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    start = time.perf_counter()
    done = subprocess.run([*argv_prefix, *argv], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"fleet failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, attempt_seconds(root)


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4, help="the fleet width (default: 2 nodes x 2)")
    parser.add_argument("--address", help="a running Ray cluster (default: start a 2-node one here)")
    args = parser.parse_args()
    cluster = None
    if args.address is None:
        why = raycluster.unavailable()
        if why is not None:
            raise SystemExit(f"cannot start a Ray cluster here: {why}")
        cluster = raycluster.Cluster()
    try:
        prefix: list[str] = []
        address = args.address or raycluster.ADDRESS
        if cluster is not None:
            started = time.perf_counter()
            cluster.start(slots=max(1, args.concurrency // 2))
            print(f"2-node cluster up in {time.perf_counter() - started:.1f} s (not counted)")
            prefix = cluster.ns([])
        with tempfile.TemporaryDirectory(prefix="stella-scale-") as tmp:
            root = Path(tmp) / "repo"
            make_repo(root, args.tasks)
            local = run_fleet(prefix, root, args.concurrency, [])
            ray_args = ["--executor", "ray", "--ray-address", address]
            remote = run_fleet(prefix, root, args.concurrency, ray_args)
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"{args.tasks} isolated no-op tasks, concurrency {args.concurrency}")
    for name, (wall, (mean, median)) in {"local": local, "ray": remote}.items():
        per_slot = wall * args.concurrency / args.tasks
        print(f"  {name:5} {wall:6.2f} s wall, {per_slot:5.2f} s per task per slot (fleet start-up included)")
        print(f"        per attempt (started -> recorded): mean {mean:.2f} s, median {median:.2f} s")
    (local_wall, (local_mean, local_median)), (ray_wall, (ray_mean, ray_median)) = local, remote
    added_wall = (ray_wall - local_wall) * args.concurrency / args.tasks
    added_mean, added_median = ray_mean - local_mean, ray_median - local_median
    print(f"  ray adds per attempt: mean {added_mean:+.2f} s, median {added_median:+.2f} s")
    print(f"  ray adds {added_wall:+.2f} s per task per slot of wall (ratio {ray_wall / local_wall:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
