"""A worker's commit of exactly its own paths, through the commit lane in the shared tree.

The commit is built in a temporary index seeded from HEAD, so nothing the user (or another worker)
has staged is swept in; HEAD moves by compare-and-swap, so a commit never lands on top of a HEAD it did
not see; only the committed paths' entries of the real index are updated, so `git status` shows them clean
while every other staged or unstaged change stays exactly as it was. HEAD and the index change together
under git's own index.lock (indexlock.py), and a commit is recorded in the ledger whenever HEAD moved, even
when its `stella commit` was killed halfway (lanejournal.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import GitError, StellaError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, index, lanejournal
from stellafleet.git.indexlock import IndexLock
from stellafleet.git.lanejournal import Pending
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger

HEAD_RETRIES = 20  # builds of one commit while other commits keep landing under it


def commit_paths(
    ctx: WorkerContext, paths: Sequence[str], message: str, *, lane_timeout: float = 60.0
) -> str:
    """Commit exactly these workspace paths (deleted ones as deletions) for ctx's attempt; returns the SHA."""
    if not message.strip():
        raise StellaError("a commit needs a message")
    workspace = Path(ctx.workspace)
    relpaths = confine_paths(workspace, paths)
    if not ctx.shared:
        # An isolated worktree has one writer: no lane, no claims.
        sha = commit_in_workspace(workspace, relpaths, message, reflog=f"stella: task {ctx.task_id}")
        _record(ctx, workspace, _pending(ctx, sha, message, relpaths))
        return sha
    journal = ctx.paths.private / lanejournal.JOURNAL_NAME
    with ClaimStore.open(ctx.paths.store_db) as store:
        holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id, worker_pid(ctx))
        # Only the attempt's own paths: a path another live worker holds fails here, by name.
        store.acquire(relpaths, holder)
        # The lane belongs to this process, not to the worker: a killed `stella commit` frees it at once.
        lane_holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id)
        with store.commit_lane(lane_holder, timeout=lane_timeout):
            record = functools.partial(_record, ctx, workspace)
            lanejournal.finish(workspace, journal, record)
            try:
                sha = commit_in_workspace(
                    workspace,
                    relpaths,
                    message,
                    reflog=f"stella: task {ctx.task_id}",
                    before_head_moves=lambda sha: lanejournal.write(
                        journal, _pending(ctx, sha, message, relpaths)
                    ),
                )
            except BaseException:
                # HEAD did not move (or, past the compare-and-swap, it did: then record it all the same)
                lanejournal.finish(workspace, journal, record)
                raise
            _record(ctx, workspace, _pending(ctx, sha, message, relpaths))
            lanejournal.clear(journal)
    settle_index(workspace, relpaths)
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
                lock.match_head(workspace, paths)


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


def commit_in_workspace(
    workspace: Path,
    paths: Sequence[str],
    message: str,
    *,
    reflog: str,
    before_head_moves: Callable[[str], None] | None = None,
) -> str:
    """HEAD + exactly these paths as one new commit on HEAD, by compare-and-swap; returns its SHA.

    before_head_moves(sha) runs just before HEAD moves (the lane journals the commit there). When HEAD
    moves under it (the user's own `git commit`), the commit is built again on the new HEAD: the paths
    are this attempt's own, so nothing another commit did is undone."""
    moved: GitError | None = None
    for _ in range(HEAD_RETRIES):
        # git's index.lock is held from reading HEAD until both HEAD and the index have changed, as a
        # `git commit` holds it, so the user's commit cannot land in between. The index changes first: a
        # git command that reads (without the lock) the new HEAD reads the new index too, and one that
        # read the old HEAD fails its own compare-and-swap (its next commit would undo this one's files).
        with IndexLock.held(workspace) as lock:
            old, new = _build(workspace, paths, message)
            entries = index.tree_entries(workspace, new, paths)
            gone = [path for path in paths if path not in entries]
            lock.prepare(workspace, entries, gone, null_oid="0" * len(new))
            if before_head_moves is not None:
                before_head_moves(new)
            lock.install()
            try:
                index.update_head_cas(workspace, new, old, reflog)
            except GitError as exc:  # moved by something that takes no index.lock: build it again
                moved = exc
                lock.match_head(workspace, paths)
                continue
            lock.linger()
            return new
    raise moved or GitError(f"HEAD kept moving while committing {', '.join(paths)}; nothing was committed")


def _build(workspace: Path, paths: Sequence[str], message: str) -> tuple[str | None, str]:
    """(HEAD, a new commit of HEAD plus exactly these paths from the work tree, HEAD its parent)."""
    old = gitops.ref_commit(workspace, "HEAD")
    missing = [path for path in paths if not os.path.lexists(workspace / path)]
    known = index.tree_entries(workspace, old, missing) if old and missing else {}
    unknown = [path for path in missing if path not in known]
    if unknown:
        raise StellaError(f"cannot commit {', '.join(unknown)}: no such file in the workspace or in HEAD")
    with tempfile.TemporaryDirectory(prefix="stella-index-") as tmp:
        index_file = Path(tmp) / "index"
        index.read_tree_into(workspace, index_file, old)
        index.stage_paths(workspace, index_file, paths)
        tree = index.write_tree(workspace, index_file)
    if old is not None and tree == index.tree_of(workspace, old):
        raise StellaError(f"nothing to commit: {', '.join(paths)} match HEAD already")
    return old, index.commit_tree(workspace, tree, old, message)


def _pending(ctx: WorkerContext, sha: str, message: str, paths: Sequence[str]) -> Pending:
    return Pending(
        ctx.run_id, ctx.task_id, ctx.attempt_id, message.strip().splitlines()[0], sha, tuple(paths)
    )


def _record(ctx: WorkerContext, workspace: Path, pending: Pending) -> None:
    """Record a lane commit for the task it was made for (one a killed lane holder put on HEAD too)."""
    branch = gitops.current_branch(workspace) or ctx.branch
    with Ledger.open(ctx.paths.fleet_db) as ledger:
        ledger.commits.record(
            sha=pending.sha,
            run_id=pending.run_id,
            task_id=pending.task_id,
            attempt_id=pending.attempt_id,
            branch=branch,
            message=pending.message,
            committed_at_ms=wall_ms(),
        )
