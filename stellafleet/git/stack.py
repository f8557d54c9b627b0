"""A stacked start: the pinned base plus the work of a task's dependencies, built as commit objects
(`git merge-tree --write-tree`, `git commit-tree`) without touching any work tree or index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops

# One identity and dates taken from the inputs: the same work of the same parents is the same commit.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "stella",
    "GIT_AUTHOR_EMAIL": "stella@localhost",
    "GIT_COMMITTER_NAME": "stella",
    "GIT_COMMITTER_EMAIL": "stella@localhost",
}


@dataclass(frozen=True)
class Contribution:
    """One dependency's work: an isolated task's branch tip, or a shared task's commits in order."""

    task_id: str
    tip: str | None = None
    commits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Conflict:
    """Two parents change the same paths differently: no start commit can hold both."""

    left: str
    right: str
    paths: tuple[str, ...]

    def __str__(self) -> str:
        shown = ", ".join(self.paths[:5]) + (
            f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else ""
        )
        return f"parents {self.left} and {self.right} both change {shown}"


def build_start(root: Path, base: str, parts: Sequence[Contribution]) -> str | Conflict:
    """base with every part's work on it, in order; a Conflict naming the two parents and the paths."""
    head = base
    merged: list[Contribution] = []
    for part in parts:
        steps = [(part.tip, None)] if part.tip is not None else _picks(root, part.commits)
        for commit, picked_onto in steps:
            assert commit is not None
            result = _apply(root, head, commit, picked_onto, part.task_id)
            if isinstance(result, tuple):
                return Conflict(_who_changed(root, base, merged, result) or "?", part.task_id, result)
            head = result
        merged.append(part)
    return head


def _picks(root: Path, commits: Sequence[str]) -> list[tuple[str | None, str | None]]:
    """Each commit with its first parent (what its change is measured from)."""
    if not commits:
        return []
    lines = gitops.git("rev-list", "--no-walk=unsorted", "--parents", *commits, cwd=root).splitlines()
    return [(fields[0], fields[1] if len(fields) > 1 else None) for fields in map(str.split, lines)]


def _apply(
    root: Path, head: str, commit: str, picked_onto: str | None, task_id: str
) -> str | tuple[str, ...]:
    """head with commit's work: a fast-forward when it can be, else a merge (or, with picked_onto, the
    change picked_onto..commit alone); the conflicted paths when it cannot be."""
    forward = gitops.git("merge-base", head, commit, cwd=root, check=False).strip()
    if forward == commit:
        return head  # already in it
    if forward == head and picked_onto in (None, head):
        return commit
    stamp = _date(root, commit)
    env = {**_IDENTITY, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    ours, tree = head, gitops.git("rev-parse", f"{head}^{{tree}}", cwd=root).strip()
    if picked_onto is not None:  # a commit of head's tree on picked_onto: their merge base is picked_onto
        ours = _commit_tree(root, tree, (picked_onto,), "stella: pick base", env)
    args = ("merge-tree", "--write-tree", "--name-only", "--no-messages", ours, commit)
    retcode, out, err = gitops.git_status(*args, cwd=root)
    lines = out.splitlines()
    if retcode == 1 and lines:
        return tuple(dict.fromkeys(line for line in lines[1:] if line))
    if retcode != 0 or not lines:
        raise GitError(f"git merge-tree: {gitops.last_words(err or out, retcode)}")
    if lines[0] == tree:
        return head  # its change is in head already
    if picked_onto is not None:
        message = gitops.git("log", "-1", "--format=%B", commit, cwd=root)
        return _commit_tree(root, lines[0], (head,), message, env)
    return _commit_tree(root, lines[0], (head, commit), f"stella: start with the work of {task_id}", env)


def _date(root: Path, commit: str) -> str:
    return gitops.git("log", "-1", "--format=%cd", "--date=raw", commit, cwd=root).strip()


def _commit_tree(root: Path, tree: str, parents: Sequence[str], message: str, env: dict[str, str]) -> str:
    args = ["commit-tree", tree, *(arg for parent in parents for arg in ("-p", parent)), "-F", "-"]
    return gitops.git(*args, cwd=root, env=env, stdin=message.rstrip("\n") + "\n").strip()


def _who_changed(root: Path, base: str, merged: Sequence[Contribution], paths: Sequence[str]) -> str | None:
    """The first merged part whose work changes one of paths (asked only once a merge conflicts)."""
    for part in merged:
        commits = (part.tip,) if part.tip is not None else part.commits
        for commit in commits:
            assert commit is not None
            since = base if part.tip is not None else f"{commit}^"
            changed = gitops.git("diff", "--name-only", "--no-renames", since, commit, "--", *paths, cwd=root)
            if changed.strip():
                return part.task_id
    return None
