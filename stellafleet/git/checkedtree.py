"""The worktree a check runs in (an isolated task's own) after the check: what the check may not change there
(HEAD's branch, that branch's commit, the tracked files, the worktree and its `.git`) is named and put back,
and the untracked files it left are removed, so that no later commit takes them for the task's work."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from stellafleet.git import gitops, hookstash
from stellafleet.proc.flock import locked


@dataclass(frozen=True)
class TreeState:
    """A worktree as a check found it."""

    path: Path
    branch: str | None  # HEAD's branch; None: HEAD detached
    commit: str
    dirty: frozenset[str]  # its tracked changes (status lines), when a check found some
    untracked: frozenset[str]  # its untracked files that are not ignored


@dataclass(frozen=True)
class PutBack:
    """What the check changed: each change that fails it, named, and the untracked files removed."""

    changed: list[str]
    removed: list[str]


def untracked_files(tree: Path) -> set[str]:
    """tree's untracked files that are not ignored."""
    return set(gitops.git_fields("ls-files", "-z", "--others", "--exclude-standard", cwd=tree))


def _tracked_changes(tree: Path) -> set[str]:
    # a submodule's build output or edits are the check's business; a submodule moved to another commit is not
    out = gitops.git("status", "--porcelain", "--untracked-files=no", "--ignore-submodules=dirty", cwd=tree)
    return {line for line in out.splitlines() if line}


def state_of(tree: Path) -> TreeState:
    branch, commit = gitops.current_branch(tree), gitops.head_commit(tree)
    return TreeState(
        tree, branch, commit, frozenset(_tracked_changes(tree)), frozenset(untracked_files(tree))
    )


def _short(commit: str | None) -> str:
    return (commit or "nothing")[:7]


def _branch_put_back(root: Path, was: TreeState) -> list[str]:
    """The branch at the checked commit again (refs are the repository's: this works with no worktree)."""
    if was.branch is None:
        return []
    ref = f"refs/heads/{was.branch}"
    now = gitops.ref_commit(root, ref)
    if now == was.commit:
        return []
    gitops.git("update-ref", "-m", "stella: a check moved it; put back", ref, was.commit, cwd=root)
    if now is None:
        return [f"the check deleted {was.branch} (at {_short(was.commit)})"]
    return [f"the check moved {was.branch} from {_short(was.commit)} to {_short(now)}"]


def _tree_gone(root: Path, tree: Path) -> str | None:
    """Why tree is no worktree any more (its `.git` is repaired when git still knows it), or None."""
    if not tree.is_dir():
        return f"the check deleted its worktree {tree}"
    if (tree / ".git").exists():
        return None
    gitops.git("worktree", "repair", str(tree), cwd=root, check=False)
    if not (tree / ".git").exists():  # no git below it: anything run there would reach another repository
        return f"the check removed {tree / '.git'}, which could not be repaired"
    return f"the check removed {tree / '.git'} (repaired)"


def _remove(tree: Path, paths: list[str]) -> None:
    for relative in paths:
        path = tree / relative
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():  # a repository of its own, listed as its folder
                shutil.rmtree(path)
            else:
                path.unlink()


def put_back(root: Path, was: TreeState) -> PutBack:
    """The worktree was describes, after a check: its branch, HEAD, tracked files as they were, and what
    the check left untracked removed. root: the repository (any of its worktrees but this one)."""
    gone = _tree_gone(root, was.path)
    changed: list[str] = [gone] if gone else []
    if gone and not (was.path / ".git").exists():
        return PutBack([*changed, *_branch_put_back(root, was)], [])
    tree = was.path
    head = gitops.current_branch(tree)
    if head != was.branch:
        changed.append("the check detached HEAD" if head is None else f"the check checked out {head}")
    if edited := sorted(line[3:] for line in _tracked_changes(tree) - was.dirty):
        shown = " ".join(edited[:5]) + (" ..." if len(edited) > 5 else "")
        changed.append(f"the check changed tracked files: {shown}")
    changed += _branch_put_back(root, was)
    if changed:
        if was.branch is not None:
            gitops.git("symbolic-ref", "HEAD", f"refs/heads/{was.branch}", cwd=tree)
        else:
            gitops.git("update-ref", "--no-deref", "HEAD", was.commit, cwd=tree)
        gitops.git("reset", "-q", "--hard", was.commit, cwd=tree)
    left = sorted(untracked_files(tree) - was.untracked)
    _remove(tree, left)
    return PutBack(changed, left)


def stash_list(root: Path, lock: Path, tree: Path) -> tuple[list[hookstash.Entry], hookstash.Origin]:
    """The stash list as a check starts in tree, and what it starts on (read under the hook lock: no commit
    hook is mid-stash)."""
    with locked(lock):
        return hookstash.entries(root), hookstash.origin(tree, None)


def stash_put_back(
    root: Path, lock: Path, before: tuple[list[hookstash.Entry], hookstash.Origin], tree: Path
) -> bool:
    """The stash list (`refs/stash` is every worktree's, the user's too) as before a check: what the check
    stashed from its tree removed, what it dropped put back, as commit hooks' is kept (git/hookstash.py);
    whether the check had changed it. The hook lock is held at either end, not for the check's whole run:
    checks would run one at a time, and block every serialised commit."""
    entries, started = before
    with locked(lock):
        if hookstash.entries(root) == entries:
            return False
        hookstash.put_back(root, entries, hookstash.origin(tree, None, started))
        return True
