"""The commit lane's journal records, the commit in flight (moving HEAD and recording it in the ledger are
not one transaction) and `stella commit`'s scratch directories, and their repair (docs/claims.md)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, indexlock
from stellafleet.git.indexlock import IndexLock
from stellafleet.state import journal
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger

log = logging.getLogger(__name__)

JOURNAL_NAME = "commit-lane.json"
_serial = itertools.count()


@dataclass(frozen=True)
class Pending:
    """One lane commit between HEAD moving and its ledger row."""

    run_id: str
    task_id: str
    attempt_id: int
    message: str
    sha: str
    paths: tuple[str, ...]
    # the paths' entries in the real index before the commit (mode, object SHA); absent: not in it
    before: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    branch: str | None = None


def write(path: Path, pending: Pending) -> None:
    """Write the record (a reader sees none or a whole one), owned by this process."""
    fields = {**asdict(pending), "before": dict(pending.before)}
    journal.owner_in(path.parent).write(path.stem, "commit", **fields)


def clear(path: Path) -> None:
    journal.owner_in(path.parent).drop(path.stem)  # this process's own
    path.unlink(missing_ok=True)  # or a killed holder's, finished under the lane


def read(path: Path) -> Pending | None:
    try:
        data = journal.read(path)
        if data is None:
            return None
        return Pending(
            run_id=str(data["run_id"]),
            task_id=str(data["task_id"]),
            attempt_id=int(data["attempt_id"]),
            message=str(data["message"]),
            sha=str(data["sha"]),
            paths=tuple(str(p) for p in data["paths"]),
            before={str(p): (str(m), str(o)) for p, (m, o) in dict(data.get("before") or {}).items()},
            branch=data.get("branch"),
        )
    except (ValueError, KeyError, TypeError):
        clear(path)  # unreadable: written by no complete lane commit
        return None


def finish(root: Path, path: Path, record: Callable[[Pending], None]) -> Pending | None:
    """Finish a lane commit its holder left halfway (call while holding the lane); what was finished."""
    pending = read(path)
    if pending is None:
        return None
    _wait_for_ref_updates(root)
    head = gitops.ref_commit(root, "HEAD")
    landed = head is not None and gitops.is_ancestor(root, pending.sha, head)
    # The index may have the commit's entries while HEAD lacks them, or lack them while HEAD has them:
    # landed, its entries for these paths become HEAD's; not landed, what they were before.
    with IndexLock.held(root) as lock:
        if landed:
            lock.match_head(pending.paths)
        else:
            lock.restore(pending.before, [p for p in pending.paths if p not in pending.before])
    if landed:
        record(pending)
    clear(path)
    return pending if landed else None


REF_UPDATE_WAIT_S = 5.0


def _wait_for_ref_updates(root: Path) -> None:
    """Wait (a bounded time) while a lock on HEAD or its branch is held: the dead holder's `git update-ref`
    may still move HEAD. With no git left in the work tree, the update never happened: the lock goes."""
    common = gitops.common_dir(root)
    branch = gitops.current_branch(root)
    locks = [common / "HEAD.lock"] + ([common / "refs" / "heads" / f"{branch}.lock"] if branch else [])
    deadline = time.monotonic() + REF_UPDATE_WAIT_S
    while any(lock.exists() for lock in locks):
        if not gitops.git_processes_in(root, started_before=time.time()):
            for lock in locks:
                with contextlib.suppress(OSError):
                    lock.unlink()
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def record(fleet_db: Path, root: Path, pending: Pending) -> None:
    """Record a lane commit in the ledger for the task it was made for."""
    if not pending.run_id:  # the user's own `stella commit`: no task to record it for
        return
    branch = gitops.current_branch(root) or pending.branch or "HEAD"
    with Ledger.open(fleet_db) as ledger:
        made = (pending.sha, pending.message, wall_ms())
        ledger.commits.record(
            [made],
            run_id=pending.run_id,
            task_id=pending.task_id,
            attempt_id=pending.attempt_id,
            branch=branch,
        )


def repair(root: Path, records: Sequence[journal.Record]) -> bool:
    """Finish what a killed `stella commit` left in root's lane, and remove a dead stella's index.lock and
    aside files, under the lane; a live holder of the lane finishes it itself."""
    paths = StatePaths(root)
    if not paths.store_db.exists():
        return True
    with ClaimStore.open(paths.store_db) as store, contextlib.ExitStack() as stack:
        try:
            stack.enter_context(store.commit_lane(Holder.current("", "stella-recovery", "", 0), timeout=0.0))
        except StellaError:
            return True
        real = indexlock.index_file(root)
        done = [f"removed {leftover.name}" for leftover in indexlock.remove_dead_leftovers(real)]
        path = paths.journal / JOURNAL_NAME
        pending = read(path)
        if pending is not None:
            landed = finish(root, path, functools.partial(record, paths.fleet_db, root))
            done.append(
                f"recorded commit {pending.sha[:12]} of task {pending.task_id}"
                if landed is not None
                else f"put the index entries of {', '.join(pending.paths)} back as they were"
            )
    for line in done:
        log.info("commit lane: %s (left by a stella process that is gone)", line)
    return True


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[str]:
    """A temporary directory named prefix..., in the journal of this process's `stella commit`: a kill
    leaves it behind, a copy of the repository's index."""
    owner = journal.current()
    tmp = tempfile.mkdtemp(prefix=prefix)
    name = None if owner is None else f"scratch-{owner.name}-{next(_serial)}"
    try:
        if owner is not None and name is not None:
            owner.write(name, "scratch", path=tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if owner is not None and name is not None:
            owner.drop(name)


def repair_scratch(root: Path, records: Sequence[journal.Record]) -> bool:
    """Remove the scratch directories of commits that are gone."""
    for record in records:
        path = record.data.get("path")
        if isinstance(path, str) and Path(path).is_absolute():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s (left by a stella commit that is gone)", path)
    return True
