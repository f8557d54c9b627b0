"""What a task's check adds per task: a fresh scratch checkout of a commit plus the check `true`, as a
shared task's check runs (run/checking.py: the worktree, its journal record, the check under the child
subreaper in its own group, the group stopped, the tree removed), on a repository of F files (default
20,000), with no `[worktree] setup` and nothing in `.worktreeinclude`.

The baseline, measured in the same run, is the check alone in the repository itself (no scratch tree):
the difference is what the tree costs. Figures: the median seconds of each over R rounds (default 5).

    python bench/check_overhead.py [--files 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.status import CheckPhase
from stellafleet.run import checking
from stellafleet.state.ledger import Ledger


def make_repo(root: Path, files: int) -> str:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    for n in range(files):
        folder = root / "src" / f"d{n // 200:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n:05d}.c").write_text(f"int f{n}(void) {{ return {n}; }}\n")
    env = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", *env, "commit", "-q", "-m", "files"], cwd=root, check=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


def once(root: Path, commit: str, ledger: Ledger, *, scratch: bool) -> float:
    env = {"PATH": "/usr/bin:/bin"}
    log = root / ".stella" / "private" / "logs" / "bench.log"
    row = checking.CheckRow("r-bench", "t1", CheckPhase.AFTER)
    tree = checking.FreshTree(WorktreeConfig(), False, env) if scratch else root
    started = time.monotonic()
    [run] = checking.run_and_record(
        ledger, row, [checking.Command("true", 60, log)], commit,
        tree=tree, root=root, env=env, log_path=log, tail_bytes=8000,
    )  # fmt: skip
    assert run.passed, run
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the repository goes (default: the temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stella-bench-check-", dir=args.dir) as scratch:
        root = Path(scratch) / "repo"
        commit = make_repo(root, args.files)
        (root / ".git" / "info" / "exclude").write_text(".stella/\n")
        (root / ".stella" / "private").mkdir(parents=True, exist_ok=True)
        with Ledger.open(root / ".stella" / "private" / "fleet.db") as ledger:  # each check is a row
            alone = [once(root, commit, ledger, scratch=False) for _ in range(args.rounds)]
            tree = [once(root, commit, ledger, scratch=True) for _ in range(args.rounds)]
        started = time.monotonic()
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(root.parent / "plain"), commit], cwd=root
        )
        checkout = time.monotonic() - started
    base, full = statistics.median(alone), statistics.median(tree)
    where = args.dir or tempfile.gettempdir()
    print(f"repository: {args.files} files in {where}; {args.rounds} rounds (medians)")
    print(f"check `true` alone (baseline)        {base:6.3f} s")
    print(f"scratch checkout + check `true`      {full:6.3f} s")
    print(f"what a check adds per task           {full:6.3f} s (the tree: {full - base:.3f} s; target < 1 s)")
    print(f"git's own checkout of the files      {checkout:6.3f} s (`git worktree add` alone, for scale)")


if __name__ == "__main__":
    main()
