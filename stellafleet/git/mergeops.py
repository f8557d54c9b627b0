"""The git steps of `stella merge`: a scratch worktree on a detached HEAD, rebase or merge there, and
moving the user's branch forward only by a compare-and-swap of its ref plus a safe two-tree checkout.

Nothing here rewrites a fleet branch or force-pushes: the rebased or merged commits exist only in the
scratch worktree until the user's branch is moved to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.git import gitops

# Commits made while merging must not stop for an editor (merge messages, rebase's own prompts).
_NO_EDITOR = {"GIT_EDITOR": "true", "GIT_SEQUENCE_EDITOR": "true", "GIT_MERGE_AUTOEDIT": "no"}


@dataclass(frozen=True)
class StepResult:
    """A rebase or merge in the scratch worktree: the new tip, or the conflicted files and git's words."""

    head: str | None
    conflicts: tuple[str, ...] = ()
    message: str = ""
    conflict_diff: str = ""  # the conflicted files with their markers, as `git diff` shows them


def scratch_worktree(root: Path, path: Path, commit: str) -> None:
    """A linked worktree at path on a detached HEAD at commit (no branch is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    gitops.git("worktree", "add", "-q", "--detach", str(path), commit, cwd=root)


def checkout_detached(path: Path, commit: str) -> None:
    gitops.git("checkout", "-q", "--detach", commit, cwd=path)


def merge_base(root: Path, a: str, b: str) -> str | None:
    out = gitops.git("merge-base", a, b, cwd=root, check=False).strip()
    return out or None


def _conflicted(path: Path) -> tuple[str, ...]:
    out = gitops.git("diff", "--name-only", "--diff-filter=U", cwd=path, check=False)
    return tuple(line for line in out.splitlines() if line)


def _failure(path: Path, args: tuple[str, ...], abort: tuple[str, ...]) -> StepResult:
    retcode, out, err = gitops.git_status(*args, cwd=path, env=_NO_EDITOR)
    if retcode == 0:
        return StepResult(gitops.head_commit(path))
    conflicts = _conflicted(path)
    shown = gitops.git("diff", "--no-color", "--", *conflicts, cwd=path, check=False) if conflicts else ""
    gitops.git(*abort, cwd=path, check=False)
    return StepResult(None, conflicts, gitops.last_words(err or out, retcode).strip(), shown)


def rebase_onto(path: Path, onto: str, upstream: str, tip: str) -> StepResult:
    """Replay upstream..tip onto `onto` on a detached HEAD in path (tip's branch ref is left alone)."""
    return _failure(path, ("rebase", "-q", "--onto", onto, upstream, tip), ("rebase", "--abort"))


def merge_commit(path: Path, tip: str, message: str) -> StepResult:
    """Merge tip into path's detached HEAD with a merge commit (`--no-ff`) carrying message."""
    return _failure(path, ("merge", "-q", "--no-ff", "-m", message, tip), ("merge", "--abort"))


# A dry run's simulated merges are commit objects nobody points at; they need no user identity.
_DRY_RUN_IDENTITY = {
    "GIT_AUTHOR_NAME": "stella merge --dry-run",
    "GIT_AUTHOR_EMAIL": "stella@localhost",
    "GIT_COMMITTER_NAME": "stella merge --dry-run",
    "GIT_COMMITTER_EMAIL": "stella@localhost",
}


def predict_merge(root: Path, tip: str, head: str) -> tuple[str | None, tuple[str, ...] | None]:
    """Whether head merges cleanly onto tip, without a worktree (`git merge-tree --write-tree`): (a
    commit object of the merge to chain the next prediction on, ()) when clean, (None, files) when it
    conflicts, (None, None) when this git cannot tell (before 2.38). Writes objects only, never a ref."""
    args = ("merge-tree", "--write-tree", "--name-only", "--no-messages", tip, head)
    retcode, out, _ = gitops.git_status(*args, cwd=root)
    lines = out.splitlines()
    if retcode == 1 and lines:
        return None, tuple(dict.fromkeys(line for line in lines[1:] if line))
    if retcode != 0 or not lines:
        return None, None
    commit_args = ("commit-tree", lines[0], "-p", tip, "-p", head, "-m", "stella merge --dry-run")
    retcode, out, _ = gitops.git_status(*commit_args, cwd=root, env=_DRY_RUN_IDENTITY)
    return (out.strip() or None) if retcode == 0 else None, ()


def advance_branch(root: Path, branch: str, new: str, old: str) -> None:
    """Move the checked-out branch from old to new (a descendant), ref and work tree together.

    The ref moves by compare-and-swap, so a branch that moved meanwhile is left alone; the tree moves by
    a two-tree read-tree, which refuses (and the ref is put back) rather than overwrite a local change
    or an untracked file."""
    ref = f"refs/heads/{branch}"
    gitops.git("update-ref", "-m", f"stella merge: fast-forward to {new[:12]}", ref, new, old, cwd=root)
    try:
        gitops.git("read-tree", "-m", "-u", old, new, cwd=root)
    except GitError:
        gitops.git("update-ref", "-m", "stella merge: put back", ref, old, new, cwd=root, check=False)
        raise


def patches_upstream(root: Path, upstream: str, head: str) -> bool:
    """True when every commit of head not in upstream has an equivalent patch there (`git cherry`):
    how a branch that was rebased onto upstream still counts as merged."""
    out = gitops.git("cherry", upstream, head, cwd=root, check=False)
    lines = [line for line in out.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("-") for line in lines)


def finish_advance(root: Path, branch: str, old: str, new: str) -> bool:
    """After a merge was killed inside advance_branch: True when the branch's ref had moved to new, and
    now the index and the files follow it too (a two-tree read-tree, which is a no-op when they already
    did); False when the ref had not moved to new (nothing landed: the tree is left as it is).

    A read-tree killed while writing files leaves some of them at new and the index at old (its new index
    was never put in place), and a second read-tree refuses those as local changes. So when it refuses,
    the index entries of the files that already hold new's content are set to new's, and it runs again;
    a file with any other content is a real local change and is still refused."""
    if gitops.ref_commit(root, f"refs/heads/{branch}") != new:
        return False
    retcode, out, err = gitops.git_status("read-tree", "-m", "-u", old, new, cwd=root)
    if retcode != 0:
        if not _adopt_written(root, old, new):
            raise GitError(f"git read-tree -m: {gitops.last_words(err or out, retcode)}")
        gitops.git("read-tree", "-m", "-u", old, new, cwd=root)
    return True


def _adopt_written(root: Path, old: str, new: str) -> bool:
    """Set to new's the index entries of the files old..new changes whose work-tree file already holds
    new's content (what a killed checkout wrote); whether there were any."""
    out = gitops.git("diff-tree", "-r", "-z", "--no-renames", old, new, cwd=root)
    fields = out.split("\0")
    wanted: dict[str, tuple[str, str]] = {}
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        _, mode, _, sha, status = meta.lstrip(":").split(" ")
        full = root / path
        if status != "D" and full.is_file() and not full.is_symlink():
            wanted[path] = (mode, sha)
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
    """Whether a branch at head is verifiably in result: head is an ancestor of it (a merge, a resolve
    that merged it), or every one of its patches is there (a rebase: `git cherry`)."""
    return gitops.is_ancestor(root, head, result) or patches_upstream(root, result, head)
