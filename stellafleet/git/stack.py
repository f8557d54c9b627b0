"""A stacked start: the pinned base plus the work of a task's dependencies, built as commit objects
(`git merge-tree --write-tree`, `git commit-tree`) without touching any work tree or index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.git import gitops, index, mergeops


@dataclass(frozen=True)
class Contribution:
    """One dependency's work: an isolated task's branch tip, or a shared task's commits in order."""

    task_id: str
    tip: str | None = None
    commits: tuple[str, ...] = ()

    @property
    def head(self) -> str | None:
        """The commit of it the start takes last (None: a shared task that committed nothing)."""
        return self.tip or (self.commits[-1] if self.commits else None)


@dataclass(frozen=True)
class Conflict:
    """Two parents change the same paths differently: no start commit can hold both."""

    left: str
    right: str
    paths: tuple[str, ...]

    def __str__(self) -> str:
        more = f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else ""
        return f"parents {self.left} and {self.right} both change {', '.join(self.paths[:5])}{more}"


@dataclass(frozen=True)
class _Commit:
    tree: str
    first_parent: str | None
    date: str  # raw: seconds and zone, as git reads it back
    message: str


def build_start(root: Path, base: str, parts: Sequence[Contribution]) -> str | Conflict:
    """base with every part's work on it, in order; a Conflict naming the two parents and the paths."""
    named = [commit for part in parts for commit in ((part.tip,) if part.tip else part.commits) if commit]
    known = _commits(root, [base, *named])  # one git call for all (a fan-in of 50 is 50 tips)
    tips = [part.tip for part in parts if part.tip]
    # a tip another tip (or the base) holds adds nothing: a chain's start is its last link, at once
    needed = (
        set(gitops.git("merge-base", "--independent", base, *tips, cwd=root).split())
        if len(tips) > 1
        else set(tips)
    )
    head, head_tree = base, known[base].tree
    merged: list[Contribution] = []
    for part in parts:
        if part.tip and part.tip not in needed:
            continue
        picks = [(part.tip, None)] if part.tip else [(c, known[c].first_parent) for c in part.commits]
        for commit, picked_onto in picks:
            result = _apply(root, (head, head_tree), commit, known[commit], picked_onto, part.task_id)
            if isinstance(result[1], tuple):
                return Conflict(_who_changed(root, base, merged, result[1]) or "?", part.task_id, result[1])
            head, head_tree = result[0], result[1]
        merged.append(part)
    return head


def _commits(root: Path, shas: Sequence[str]) -> dict[str, _Commit]:
    unique = list(dict.fromkeys(shas))
    fields = "%H%x1f%T%x1f%P%x1f%cd%x1f%B"
    records = gitops.git_fields(
        "log", "-z", "--no-walk=unsorted", "--date=raw", f"--format={fields}", *unique, cwd=root
    )
    found = {}
    for record in records:
        sha, tree, parents, date, message = record.split("\x1f", 4)
        found[sha] = _Commit(tree, parents.split()[0] if parents else None, date, message)
    return found


def _apply(
    root: Path, head: tuple[str, str], commit: str, info: _Commit, picked_onto: str | None, task_id: str
) -> tuple[str, str] | tuple[None, tuple[str, ...]]:
    """(commit, tree) of head with commit's work: a fast-forward when it can be, else a merge (or, with
    picked_onto, the change picked_onto..commit alone); (None, the conflicted paths) when it cannot be."""
    sha, tree = head
    if picked_onto == sha:
        return commit, info.tree  # the next commit on head: no pick needed
    # One identity and dates taken from the inputs: the same work of the same parents is the same commit.
    env = {**gitops.identity("stella"), "GIT_AUTHOR_DATE": info.date, "GIT_COMMITTER_DATE": info.date}
    ours = sha
    if picked_onto is not None:  # a commit of head's tree on picked_onto: their merge base is picked_onto
        ours = index.commit_tree(root, tree, picked_onto, message="stella: pick base", env=env)
    merged, conflicts = mergeops.merge_tree(root, ours, commit)
    if merged is None:
        return None, conflicts
    if merged == tree:
        return head  # its change is in head already
    if picked_onto is None and merged == info.tree and gitops.is_ancestor(root, sha, commit):
        return commit, info.tree  # a fast-forward: head is in it
    if picked_onto is not None:
        return index.commit_tree(root, merged, sha, message=info.message.rstrip("\n"), env=env), merged
    message = f"stella: start with the work of {task_id}"
    return index.commit_tree(root, merged, sha, commit, message=message, env=env), merged


def _who_changed(root: Path, base: str, merged: Sequence[Contribution], paths: Sequence[str]) -> str | None:
    """The first merged part whose work changes one of paths (asked only once a merge conflicts)."""
    for part in merged:
        commits = (part.tip,) if part.tip is not None else part.commits
        for commit in commits:
            assert commit is not None
            since = base if part.tip is not None else f"{commit}^"
            args = ("--literal-pathspecs", "diff", "--name-only", "--no-renames", since, commit, "--", *paths)
            changed = gitops.git(*args, cwd=root)  # paths, not patterns: `a*.txt` is that file alone
            if changed.strip():
                return part.task_id
    return None
