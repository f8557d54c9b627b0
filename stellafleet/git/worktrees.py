"""The worktrees and branch names of isolated tasks: one branch and one linked worktree per task."""

from __future__ import annotations

import hashlib
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops

_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slugify(text: str, limit: int = 40) -> str:
    slug = _SLUG_UNSAFE.sub("-", text).strip("-.").lower()
    return slug[:limit].rstrip("-.") or "task"


def task_hash(run_id: str, task_id: str) -> str:
    """16 hex characters from the run and task ids: re-runs reusing ids never collide."""
    return hashlib.sha256(f"{run_id}\0{task_id}".encode()).hexdigest()[:16]


def isolated_name(run_id: str, task_id: str) -> str:
    return f"{slugify(task_id)}-{task_hash(run_id, task_id)}"


@dataclass(frozen=True)
class Worktree:
    path: Path
    branch: str | None


# `git worktree add` reads every other worktree's admin files and fails on one being created: serialise
# our own calls, and retry the ones that raced another process
_WORKTREE_ADD_LOCK = threading.Lock()


def worktree_add(root: Path, path: Path, branch: str | None, base_commit: str) -> None:
    """A new worktree at path on a new branch at base_commit (branch None: a detached HEAD there)."""
    on = ["-b", branch] if branch is not None else ["--detach"]
    for attempt in range(20):
        try:
            with _WORKTREE_ADD_LOCK:
                gitops.git("worktree", "add", "-q", *on, str(path), base_commit, cwd=root)
            return
        except GitError as exc:
            if "failed to read" not in str(exc) or attempt == 19:
                raise
            if branch is not None and gitops.branch_exists(root, branch) and not path.exists():
                gitops.branch_delete(root, branch)
            time.sleep(0.05)


def fold_start_commit(workspace: Path) -> None:
    """A worktree checked out at a salvage commit goes back to its parent with the salvaged work staged:
    it lands in the task's next commit, under the task's own message and the repository's hooks."""
    gitops.git("reset", "-q", "--soft", "HEAD^", cwd=workspace)


def worktree_list(root: Path) -> list[Worktree]:
    out = gitops.git("worktree", "list", "--porcelain", cwd=root)
    trees: list[Worktree] = []
    path: Path | None = None
    branch: str | None = None
    for line in [*out.splitlines(), ""]:
        if line.startswith("worktree "):
            path = Path(line[len("worktree ") :])
        elif line.startswith("branch "):
            branch = line[len("branch ") :].removeprefix("refs/heads/")
        elif not line and path is not None:
            trees.append(Worktree(path, branch))
            path, branch = None, None
    return trees


def worktree_remove(root: Path, path: Path, *, force: bool = False) -> None:
    """Remove a linked worktree, the one way stella does. Unforced: refused with uncommitted work (clean
    initialised submodules are no bar). Forced: whatever is left goes; GitError if git still lists it."""
    if force:
        code, out, err = gitops.git_status("worktree", "remove", "--force", str(path), cwd=root)
        if code:  # half made or already gone: its registration is pruned
            gitops.git("worktree", "prune", cwd=root, check=False)
            if any(tree.path.resolve() == path.resolve() for tree in worktree_list(root)):
                raise GitError(f"git worktree remove: {gitops.last_words(err or out, code)}")
            shutil.rmtree(path, ignore_errors=True)  # no worktree of git's any more: what is left of one
        return
    try:
        gitops.git("worktree", "remove", str(path), cwd=root)
    except GitError as exc:
        if "submodules" not in str(exc) or gitops.status_porcelain(path):
            raise
        gitops.git("worktree", "remove", "--force", str(path), cwd=root)
