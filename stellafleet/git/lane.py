"""A worker's commit of exactly its own paths, through the commit lane in the shared tree.

The paths are staged in a private index seeded from HEAD, so nothing the user (or another worker) has
staged is swept in, and the repository's commit hooks run on exactly them (hooks.py); the commit is then
built in another private index on the HEAD of the moment, and HEAD moves by compare-and-swap, so a commit
never lands on top of a HEAD it did not see. Only the committed paths' entries of the real index are
updated, so `git status` shows them clean while every other staged or unstaged change stays exactly as it
was; the real index is touched only for that final update, under git's own index.lock, held for an
instant (indexlock.py). A commit is recorded in the ledger whenever HEAD moved, even when its `stella
commit` was killed halfway, and whatever a killed one left is cleaned up by the next stella command
(lanejournal.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stellafleet.core.errors import GitError, StellaError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import dirty, gitops, index, indexlock, lanejournal, scratch, submodules
from stellafleet.git import hooks as hooks_mod
from stellafleet.git.indexlock import IndexLock
from stellafleet.git.lanejournal import Pending
from stellafleet.state.claims import ClaimStore, Holder

HEAD_RETRIES = 20  # builds of one commit under the lock, when HEAD moves by something that takes none
OPTIMISTIC_S = 5.0  # how long a commit is built without the lock while other commits keep landing


def commit_paths(
    ctx: WorkerContext, paths: Sequence[str], message: str, *, lane_timeout: float = 60.0
) -> str:
    """Commit exactly these workspace paths (deleted ones as deletions) for ctx's attempt; returns the SHA."""
    if not message.strip():
        raise StellaError("a commit needs a message")
    workspace = Path(ctx.workspace)
    relpaths = confine_paths(workspace, paths)
    submodules.refuse_inside(workspace, relpaths)
    reflog = f"stella: task {ctx.task_id}"
    run_hooks = ctx.commit_hooks == "run"
    with scratch.directory("stella-commit-") as tmp:  # locked while this process lives: swept after
        # in the shared tree, a file the user had changed when the run started: the worker's changes only
        snapshot = dirty.load(ctx.root, ctx.run_id) if ctx.shared else {}
        contents = dirty.worker_entries(workspace, relpaths, snapshot) if snapshot else {}
        staging = functools.partial(
            stage, workspace, relpaths, message, Path(tmp), hooks=run_hooks, contents=contents
        )
        if not ctx.shared:
            # An isolated worktree has one writer: no lane, no claims.
            staged = staging()
            sha = commit_in_workspace(workspace, staged, reflog=reflog)
            lanejournal.record(ctx.paths.fleet_db, workspace, _pending(ctx, sha, staged))
        else:
            gitops.refuse_detached_head(workspace, allowed=ctx.allow_detached)  # detached since the start?
            sha = _commit_shared(ctx, workspace, relpaths, staging, reflog, lane_timeout)
    if run_hooks:
        hooks_mod.run_post_commit(workspace, relpaths)
    return sha


def _commit_shared(
    ctx: WorkerContext,
    workspace: Path,
    paths: Sequence[str],
    staging: Callable[[], Staged],
    reflog: str,
    lane_timeout: float,
) -> str:
    """The shared tree's commit: the claims first, then the staging and its hooks (outside the lane, which
    is held only to build the commit and put it on HEAD), then the lane."""
    journal = ctx.paths.private / lanejournal.JOURNAL_NAME
    record = functools.partial(lanejournal.record, ctx.paths.fleet_db, workspace)
    with ClaimStore.open(ctx.paths.store_db) as store:
        holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id, worker_pid(ctx))
        # Only the attempt's own paths: a path another live worker holds fails here, by name.
        store.acquire(paths, holder)
        staged = staging()
        # The lane belongs to this process, not to the worker: a killed `stella commit` frees it at once.
        lane_holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id)
        with store.commit_lane(lane_holder, timeout=lane_timeout):
            indexlock.remove_dead_leftovers(indexlock.index_file(workspace))
            lanejournal.finish(workspace, journal, record)

            def journal_it(sha: str, before: Mapping[str, tuple[str, str]]) -> None:
                lanejournal.write(journal, _pending(ctx, sha, staged, before))

            try:
                sha = commit_in_workspace(
                    workspace,
                    staged,
                    reflog=reflog,
                    before_head_moves=journal_it,
                    on_branch=not ctx.allow_detached,
                )
            except BaseException:
                # HEAD did not move (or, past the compare-and-swap, it did: then record it all the same)
                lanejournal.finish(workspace, journal, record)
                raise
            record(_pending(ctx, sha, staged))
            lanejournal.clear(journal)
    settle_index(workspace, staged.paths)
    return sha


SETTLE_CHECKS_S = (0.05, 0.2)


def settle_index(workspace: Path, paths: Sequence[str]) -> None:
    """Put back index entries a racing `git commit` wrote over, for a moment after the commit.

    `git commit` reads the index before it takes index.lock and may write that copy back: one that read it
    just before this commit's index was installed can undo the entries of these paths, and the user's
    next commit would then delete them. Checked twice, and repaired while HEAD still has these paths as
    committed; git's own index writers share this race with `git commit`."""
    for delay in SETTLE_CHECKS_S:
        time.sleep(delay)
        head = gitops.ref_commit(workspace, "HEAD")
        if head is None:
            return
        committed = index.tree_entries(workspace, head, paths)
        if index.index_entries(workspace, paths) == committed:
            continue
        with contextlib.suppress(GitError), IndexLock.held(workspace, timeout=1.0) as lock:
            if index.index_entries(workspace, paths) != committed:
                lock.match_head(paths)


def worker_pid(ctx: WorkerContext) -> int:
    """The worker process of ctx's attempt: this process, or its topmost ancestor in the same attempt.

    `stella commit` run by a command pipeline is a short-lived child of the worker; claims it takes must
    belong to the worker, or they would go stale the moment the command exits.
    """
    wanted = {key: ctx.to_env()[key] for key in ("STELLA_RUN_ID", "STELLA_ATTEMPT_ID")}
    pid = os.getpid()
    try:
        parent = psutil.Process(pid).parent()
        while parent is not None and all(parent.environ().get(k) == v for k, v in wanted.items()):
            pid = parent.pid
            parent = parent.parent()
    except psutil.Error:
        pass  # an ancestor we may not inspect: the last one we could is the best answer
    return pid


def confine_paths(workspace: Path, paths: Sequence[str]) -> list[str]:
    """Workspace-relative POSIX spellings of paths; StellaError for anything outside it or not a file."""
    if not paths:
        raise StellaError("nothing to commit: name the files to commit")
    root = workspace.resolve()
    result: list[str] = []
    for given in paths:
        text = given.replace("\\", "/").strip()
        candidate = Path(text)
        if candidate.is_absolute():
            try:
                text = candidate.resolve().relative_to(root).as_posix()
            except ValueError:
                raise StellaError(f"cannot commit {given!r}: it is outside the workspace {root}") from None
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if not parts or ".." in parts:
            raise StellaError(f"cannot commit {given!r}: paths must stay inside the workspace")
        rel = "/".join(parts)
        if parts[0] == ".git" or any(rel.startswith(excluded) for excluded in EXCLUDED_DIRS):
            raise StellaError(f"cannot commit {given!r}: it is repository or stella state, not work")
        full = root / rel
        if not full.parent.resolve().is_relative_to(root):
            raise StellaError(f"cannot commit {given!r}: it leads outside the workspace through a symlink")
        # a directory holding a repository of its own is a submodule: committed as its pointer (gitlink)
        if full.is_dir() and not full.is_symlink() and not (full / ".git").exists():
            raise StellaError(f"cannot commit {given!r}: it is a directory; name the files in it")
        if rel not in result:
            result.append(rel)
    return result


@dataclass(frozen=True)
class Staged:
    """What a commit puts on HEAD: these paths' entries (absent ones as deletions), and its message."""

    paths: tuple[str, ...]
    entries: Mapping[str, tuple[str, str]]
    message: str

    @property
    def gone(self) -> list[str]:
        return [path for path in self.paths if path not in self.entries]


def stage(
    workspace: Path,
    paths: Sequence[str],
    message: str,
    scratch: Path,
    *,
    hooks: bool = True,
    contents: Mapping[str, tuple[str, str]] | None = None,
) -> Staged:
    """The paths as the work tree has them (or, for those in contents, those entries), staged in a private
    index on HEAD, and the repository's pre-commit and commit-msg hooks run on them (hooks.py)."""
    old = gitops.ref_commit(workspace, "HEAD")
    missing = [path for path in paths if not os.path.lexists(workspace / path)]
    known = index.tree_entries(workspace, old, missing) if old and missing else {}
    unknown = [path for path in missing if path not in known]
    if unknown:
        raise StellaError(f"cannot commit {', '.join(unknown)}: no such file in the workspace or in HEAD")
    index_file = scratch / "index"
    index.read_tree_into(workspace, index_file, old)
    index.stage_paths(workspace, index_file, [p for p in paths if p not in (contents or {})])
    if contents:
        index.set_entries(workspace, index_file, contents, [])
    installed = hooks_mod.installed(workspace) if hooks else []
    if "pre-commit" in installed:
        hooks_mod.run_pre_commit(workspace, index_file, paths)  # HookFailed: nothing committed
    entries = index.file_entries(workspace, index_file, paths)  # a hook may have staged more of them
    if "commit-msg" in installed:
        message = hooks_mod.run_commit_msg(workspace, index_file, message, scratch, paths)
    return Staged(tuple(paths), entries, message)


def commit_in_workspace(
    workspace: Path,
    staged: Staged,
    *,
    reflog: str,
    before_head_moves: Callable[[str, Mapping[str, tuple[str, str]]], None] | None = None,
    on_branch: bool = False,  # refused if HEAD is detached when it would move: _installable
) -> str:
    """HEAD + exactly the staged entries as one new commit on HEAD, by compare-and-swap; returns its SHA.

    Commit and index update are built aside; index.lock is held only to install the index and move HEAD
    (indexlock.py), so the user's commit cannot land in between. The index changes first: git reading the
    new HEAD reads the new index, git that read the old HEAD fails its own compare-and-swap. The lane's
    journal, before_head_moves(sha, the paths' index entries before), runs just before. A HEAD moved
    meanwhile (the user's `git commit`) gets the commit rebuilt on it, of this attempt's paths only."""
    moved: GitError | None = None
    ahead: _Ahead | None = None
    mover: index.HeadMove | None = None  # started ahead: under the lock, only the move itself is left
    journal = before_head_moves or (lambda sha, before: None)
    real = indexlock.index_file(workspace)
    optimistic_until = time.monotonic() + OPTIMISTIC_S
    tries = 0
    try:
        while tries < HEAD_RETRIES:
            # Built without the lock, onto HEAD and the real index as they are, until neither moved from
            # the start of a catch-up to its end; past OPTIMISTIC_S, built under it (not overtaken again).
            optimistic = time.monotonic() < optimistic_until
            mover = mover or index.HeadMove(workspace, reflog)
            if optimistic:
                ahead = _catch_up(workspace, staged, ahead, real)
                if not _settled(workspace, ahead, real):
                    continue
                journal(ahead.new, ahead.update.before)
            tries += not optimistic
            with IndexLock.held(workspace) as lock:
                if optimistic and ahead is not None and not _settled(workspace, ahead, real):
                    continue
                if not optimistic:
                    ahead = _current(workspace, staged, lock, ahead)
                    journal(ahead.new, ahead.update.before)
                ahead = _installable(workspace, real, ahead, on_branch)
                lock.install(ahead.update)
                move, mover = mover, None
                try:
                    move.move(ahead.new, ahead.old)
                except GitError as exc:  # moved by something that takes no index.lock: build it again
                    moved = exc
                    lock.match_head(staged.paths)
                    ahead = None
                    tries += 1
                    continue
                lock.linger()
                return ahead.new
    finally:
        if mover is not None:
            mover.cancel()
        if ahead is not None:
            ahead.update.discard()
    paths = ", ".join(staged.paths)
    raise moved or GitError(f"HEAD kept moving while committing {paths}; nothing was committed")


def _installable(workspace: Path, real: Path, ahead: _Ahead | None, on_branch: bool) -> _Ahead:
    """ahead, under index.lock just before the move; StellaError, nothing moved, when on_branch and HEAD
    has been detached (the user's `git checkout --detach`) since the check before the hooks and the
    lane's wait, which take seconds."""
    assert ahead is not None
    if on_branch and gitops.head_detached(workspace, real.parent):
        gitops.refuse_detached_head(workspace)
    return ahead


def _settled(workspace: Path, ahead: _Ahead, real: Path) -> bool:
    """True while HEAD and the real index are what ahead was built on (read from the files, no git)."""
    same_index = indexlock.identity(real) == ahead.update.source
    return same_index and indexlock.head_now(workspace, real) == ahead.old


@dataclass
class _Ahead:
    """A commit built on `old` and the real index's update for it, prepared aside."""

    old: str | None
    new: str
    update: indexlock.Update


def _rebased(workspace: Path, staged: Staged, ahead: _Ahead, head: str | None) -> _Ahead | None:
    """The commit built ahead with its change put onto head instead, in as few git calls as can be (None
    when that cannot be done: they touch the same paths, or head does not descend from its parent)."""
    if head is None or ahead.old is None:
        return None
    tree = index.rebased_tree(workspace, head, ahead.new)
    if tree is None or not gitops.is_ancestor(workspace, ahead.old, head):
        return None
    return _Ahead(head, index.commit_tree(workspace, tree, head, staged.message), ahead.update)


def _catch_up(workspace: Path, staged: Staged, ahead: _Ahead | None, real: Path) -> _Ahead:
    """Without the lock: the commit (and index update) built ahead, on HEAD as it is now."""
    if ahead is None:
        return _prepare(workspace, staged)
    head = indexlock.head_now(workspace, real)
    if head != ahead.old:
        rebased = _rebased(workspace, staged, ahead, head)
        if rebased is None:
            ahead.update.discard()
            return _prepare(workspace, staged)
        ahead = rebased
    ahead.update = indexlock.refreshed(workspace, ahead.update, real=real)
    return ahead


def _current(workspace: Path, staged: Staged, lock: IndexLock, ahead: _Ahead | None) -> _Ahead:
    """Under the lock: the commit built ahead, brought onto HEAD as it is now (or built again)."""
    head = lock.head()
    if ahead is not None and head != ahead.old:
        rebased = _rebased(workspace, staged, ahead, head)
        if rebased is None:
            ahead.update.discard()
        ahead = rebased
    if ahead is None:
        return _prepare(workspace, staged, real=lock.index)
    ahead.update = lock.fresh(ahead.update)
    return ahead


def _prepare(workspace: Path, staged: Staged, *, real: Path | None = None) -> _Ahead:
    old, new = _build(workspace, staged)
    return _Ahead(old, new, indexlock.prepare_update(workspace, staged.entries, staged.gone, real=real))


def _build(workspace: Path, staged: Staged) -> tuple[str | None, str]:
    """(HEAD, a new commit of HEAD plus exactly the staged entries, HEAD its parent)."""
    old = gitops.ref_commit(workspace, "HEAD")
    with scratch.directory("stella-index-") as tmp:
        index_file = Path(tmp) / "index"
        index.read_tree_into(workspace, index_file, old)
        index.set_entries(workspace, index_file, staged.entries, staged.gone)
        tree = index.write_tree(workspace, index_file)
    if old is not None and tree == index.tree_of(workspace, old):
        raise StellaError(f"nothing to commit: {', '.join(staged.paths)} match HEAD already")
    return old, index.commit_tree(workspace, tree, old, staged.message)


def _pending(
    ctx: WorkerContext, sha: str, staged: Staged, before: Mapping[str, tuple[str, str]] | None = None
) -> Pending:
    return Pending(
        ctx.run_id,
        ctx.task_id,
        ctx.attempt_id,
        staged.message.strip().splitlines()[0],
        sha,
        staged.paths,
        before=dict(before or {}),
        branch=ctx.branch,
    )
