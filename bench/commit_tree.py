"""What the commit tree adds to a shared commit: `stella commit` with its hooks run in the commit tree
(`[commit] hooks_in = "commit-tree"`) against today's lane (`"shared-tree"`), on a repository of --files
files whose pre-commit hook does nothing, one commit at a time and --workers committing at once.

Each round commits --commits new files one after another, then --workers files at once (one `stella
commit` process each), in each mode in turn (the same load for both); the commit tree is made and readied
before the first round (its one-off cost is printed apart). Printed: the median seconds per commit in each
mode (of single commits; of rounds for the concurrent ones, wall time / commits), what the commit tree adds
per commit and the ratio; and what one move of a kept tree costs on its own.

    python bench/commit_tree.py [--files 20000] [--commits 10] [--workers 8] [--rounds 2]
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

from benchrepo import commit_all, new_repo, sh

from stellafleet.git.keptree import KeptTree

MODES = ("shared-tree", "commit-tree")


def kept_moves(root: Path, repeat: int = 5) -> float:
    """Median seconds of one move of a kept tree (git/keptree.py) between two commits 40 commits apart."""
    kept = KeptTree(root, root.parent / "kept", ready=lambda tree: None)
    head = sh("git", "rev-parse", "HEAD", cwd=root).strip()
    back = sh("git", "rev-parse", "HEAD~40", cwd=root).strip()
    times = []
    with kept.held():
        kept.move_to(head)  # made once
        for n in range(repeat * 2):
            started = time.perf_counter()
            kept.move_to(back if n % 2 == 0 else head)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def make_repo(root: Path, files: int) -> Path:
    new_repo(root)
    for n in range(files):
        folder = root / "src" / f"d{n // 500:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n:05d}.ts").write_text(f"export const v{n} = {n};\n")
    commit_all(root, "20,000 files")
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return root


def use_mode(root: Path, mode: str) -> None:
    config = root / ".stella" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[commit]\nhooks_in = "{mode}"\n')


def stella_commit(root: Path, name: str) -> subprocess.Popen[str]:
    (root / "out").mkdir(exist_ok=True)
    (root / "out" / name).write_text(f"{name}\n")
    argv = [sys.executable, "-m", "stellafleet", "commit", "-m", f"add {name}", f"out/{name}"]
    return subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> None:
    _out, err = proc.communicate()
    if proc.returncode:
        sys.exit(f"stella commit failed: {err.strip()}")


def sequential(root: Path, mode: str, commits: int, tag: str) -> list[float]:
    """Seconds of each commit, one after another."""
    use_mode(root, mode)
    times = []
    for n in range(commits):
        started = time.perf_counter()
        finish(stella_commit(root, f"{tag}-{mode}-{n}.txt"))
        times.append(time.perf_counter() - started)
    return times


def concurrent(root: Path, mode: str, workers: int, tag: str) -> float:
    """Seconds per commit, workers committing at once (wall time / commits)."""
    use_mode(root, mode)
    started = time.perf_counter()
    procs = [stella_commit(root, f"{tag}-{mode}-w{n}.txt") for n in range(workers)]
    for proc in procs:
        finish(proc)
    return (time.perf_counter() - started) / workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="commit-tree-bench-") as tmp:
        root = make_repo(Path(tmp) / "repo", args.files)
        use_mode(root, "commit-tree")
        started = time.perf_counter()
        finish(stella_commit(root, "first.txt"))  # the commit tree made and readied: once per repository
        first = time.perf_counter() - started
        seq: dict[str, list[float]] = {mode: [] for mode in MODES}
        con: dict[str, list[float]] = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                seq[mode].extend(sequential(root, mode, args.commits, f"r{r}"))
                con[mode].append(concurrent(root, mode, args.workers, f"r{r}"))
        made = int(sh("git", "rev-list", "--count", "HEAD", cwd=root))
        move = kept_moves(root) if made > 40 else None
    print(f"repository: {args.files} files, a pre-commit hook that does nothing; {os.cpu_count()} cores")
    print(f"first commit (commit tree made and readied): {first:.2f} s")
    for label, figures in (("one at a time", seq), (f"{args.workers} at once", con)):
        base, tree = (statistics.median(figures[mode]) for mode in MODES)
        print(
            f"{label}: shared tree {base:.3f} s/commit, commit tree {tree:.3f} s/commit; "
            f"the commit tree adds {tree - base:+.3f} s per commit (ratio {tree / base:.2f})"
        )
    print(f"commits made: {made - 1}")
    if move is not None:
        print(f"a kept tree moved 40 commits and back ({args.files} files): {move:.3f} s per move")


if __name__ == "__main__":
    main()
