"""The git steps of `stella merge`: rebase or merge in a scratch worktree, then move the branch safely."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, index

# Commits made while merging must not stop for an editor (merge messages, rebase's own prompts).
_NO_EDITOR = {"GIT_EDITOR": "true", "GIT_SEQUENCE_EDITOR": "true", "GIT_MERGE_AUTOEDIT": "no"}


@dataclass(frozen=True)
class StepResult:
    """A rebase or merge in the scratch worktree: the new tip, or the conflicted files and git's words."""

    head: str | None
    conflicts: tuple[str, ...] = ()
    message: str = ""
    conflict_diff: str = ""  # the conflicted files with their markers, as `git diff` shows them


def checkout_detached(path: Path, commit: str) -> None:
    gitops.git("checkout", "-q", "--detach", commit, cwd=path)


def merge_base(root: Path, a: str, b: str) -> str | None:
    out = gitops.git("merge-base", a, b, cwd=root, check=False).strip()
    return out or None


def _failure(path: Path, args: tuple[str, ...], abort: tuple[str, ...]) -> StepResult:
    retcode, out, err = gitops.git_status(*args, cwd=path, env=_NO_EDITOR)
    if retcode == 0:
        return StepResult(gitops.head_commit(path))
    conflicts = tuple(gitops.conflicted_paths(path))
    shown = (
        gitops.git("--literal-pathspecs", "diff", "--no-color", "--", *conflicts, cwd=path, check=False)
        if conflicts
        else ""
    )
    gitops.git(*abort, cwd=path, check=False)
    return StepResult(None, conflicts, gitops.last_words(err or out, retcode).strip(), shown)


def rebase_upstream(root: Path, onto: str, head: str, start: str | None = None) -> str:
    """Where head's own commits begin, for a rebase onto `onto`: a stacked branch's recorded start once onto
    holds that start's work (its parents landed before it, rebased: their original commits would replay
    again), else head's merge base with onto."""
    if start and gitops.is_ancestor(root, start, head) and contains(root, onto, start):
        return start
    return merge_base(root, onto, head) or onto


def landed_as_other_commits(root: Path, onto: str, head: str, start: str | None) -> str | None:
    """A stacked branch's recorded start when onto holds its parents' work as other commits (they landed
    rebased), so only start..head is the branch's own to merge; else None."""
    if (
        start
        and not gitops.is_ancestor(root, start, onto)
        and rebase_upstream(root, onto, head, start) == start
    ):
        return start
    return None


def rebase_onto(path: Path, onto: str, upstream: str, tip: str) -> StepResult:
    """Replay upstream..tip onto `onto` on a detached HEAD in path (tip's branch ref is left alone)."""
    return _failure(path, ("rebase", "-q", "--onto", onto, upstream, tip), ("rebase", "--abort"))


def merge_commit(path: Path, tip: str, message: str) -> StepResult:
    """Merge tip into path's detached HEAD with a merge commit (`--no-ff`) carrying message."""
    return _failure(path, ("merge", "-q", "--no-ff", "-m", message, tip), ("merge", "--abort"))


def merge_from(path: Path, onto: str, upstream: str, tip: str, message: str) -> StepResult:
    """A merge commit of tip onto `onto` whose tree is onto with upstream..tip alone: a stacked branch whose
    parents landed as other (rebased) commits, so their original commits in tip must not merge again."""
    rebased = rebase_onto(path, onto, upstream, tip)
    if rebased.head is None:
        return rebased
    merged = index.commit_tree(path, index.tree_of(path, rebased.head), onto, tip, message=message)
    checkout_detached(path, merged)
    return StepResult(merged)


def merge_tree(root: Path, ours: str, theirs: str) -> tuple[str | None, tuple[str, ...]]:
    """`git merge-tree` of two commits: (the merged tree, ()), or (None, the conflicted paths); GitError
    when git cannot tell (before 2.38)."""
    args = ("merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", ours, theirs)
    retcode, out, err = gitops.git_status(*args, cwd=root)
    lines = [field for field in out.split("\0") if field]  # -z: a path git would quote stays as it is
    if retcode == 1 and lines:
        return None, tuple(dict.fromkeys(line for line in lines[1:] if line))
    if retcode != 0 or not lines:
        raise GitError(f"git merge-tree: {gitops.last_words(err or out, retcode)}")
    return lines[0], ()


def predict_merge(
    root: Path, tip: str, head: str, own_from: str | None = None
) -> tuple[str | None, tuple[str, ...] | None]:
    """Whether head (its work from own_from on, when given: landed_as_other_commits) merges onto tip:
    (commit, ()), (None, conflicts), or (None, None) when this git cannot tell (before 2.38)."""
    # A dry run's simulated merge is a commit object nobody points at; it needs no user identity.
    dry_run = "stella merge --dry-run"
    try:
        ours = tip
        if own_from is not None:  # tip's tree on own_from: their merge base is where head's own work begins
            ours = index.commit_tree(
                root, index.tree_of(root, tip), own_from, message=dry_run, env=gitops.identity(dry_run)
            )
        tree, conflicts = merge_tree(root, ours, head)
    except GitError:
        return None, None
    if tree is None:
        return None, conflicts
    try:
        return index.commit_tree(root, tree, tip, head, message=dry_run, env=gitops.identity(dry_run)), ()
    except GitError:
        return None, ()


def move_worktree_onto(worktree: Path, tip: str) -> str:
    """A task's worktree moved onto tip (an evicted branch back to its task): its branch rebased when that is
    clean, else reset to tip with the branch's work applied and its conflicts left in the files; which of the
    two, in words."""
    old = gitops.head_commit(worktree)
    retcode, _, _ = gitops.git_status("rebase", "-q", tip, cwd=worktree, env={"GIT_EDITOR": "true"})
    if retcode == 0:
        return f"rebased onto {tip[:12]}"
    gitops.git("rebase", "--abort", cwd=worktree, check=False)
    gitops.git("reset", "-q", "--hard", tip, cwd=worktree)
    gitops.git("merge", "--squash", "-q", old, cwd=worktree, check=False)  # conflicts stay in the files
    return f"set on {tip[:12]} with its work {old[:12]} applied and the conflicts left"


def advance_branch(root: Path, branch: str, new: str, old: str) -> None:
    """Move the checked-out branch from old to new by compare-and-swap and a two-tree read-tree."""
    ref = f"refs/heads/{branch}"
    gitops.git("update-ref", "-m", f"stella merge: fast-forward to {new[:12]}", ref, new, old, cwd=root)
    try:
        gitops.git("read-tree", "-m", "-u", old, new, cwd=root)
    except GitError:
        gitops.git("update-ref", "-m", "stella merge: put back", ref, old, new, cwd=root, check=False)
        raise


def finish_advance(root: Path, branch: str, old: str, new: str) -> bool:
    """After a merge killed inside advance_branch: finish it when the ref had moved to new (True)."""
    if gitops.ref_commit(root, f"refs/heads/{branch}") != new:
        return False
    retcode, out, err = gitops.git_status("read-tree", "-m", "-u", old, new, cwd=root)
    if retcode != 0:
        if not _adopt_written(root, old, new):
            raise GitError(f"git read-tree -m: {gitops.last_words(err or out, retcode)}")
        gitops.git("read-tree", "-m", "-u", old, new, cwd=root)
    return True


def _adopt_written(root: Path, old: str, new: str) -> bool:
    """Set to new's the index entries of files old..new changes that already hold new's content."""
    changed = gitops.git_fields("diff-tree", "-r", "-z", "--name-only", "--no-renames", old, new, cwd=root)
    files = [path for path in changed if (root / path).is_file() and not (root / path).is_symlink()]
    wanted = index.tree_entries(root, new, files) if files else {}  # a deleted file is in no tree of new
    if not wanted:
        return False
    stdin = "".join(f"{path}\n" for path in wanted)
    hashes = gitops.git("hash-object", "--stdin-paths", cwd=root, stdin=stdin).split()
    written = [
        (path, entry) for (path, entry), sha in zip(wanted.items(), hashes, strict=True) if sha == entry[1]
    ]
    if not written:
        return False
    info = "".join(f"{mode} {sha}\t{path}\n" for path, (mode, sha) in written)
    gitops.git("update-index", "--index-info", cwd=root, stdin=info)
    return True


def contains(root: Path, result: str, head: str) -> bool:
    """Whether a branch at head is in result: an ancestor of it, or its changes are all there."""
    return gitops.is_ancestor(root, head, result) or changes_held(root, result, head)


def changes_held(root: Path, result: str, head: str) -> bool:
    """Whether result already holds head's changes: merging head into it would change nothing. Unlike patch
    ids (`git cherry`), this survives a rebase that changed a change's context (another branch's edit within
    three lines of it); a git before 2.38 falls back to `git cherry`."""
    try:
        tree, _ = merge_tree(root, result, head)
    except GitError:
        out = gitops.git("cherry", result, head, cwd=root, check=False)
        lines = [line for line in out.splitlines() if line.strip()]
        return bool(lines) and all(line.startswith("-") for line in lines)
    return tree is not None and tree == index.tree_of(root, result)


def changed_between(root: Path, start: str, tip: str) -> tuple[str, ...]:
    """The paths start..tip changes (a rename: both names), as the merge train compares branches by."""
    return tuple(gitops.git_fields("diff", "-z", "--name-only", start, tip, cwd=root))


def landed_with(root: Path, base: str, tip: str, paths: tuple[str, ...] = (), limit: int = 10) -> list[str]:
    """`SHA title` of the newest commits base..tip (touching paths, when given): what an evicted branch
    conflicts or fails with."""
    args = ("--literal-pathspecs", "log", "-z", f"-{limit}", "--format=%h %s", f"{base}..{tip}", "--", *paths)
    return gitops.git_fields(*args, cwd=root)
