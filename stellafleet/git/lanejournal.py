"""The commit lane's journal: the commit a lane holder is about to put on HEAD, until it is recorded.

Moving HEAD (git) and recording the commit (the ledger) cannot be one transaction. So the holder writes
the journal before HEAD moves and removes it once the commit is recorded and the index updated; a holder
killed in between leaves the journal behind, and the next stella command finishes the job
(lanerecovery.py): if HEAD has the commit, it is recorded for its task and the index entries of its paths
are set to HEAD's; if not, nothing was committed, the index entries of its paths are put back as they were
before (the journal keeps them) and the journal is dropped. Either way HEAD moved <=> the commit is
recorded, and the user's index holds no half of a commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stellafleet.core.clock import wall_ms
from stellafleet.git import gitops
from stellafleet.git.indexlock import IndexLock
from stellafleet.state.ledger import Ledger

JOURNAL_NAME = "commit-lane.json"


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
    """Write the journal atomically (a reader sees no journal or a whole one)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**asdict(pending), "before": dict(pending.before)}))
    os.replace(tmp, path)


def clear(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def read(path: Path) -> Pending | None:
    try:
        data = json.loads(path.read_text())
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
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
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
    """A `git update-ref` the dead holder started may outlive it and still move HEAD: wait (a bounded
    time) while a lock on HEAD or its branch is held, so the verdict below sees where HEAD ends up. When
    no git process runs in the work tree any more, such a lock is what that update-ref left when it was
    killed with its holder (SIGKILL leaves git no time to remove it): the update never happened, and the
    lock goes, or the user's next `git commit` would fail on it."""
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
    branch = gitops.current_branch(root) or pending.branch or "HEAD"
    with Ledger.open(fleet_db) as ledger:
        ledger.commits.record(
            sha=pending.sha,
            run_id=pending.run_id,
            task_id=pending.task_id,
            attempt_id=pending.attempt_id,
            branch=branch,
            message=pending.message,
            committed_at_ms=wall_ms(),
        )
