"""A Ray node's clone of a run's base, kept between attempts: each attempt pays for a worktree only."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.git import bundle, gitops
from stellafleet.proc.flock import locked

CACHE_ENV = "STELLA_NODE_CACHE"
READY = ".git/stella-clone-ready"  # written last: a clone without it was cut short and is made again


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stella" / "clones"


def base_clone(write_bundle: Callable[[Path], None], base_commit: str) -> Path:
    """The node's clone holding base_commit; the first time, write_bundle(path) writes the bundle."""
    root = cache_dir() / base_commit
    if (root / READY).exists():  # made before, completely: no git call needed to know it
        return root
    with locked(root.with_suffix(".lock")):
        if not (root / READY).exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-made clone of a killed attempt
            scratch = root.with_name(root.name + ".new")
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            write_bundle(scratch / "base.bundle")
            bundle.clone_on_branch(scratch / "base.bundle", scratch / "repo", "stella-base")
            gitops.ensure_excluded(scratch / "repo", EXCLUDED_DIRS)
            (scratch / "repo" / READY).write_text(base_commit + "\n")
            (scratch / "repo").replace(root)
            shutil.rmtree(scratch, ignore_errors=True)
    return root


def add_worktree(clone: Path, path: Path, branch: str, base_commit: str, start: Path | None = None) -> None:
    """The attempt's worktree of the clone at path, on branch, at base_commit or the start bundle's commit."""
    with locked(clone.with_suffix(".lock")):  # worktree adds of one clone, one at a time
        tag = path.parent.name  # the attempt's scratch directory: unique while it runs
        commit = bundle.fetch_start(clone, start, tag) if start is not None else base_commit
        try:
            # -f: a killed attempt's worktree may still hold a branch of that name; -B resets it
            gitops.git("worktree", "add", "-q", "-f", "-B", branch, str(path), commit, cwd=clone)
        finally:
            if start is not None:  # the branch holds the commit now
                bundle.drop_start(clone, tag)


def remove_worktree(clone: Path, path: Path, branch: str) -> None:
    """The attempt's worktree and branch gone from the clone (a killed attempt's too, by one prune)."""
    shutil.rmtree(path, ignore_errors=True)
    with locked(clone.with_suffix(".lock")):
        gitops.git("worktree", "prune", cwd=clone, check=False)
        gitops.git("update-ref", "-d", f"refs/heads/{branch}", cwd=clone, check=False)
