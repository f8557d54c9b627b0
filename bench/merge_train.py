"""The merge train against landing one branch at a time, and against GitHub's "remove and rebuild" (batches
without bisection: every prefix of a batch checked, the first red entry removed, the rest rebuilt).

One repository, N branches (default 32): each changes its own file, and about `--overlap` of them also one
line of a shared file (their paths overlap, their lines do not conflict); two branches are red only
together; the check sleeps `--check-seconds` (1) and fails by itself 5% of the time (decided by `--seed`).
Each policy lands a copy of the same run. Printed for each: wall seconds, check runs per landed branch, red
main incidents (a tip of main on which the check is red without flaking), innocent evictions (evicted,
but not the later of the red pair). Then what moving a kept check tree costs on `--tree-files` files.

    python bench/merge_train.py [--branches 32] [--overlap 0.1] [--check-seconds 1] [--seed 7]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import MergeStatus
from stellafleet.git.keptree import KeptTree
from stellafleet.merge import batch as train
from stellafleet.merge.journal import Journal
from stellafleet.merge.options import MergeOptions, MergeResult
from stellafleet.merge.queue import MergeItem, plan_queue
from stellafleet.merge.runner import _Queue
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

RUN_ID = "r-20261207-000000-bnch"
ENV = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
# each run counts itself ($COUNT), sleeps, is red when both red flags are there, else flakes 5% of the time
CHECK = (
    'n=$(( $(cat "$COUNT" 2>/dev/null || echo 0) + 1 )); echo $n > "$COUNT"; sleep {seconds}; '
    "if [ -e red/x.flag ] && [ -e red/y.flag ]; then echo red together; exit 1; fi; "
    "awk -v s={seed} -v n=$n 'BEGIN {{ srand(s * 100003 + n); exit (rand() < 0.05) }}'"
)


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *ENV, *args], cwd=root, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def build(root: Path, branches: int, overlap: float, seed: int) -> tuple[str, str]:
    """The repository and its run; (the later of the red pair's task id, the base commit)."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "shared").mkdir()
    for n in range(3):
        (root / "shared" / f"s{n}.txt").write_text("".join(f"line {i}\n" for i in range(branches * 10)))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    base = git(root, "rev-parse", "HEAD")
    red = rng.sample(range(branches), 2)
    ids = [f"t{n:02d}" for n in range(branches)]
    for n, task in enumerate(ids):
        git(root, "switch", "-q", "-c", f"fleet/{task}", base)
        flag = {red[0]: "x", red[1]: "y"}.get(n)
        own = root / ("red" if flag else "own") / (f"{flag}.flag" if flag else f"{task}.txt")
        own.parent.mkdir(exist_ok=True)
        own.write_text(f"{task}\n")
        if rng.random() < overlap:  # one line of its own in a shared file: the paths overlap
            shared = root / "shared" / f"s{rng.randrange(3)}.txt"
            lines = shared.read_text().splitlines()
            lines[n * 10] = f"{task} was here"  # far apart: no context shared with another change
            shared.write_text("\n".join(lines) + "\n")
        git(root, "add", "-A")
        git(root, "commit", "-qm", f"{task}: work")
        git(root, "switch", "-q", "main")
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(root))
        tasks = [PlanTask(t, "do it", t, isolation="isolated") for t in ids]
        ledger.tasks.add(RUN_ID, tasks, {t: 1 for t in ids})
        for task in ids:
            ledger.tasks.set_workspace(RUN_ID, task, f"fleet/{task}", None)
            ledger.tasks.set_status(RUN_ID, task, "succeeded")
        ledger.runs.finish(RUN_ID, "succeeded", exit_code=0)
    return ids[max(red)], base


class RemoveAndRebuild(train.Train):
    """GitHub's merge queue: no bisection; every prefix of the batch is checked, the prefix before the first
    red entry lands, that entry is removed (no confirmation) and the entries after it are rebuilt."""

    def _check_and_land(
        self, built: list[train.Built], record: train.BatchRecord
    ) -> tuple[str, list[MergeItem]]:
        verdicts = [self._check(built, n, record, "prefix") for n in range(1, len(built) + 1)]
        if all(verdicts):
            self._land(built, len(built), record)
            return "landed", []
        first = verdicts.index(False) + 1
        self._land(built, first - 1, record)
        self._evict_red(built[first - 1].item, record, first)
        return "rebuilt", [b.item for b in built[first:]]


def land(root: Path, policy: str, check: str, count: Path) -> MergeResult:
    os.environ["COUNT"] = str(count)  # the check's environment is stella's
    window = 1 if policy == "serial" else 8
    options = MergeOptions(
        unwatched=True, check=check, window=window, max_window=window if policy == "serial" else 32
    )
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        queue, left = plan_queue(ledger.get_run(RUN_ID), unwatched=True)
        tip = git(root, "rev-parse", "HEAD")
        result = MergeResult(RUN_ID, "main", options, tip, tip, queue, left)
        lander = _Queue(root, ledger, result, lambda item: None, None, Journal(None))
        kind = RemoveAndRebuild if policy == "remove-and-rebuild" else train.Train
        kind(lander, None, lambda line: None).run_rounds()
    return result


def red_main(root: Path, start: str) -> int:
    """Tips main moved to on which the check is red by itself (both red flags there)."""
    tips = git(root, "log", "--first-parent", "--format=%H", f"{start}..main").split()
    return sum(1 for tip in tips if len(git(root, "ls-tree", "--name-only", tip, "red/").split()) == 2)


def kept_tree_move(base: Path, files: int) -> float:
    """Seconds one move of a kept check tree costs on a repository of files files (median of 3)."""
    root = base / "tree-repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    for n in range(files):
        folder = root / "src" / f"d{n // 200:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n:05d}.c").write_text(f"int f{n}(void) {{ return {n}; }}\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "files")
    commits = [git(root, "rev-parse", "HEAD")]
    for n in range(3):
        (root / "src" / "d000" / "f00000.c").write_text(f"int change{n};\n")
        git(root, "commit", "-qam", f"change {n}")
        commits.append(git(root, "rev-parse", "HEAD"))
    kept = KeptTree(root, base / "kept", ready=lambda path: None)
    with kept.held():
        kept.move_to(commits[0])
    seconds = []
    for commit in commits[1:]:
        started = time.monotonic()
        with kept.held():
            kept.move_to(commit)
        seconds.append(time.monotonic() - started)
    return sorted(seconds)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--branches", type=int, default=32)
    parser.add_argument("--overlap", type=float, default=0.1)
    parser.add_argument("--check-seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tree-files", type=int, default=20000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="stella-bench-train-"))
    try:
        source = base / "source"
        culprit, start = build(source, args.branches, args.overlap, args.seed)
        check = CHECK.format(seconds=args.check_seconds, seed=args.seed)
        print(
            f"{args.branches} branches, ~{args.overlap:.0%} overlapping, red together: {culprit} (the later)"
        )
        print(
            f"{'policy':<20} {'wall s':>8} {'checks/landed':>14} {'landed':>7} {'red main':>9} "
            f"{'innocent':>9}"
        )
        walls = {}
        for policy in ("train", "serial", "remove-and-rebuild"):
            root = base / policy
            shutil.copytree(source, root, symlinks=True)
            git(root, "update-index", "-q", "--refresh")  # a copied index's file times are stale
            started = time.monotonic()
            result = land(root, policy, check, base / f"{policy}.count")
            walls[policy] = time.monotonic() - started
            landed = sum(1 for item in result.queue if item.status == MergeStatus.MERGED)
            evicted = [
                i.task_id
                for i in result.queue
                if i.status in (MergeStatus.CHECK_FAILED, MergeStatus.CONFLICT)
            ]
            innocent = len([t for t in evicted if t != culprit])
            per = result.check_runs / max(landed, 1)
            print(
                f"{policy:<20} {walls[policy]:>8.1f} {per:>14.2f} {landed:>7} {red_main(root, start):>9} "
                f"{innocent:>9}"
            )
        print(f"train wall / serial wall: {walls['train'] / walls['serial']:.2f}x")
        print(
            f"a kept check tree's move on {args.tree_files} files: "
            f"{kept_tree_move(base, args.tree_files):.2f} s"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
