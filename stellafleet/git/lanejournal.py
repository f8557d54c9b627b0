"""The commit lane's journal: the commit a lane holder is about to put on HEAD, until it is recorded.

Moving HEAD (git) and recording the commit (the ledger) cannot be one transaction. So the holder writes
the journal before HEAD moves and removes it once the commit is recorded and the index updated; a holder
killed in between leaves the journal behind, and the next holder of the lane finishes the job: if HEAD has
the commit, it is recorded for its task and the index entries of its paths are set to HEAD's; if not,
nothing was committed and the journal is dropped. Either way HEAD moved <=> the commit is recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from stellafleet.git import gitops
from stellafleet.git.indexlock import IndexLock

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


def write(path: Path, pending: Pending) -> None:
    """Write the journal atomically (a reader sees no journal or a whole one)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(pending)))
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
    head = gitops.ref_commit(root, "HEAD")
    landed = head is not None and gitops.is_ancestor(root, pending.sha, head)
    # The index may have the commit's entries while HEAD lacks them, or lack them while HEAD has them:
    # either way its entries for these paths become HEAD's.
    with IndexLock.held(root) as lock:
        lock.match_head(root, pending.paths)
    if landed:
        record(pending)
    clear(path)
    return pending if landed else None
