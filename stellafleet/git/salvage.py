"""Salvage: an unfinished attempt's uncommitted work, kept as a commit on `refs/stella/salvage/...`,
built in a temporary index so the workspace is never touched."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import GitError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.git import bundle, gitops, index

SALVAGE_PREFIX = "refs/stella/salvage"


@dataclass(frozen=True)
class Salvaged:
    ref: str
    sha: str
    files: int  # how many paths differ from the commit it is built on


def salvage_ref(run_id: str, task_id: str, attempt_id: int) -> str:
    return f"{SALVAGE_PREFIX}/{run_id}/{task_id}/{attempt_id}"


def _excluded_unless_ignored(workspace: Path) -> list[str]:
    """stella's directories to exclude from `add -A`, unless ignored (git refuses excluding those)."""
    present = [d for d in EXCLUDED_DIRS if (workspace / d).is_dir()]
    if not present:
        return list(EXCLUDED_DIRS)
    _code, out, _err = gitops.git_status("check-ignore", "--", *present, cwd=workspace)
    ignored = {path.rstrip("/") for path in out.splitlines()}
    return [d for d in EXCLUDED_DIRS if d.rstrip("/") not in ignored]


Entries = tuple[Mapping[str, tuple[str, str]], Sequence[str]]  # (path -> (mode, blob), paths dropped)


def snapshot_tree(
    workspace: Path, head: str, paths: Sequence[str] | None = None, instead: Entries = ({}, ())
) -> str:
    """The tree a salvage of workspace would hold now: head with the workspace's files (all of them, or only
    paths) as they are on disk, but for the entries given instead; built in a temporary index (never
    touching its index or files)."""
    with tempfile.TemporaryDirectory(prefix="stella-salvage-") as scratch:
        index_file = Path(scratch) / "salvage.index"
        env = index.with_index(index_file)
        if paths is not None:
            index.read_tree_into(workspace, index_file, head)
            if paths:
                index.stage_paths(workspace, index_file, list(paths))
                index.set_entries(workspace, index_file, *instead)
            return index.write_tree(workspace, index_file)
        add_all = ("add", "-A", "--", ".", *(f":!{d}" for d in _excluded_unless_ignored(workspace)))
        own = gitops.git_path(workspace, "--git-path", "index")
        if own.is_file():
            # a copy of the worktree's own index: its stat data lets `add -A` hash only what changed
            shutil.copyfile(own, index_file)
            if gitops.git_status(*add_all, cwd=workspace, env=env)[0] == 0:
                return index.write_tree(workspace, index_file)
        index_file.unlink(missing_ok=True)  # no index of its own, or one git cannot use as a copy
        index.read_tree_into(workspace, index_file, head)
        gitops.git(*add_all, cwd=workspace, env=env)
        return index.write_tree(workspace, index_file)


def salvage(
    workspace: Path,
    ref: str,
    *,
    paths: Sequence[str] | None = None,
    message: str,
    instead: Entries = ({}, ()),
) -> Salvaged | None:
    """Commit the workspace's uncommitted work (paths None: all; instead: entries to take for some of
    paths) on ref over HEAD; None: nothing new."""
    head = gitops.ref_commit(workspace, "HEAD")
    if head is None:
        return None  # an unborn branch: nothing to build on (stella refuses such repositories anyway)
    tree = snapshot_tree(workspace, head, paths, instead)
    if tree == index.tree_of(workspace, head):
        return None
    try:
        sha = index.commit_tree(workspace, tree, head, message=message)
    except GitError:  # most often no user.name/user.email: the work is kept all the same, under stella's
        sha = index.commit_tree(workspace, tree, head, message=message, env=gitops.identity("stella salvage"))
    gitops.git("update-ref", "-m", "stella salvage", ref, sha, "", cwd=workspace)  # create only
    changed = gitops.git_fields(
        "diff-tree", "-r", "-z", "--name-only", "--no-commit-id", head, sha, cwd=workspace
    )
    return Salvaged(ref, sha, len(changed))


@dataclass(frozen=True)
class SalvageRef:
    ref: str
    sha: str
    created_s: int  # the commit's committer time

    @property
    def parts(self) -> tuple[str, str, str]:
        """(run id, task id, attempt id) from the ref's name."""
        run_id, _, rest = self.ref.removeprefix(SALVAGE_PREFIX + "/").partition("/")
        task_id, _, attempt = rest.rpartition("/")
        return run_id, task_id, attempt


def salvage_refs(root: Path, run_id: str | None = None) -> list[SalvageRef]:
    """Every salvage ref (of one run), oldest first."""
    prefix = f"{SALVAGE_PREFIX}/{run_id}/" if run_id else f"{SALVAGE_PREFIX}/"
    out = gitops.git(
        "for-each-ref", "--sort=committerdate", "--format=%(refname)%00%(objectname)%00%(committerdate:unix)",
        prefix, cwd=root,
    )  # fmt: skip
    listed = (line.split("\0") for line in out.splitlines())
    return [SalvageRef(ref, sha, int(when or 0)) for ref, sha, when in listed]


def latest_salvage(root: Path, run_id: str, task_id: str) -> SalvageRef | None:
    """The newest salvage of one task of a run (the highest attempt id), or None."""
    mine = [s for s in salvage_refs(root, run_id) if s.parts[1] == task_id and s.parts[2].isdigit()]
    return max(mine, key=lambda s: int(s.parts[2])) if mine else None


def still_in_tree(root: Path, sha: str, paths: Sequence[str]) -> list[str]:
    """Those of paths whose work-tree file is what salvage commit sha holds: an attempt's leftovers."""
    if not paths:
        return []
    kept = index.tree_entries(root, sha, paths)
    here = [path for path in paths if path in kept and (root / path).is_file()]
    blobs = gitops.git("hash-object", "--", *here, cwd=root).split() if here else []
    return [path for path, blob in zip(here, blobs, strict=True) if kept[path][1] == blob]


def delete_salvage(root: Path, ref: SalvageRef) -> None:
    """Delete one salvage ref, only if it still points where it was listed."""
    gitops.git("update-ref", "-d", ref.ref, ref.sha, cwd=root)


def older_than(
    refs: Sequence[SalvageRef], days: float | None, *, now_s: float | None = None
) -> list[SalvageRef]:
    if days is None:
        return list(refs)
    cutoff = (time.time() if now_s is None else now_s) - days * 86400
    return [ref for ref in refs if ref.created_s < cutoff]


def held_elsewhere(root: Path, branch: str) -> int:
    """How many of branch's commits no other local branch or salvage ref holds (0: safe to delete)."""
    out = gitops.git(
        "rev-list", "--count", f"refs/heads/{branch}", "--not", f"--exclude={branch}", "--branches",
        f"--glob={SALVAGE_PREFIX}/*", cwd=root,
    )  # fmt: skip
    return int(out.strip() or 0)


def unbranched_ancestors(root: Path, sha: str) -> int:
    """How many commits under a salvage commit (its own excluded) no local branch holds: a branch deleted
    because this salvage held its commits has them here alone."""
    out = gitops.git("rev-list", "--count", f"{sha}^@", "--not", "--branches", cwd=root)
    return int(out.strip() or 0)


def holds_worktree(root: Path, worktree: Path, run_id: str, task_id: str) -> SalvageRef | None:
    """The task's latest salvage when it holds exactly what the worktree holds now, else None."""
    latest = latest_salvage(root, run_id, task_id)
    head = gitops.ref_commit(worktree, "HEAD")
    if latest is None or head is None:
        return None
    try:
        now = snapshot_tree(worktree, head)
    except GitError:
        return None
    return latest if now == index.tree_of(root, latest.sha) else None


def bundle_salvage(workspace: Path, saved: Salvaged, out: Path) -> None:
    """A bundle at out of the salvage commit alone, its ref then gone from workspace's repository."""
    try:
        bundle.create_ref(workspace, saved.ref, f"{saved.sha}^", out)
    finally:
        gitops.git("update-ref", "-d", saved.ref, saved.sha, cwd=workspace, check=False)


def leftovers(root: Path, paths: Sequence[str]) -> dict[str, SalvageRef]:
    """Of paths (changed in root's work tree), those whose file holds exactly what an unfinished attempt's
    salvage commit holds: that attempt's leftovers, each by the newest salvage holding it."""
    here = [path for path in paths if "\n" not in path and (root / path).is_file()]
    refs = salvage_refs(root)[::-1]  # newest first
    if not here or not refs:
        return {}
    blobs = dict(zip(here, gitops.git("hash-object", "--", *here, cwd=root).split(), strict=True))
    asked = [(ref, path) for ref in refs for path in here]
    lines = "".join(f"{ref.sha}:{path}\n" for ref, path in asked)
    out = gitops.git("cat-file", "--batch-check=%(objectname)", cwd=root, stdin=lines).splitlines()
    found: dict[str, SalvageRef] = {}
    for (ref, path), line in zip(asked, out, strict=True):
        if path not in found and line.split()[0] == blobs[path]:
            found[path] = ref
    return found


def leftovers_said(found: Mapping[str, SalvageRef]) -> str:
    """`a.txt, b.txt: left by task t1 of run r-X when its attempt 2 ended unfinished (salvaged as REF)`."""
    by_ref: dict[SalvageRef, list[str]] = {}
    for path, ref in sorted(found.items()):
        by_ref.setdefault(ref, []).append(path)
    return "; ".join(
        f"{', '.join(paths)}: left by task {ref.parts[1]} of run {ref.parts[0]} when its attempt "
        f"{ref.parts[2]} ended unfinished (salvaged as {ref.ref})"
        for ref, paths in by_ref.items()
    )


def put_back(root: Path, paths: Sequence[str]) -> None:
    """paths as HEAD has them, in the index and the work tree (a path HEAD lacks: gone from both)."""
    tracked = set(index.tree_entries(root, "HEAD", paths))
    tracked.update(gitops.git_fields("--literal-pathspecs", "ls-files", "-z", "--", *paths, cwd=root))
    if tracked:
        restore = ("--literal-pathspecs", "restore", "--source=HEAD", "--staged", "--worktree", "--")
        gitops.git(*restore, *sorted(tracked), cwd=root)
    for path in paths:
        if path not in tracked:
            (root / path).unlink(missing_ok=True)
