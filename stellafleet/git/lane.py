"""A worker's commit of exactly its paths (shared tree: via the commit lane), staged and hooked in a private
index on HEAD; HEAD moved by compare-and-swap, index.lock held an instant; HEAD moved <=> a ledger row."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from stellafleet.core.errors import GitError, StellaError
from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import (
    committree,
    dirty,
    gitops,
    hookstash,
    index,
    indexlock,
    lanejournal,
    mergeops,
    submodules,
)
from stellafleet.git import hooks as hooks_mod
from stellafleet.git.indexlock import IndexLock
from stellafleet.git.keptree import KeptTree
from stellafleet.git.lanejournal import Pending
from stellafleet.state.claims import ClaimStore, Holder

HEAD_RETRIES = 5  # tries of one commit while HEAD moves by something that takes no index.lock
USERS_COMMIT_WAIT_S = 120.0  # a refused commit waits at most this long for the user's `git commit` to end
LOCKLESS_S = 5.0  # catching up without index.lock, at most: past it, under the lock (never overtaken)


def commit_paths(
    ctx: WorkerContext,
    paths: Sequence[str],
    message: str,
    *,
    lane_timeout: float = 60.0,
    commit_tree: KeptTree | None = None,
) -> str:
    """Commit exactly these workspace paths (deleted ones as deletions) for ctx's attempt; returns the SHA.
    A shared commit's hooks run in commit_tree when given (committree.py), else in the shared tree."""
    if not message.strip():
        raise StellaError("a commit needs a message")
    workspace = Path(ctx.workspace)
    relpaths = confine_paths(workspace, paths)
    submodules.refuse_inside(workspace, relpaths)
    reflog = f"stella: task {ctx.task_id}"
    # where git looks for the hooks, asked once for the whole commit (None: [commit] hooks = "skip")
    hooks = hooks_mod.installed(workspace) if ctx.commit_hooks == "run" else None
    hook_lock = ctx.paths.private / hookstash.LOCK_NAME if ctx.serialize_hooks else None
    with lanejournal.scratch_directory("stella-commit-") as tmp:  # locked while we live, swept once gone
        # in the shared tree, a file the user had changed when the run started: the worker's changes only
        snapshot = dirty.load(ctx.root, ctx.run_id) if ctx.shared else {}
        contents = dirty.worker_entries(workspace, relpaths, snapshot) if snapshot else {}
        staging = functools.partial(
            stage,
            workspace,
            relpaths,
            message,
            Path(tmp),
            hooks=hooks,
            contents=contents,
            hook_lock=hook_lock,
            commit_tree=commit_tree if ctx.shared else None,
        )
        if not ctx.shared:
            # An isolated worktree has one writer: no lane, no claims.
            staged = staging()
            real = indexlock.index_file(workspace)
            sha = commit_in_workspace(workspace, staged, _prepare(workspace, staged, real), reflog=reflog)
            lanejournal.record(ctx.paths.fleet_db, workspace, _pending(ctx, sha, staged))
        else:
            gitops.refuse_detached_head(workspace, allowed=ctx.allow_detached)  # detached since the start?
            users_before = bool(gitops.users_commits(workspace))  # it may end before a hook refuses
            try:
                sha = _commit_shared(ctx, workspace, relpaths, staging, reflog, lane_timeout)
            except hooks_mod.HookFailed:
                if not _after_users_commit(workspace, users_before):
                    raise
                sha = _commit_shared(ctx, workspace, relpaths, staging, reflog, lane_timeout)
    if hooks is not None:
        hooks_mod.run_post_commit(workspace, relpaths, hooks.where)
    return sha


def _commit_shared(
    ctx: WorkerContext,
    workspace: Path,
    paths: Sequence[str],
    staging: Callable[[], Staged],
    reflog: str,
    lane_timeout: float,
) -> str:
    """The claims, then the staging and its hooks outside the lane (a slow hook holds up no other commit),
    then the lane."""
    journal = ctx.paths.private / lanejournal.JOURNAL_NAME
    record = functools.partial(lanejournal.record, ctx.paths.fleet_db, workspace)
    real = indexlock.index_file(workspace)
    with ClaimStore.open(ctx.paths.store_db) as store:
        holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id, worker_pid(ctx))
        # Only the attempt's own paths: a path another live worker holds fails here, by name.
        store.acquire(paths, holder)
        staged = staging()
        # The lane belongs to this process, not to the worker: a killed `stella commit` frees it at once.
        lane_holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id)
        # built before the lane, while other commits land, and caught up in it
        with _prepare(workspace, staged, real) as ahead, store.commit_lane(lane_holder, timeout=lane_timeout):
            indexlock.remove_dead_leftovers(real)
            lanejournal.finish(workspace, journal, record)

            def journal_it(sha: str, before: Mapping[str, tuple[str, str]]) -> None:
                lanejournal.write(journal, _pending(ctx, sha, staged, before))

            try:
                sha = commit_in_workspace(
                    workspace,
                    staged,
                    ahead,
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
        for line in committree.write_back(workspace, staged.rewrites, staged.worker):
            print(line, file=sys.stderr)
        if not ctx.run_id:  # the user's commit holds its paths only while it commits
            store.release_attempt(ctx.run_id, ctx.attempt_id)
    return sha


def _after_users_commit(workspace: Path, ran_before: bool, timeout: float = USERS_COMMIT_WAIT_S) -> bool:
    """Whether a `git commit` of the user's ran in the tree while the hooks did, waited for until it ended:
    the pre-commit framework's stash of unstaged changes (the workers' files) may have undone a rewrite."""
    if not ran_before and not gitops.users_commits(workspace):
        return False
    print("stella: a hook refused while your git commit ran; trying again once it has ended", file=sys.stderr)
    deadline = time.monotonic() + timeout
    while gitops.users_commits(workspace) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def users_context(cwd: Path) -> WorkerContext:
    """The user's own `stella commit`, outside any worker: through the lane, with the hooks on exactly its
    paths as the config says, recorded for no task."""
    from stellafleet.core.config import load_config

    workspace, root = gitops.repo_root(cwd), gitops.main_worktree_root(cwd)
    config = load_config(root)
    shared = workspace.resolve() == root.resolve()
    return WorkerContext(
        root=root,
        workspace=workspace,
        run_id="",
        task_id="",
        task_title="your own commit",
        attempt_id=0,
        prompt="",
        isolation="shared" if shared else "isolated",
        branch=None if shared else gitops.current_branch(workspace),
        base_commit="",
        spend_guard_usd=None,
        pipeline="",
        model=None,
        timeout_s=None,
        result_path=Path(os.devnull),
        log_path=Path(os.devnull),
        transcript_path=Path(os.devnull),
        commit_hooks=config.commit.hooks,
        serialize_hooks=hookstash.serialised(config.commit.serialize_hooks, root),
    )


def worker_pid(ctx: WorkerContext) -> int:
    """This process's topmost ancestor in ctx's attempt: claims taken by a short-lived `stella commit`
    belong to the worker, or they would go stale the moment it exits."""
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
    users: tuple[str, ...] = ()  # of paths, those the user had changed when the run started (kept out)
    # in the commit tree: the entries the worker staged, and what the hooks rewrote of them (and staged)
    worker: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    rewrites: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def gone(self) -> list[str]:
        return [path for path in self.paths if path not in self.entries]


def stage(
    workspace: Path,
    paths: Sequence[str],
    message: str,
    scratch: Path,
    *,
    hooks: hooks_mod.Installed | None = None,
    contents: Mapping[str, tuple[str, str]] | None = None,
    hook_lock: Path | None = None,
    commit_tree: KeptTree | None = None,
) -> Staged:
    """The paths as the work tree has them (or, for those in contents, those entries), staged in a private
    index on HEAD, and the repository's pre-commit and commit-msg hooks run on them (hooks.py), under
    hook_lock with the stash kept when they may use the stash (hookstash.py): in commit_tree, holding
    HEAD and the staged paths alone, when given (committree.py), else in the work tree."""
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
    users = tuple(contents or ())
    if hooks and commit_tree is not None and old is not None:
        worker = index.file_entries(workspace, index_file, paths)
        done = committree.run_hooks(
            commit_tree, old, worker, paths, message, scratch,
            installed=hooks, hook_lock=hook_lock, workspace=workspace,
        )  # fmt: skip
        return Staged(tuple(paths), done.entries, done.message, users, worker, done.rewrites)
    with hookstash.guarded(hook_lock if hooks else None, workspace, index_file):
        if hooks and "pre-commit" in hooks:
            hooks_mod.run_pre_commit(
                workspace, index_file, paths, hooks.where
            )  # HookFailed: nothing committed
        entries = index.file_entries(workspace, index_file, paths)  # a hook may have staged more of them
        if hooks and "commit-msg" in hooks:
            message = hooks_mod.run_commit_msg(workspace, index_file, message, scratch, paths, hooks.where)
    return Staged(tuple(paths), entries, message, users)


def commit_in_workspace(
    workspace: Path,
    staged: Staged,
    ahead: _Ahead,
    *,
    reflog: str,
    before_head_moves: Callable[[str, Mapping[str, tuple[str, str]]], None] | None = None,
    on_branch: bool = False,  # refused if HEAD is detached when it would move
) -> str:
    """The commit built ahead put on HEAD by compare-and-swap with its paths' real index entries; its SHA.
    before_head_moves(sha, entries before) journals it. Caught up lock-free, then under the lock."""
    moved: GitError | None = None
    mover: index.HeadMove | None = None  # started ahead: under the lock, only the move itself is left
    real = ahead.update.real
    deadline = time.monotonic() + LOCKLESS_S
    failed_moves = 0
    try:
        while failed_moves < HEAD_RETRIES:
            ahead = _catch_up(workspace, staged, ahead)
            lockless = time.monotonic() < deadline
            if lockless and not _settled(workspace, ahead):
                continue
            mover = mover or index.HeadMove(workspace, reflog)
            with IndexLock.held(workspace, index=real) as lock:
                if lockless and not _settled(workspace, ahead):
                    continue  # let go at once and catch up without it
                ahead = _catch_up(workspace, staged, ahead)  # nothing left to do unless past LOCKLESS_S
                if before_head_moves is not None:
                    before_head_moves(ahead.new, ahead.update.before)
                # a HEAD detached since the check before the hooks and the lane's wait is refused
                if on_branch and gitops.head_detached(workspace, real.parent):
                    gitops.refuse_detached_head(workspace)
                lock.install(ahead.update)
                move, mover = mover, None
                try:
                    move.move(ahead.new, ahead.old)
                except GitError as exc:  # moved by something that takes no index.lock: catch up again
                    moved, failed_moves = exc, failed_moves + 1
                    lock.match_head(staged.paths)
                    continue
                lock.linger()
                return ahead.new
    finally:
        if mover is not None:
            mover.cancel()
        ahead.update.discard()
    paths = ", ".join(staged.paths)
    raise moved or GitError(f"HEAD kept moving while committing {paths}; nothing was committed")


def _settled(workspace: Path, ahead: _Ahead) -> bool:
    """Whether HEAD and the real index are still what ahead was built on (read from the files)."""
    return ahead.update.current() and indexlock.head_now(workspace, ahead.update.real) == ahead.old


@dataclass
class _Ahead:
    """A commit built on `old` and the real index's update for it, prepared aside."""

    old: str | None
    new: str
    update: indexlock.Update

    def __enter__(self) -> _Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.update.discard()


def _catch_up(workspace: Path, staged: Staged, ahead: _Ahead) -> _Ahead:
    """ahead brought onto HEAD and the real index as they are now (nothing to do when neither moved):
    with or without index.lock, the one way a commit is caught up."""
    head = indexlock.head_now(workspace, ahead.update.real)
    if head != ahead.old:
        rebased = _rebased(workspace, staged, ahead, head)
        if rebased is None:
            ahead.update.discard()
            return _prepare(workspace, staged, ahead.update.real)
        ahead = rebased
    ahead.update = indexlock.refreshed(workspace, ahead.update)
    return ahead


def _rebased(workspace: Path, staged: Staged, ahead: _Ahead, head: str | None) -> _Ahead | None:
    """ahead's change put onto head in three git calls; None when they touch the same paths or head does
    not descend from ahead's parent."""
    if head is None or ahead.old is None:
        return None
    try:
        tree, _conflicts = mergeops.merge_tree(workspace, head, ahead.new)
    except GitError:  # a git before 2.38: prepared again instead
        return None
    if tree is None or not gitops.is_ancestor(workspace, ahead.old, head):
        return None
    return _Ahead(head, index.commit_tree(workspace, tree, head, message=staged.message), ahead.update)


def _prepare(workspace: Path, staged: Staged, real: Path) -> _Ahead:
    """A new commit of HEAD plus exactly the staged entries (HEAD its parent), and the real index's update."""
    old = indexlock.head_now(workspace, real)
    with lanejournal.scratch_directory("stella-index-") as tmp:
        index_file = Path(tmp) / "index"
        index.read_tree_into(workspace, index_file, old)
        index.set_entries(workspace, index_file, staged.entries, staged.gone)
        tree = index.write_tree(workspace, index_file)
    if old is not None and tree == index.tree_of(workspace, old):
        if staged.users:
            raise StellaError(
                f"nothing to commit: the only changes in {', '.join(staged.paths)} are the uncommitted "
                "changes of yours from when the run started (--allow-dirty keeps those out of the "
                "workers' commits)"
            )
        raise StellaError(f"nothing to commit: {', '.join(staged.paths)} match HEAD already")
    new = index.commit_tree(workspace, tree, old, message=staged.message)
    return _Ahead(old, new, indexlock.prepare_update(workspace, staged.entries, staged.gone, real=real))


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
