"""Cleaning up after a dead commit-lane holder, at once, from any stella command.

A `stella commit` killed in the lane (SIGTERM from a task timeout, a second Ctrl-C, SIGKILL) can leave
git's `index.lock` (its marker names the dead process), its aside files (`index.stella-*`), the lane's
journal (`commit-lane.json`) and the lane's row. The user's own `git add` and `git commit` fail on that
index.lock until it goes. So every stella command, and the fleet when it finalises a run, calls
`recover`: when anything a dead holder left is there, it takes the lane (unless a live holder has it: that
one cleans up itself), removes the dead process's lock and aside files, and finishes the journal: a
commit that reached HEAD is recorded and its paths' index entries set to HEAD's; one that did not has its
paths' entries put back as they were, so the user's index is what it was before the killed commit.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, indexlock, lanejournal, scratch
from stellafleet.state.claims import ClaimStore, Holder

log = logging.getLogger(__name__)


def _has_leftovers(index: Path, journal: Path) -> bool:
    lock = index.with_name(index.name + ".lock")
    if journal.exists() or (lock.exists() and indexlock.stale_marker(lock) is not None):
        return True
    return any(index.parent.glob(f"{index.name}{indexlock.ASIDE_PREFIX}*"))


def recover(root: Path) -> list[str]:
    """Clean up after a dead lane holder in root's main work tree; what was done (empty: nothing to do)."""
    paths = StatePaths(root)
    journal = paths.private / lanejournal.JOURNAL_NAME
    real = indexlock.index_file(root)
    if not _has_leftovers(real, journal) or not paths.store_db.exists():
        return []
    with ClaimStore.open(paths.store_db) as store, contextlib.ExitStack() as stack:
        try:
            stack.enter_context(store.commit_lane(Holder.current("", "stella-recovery", "", 0), timeout=0.0))
        except StellaError:
            return []  # a live holder has the lane: it cleans up what it finds itself
        done = [f"removed {leftover.name}" for leftover in indexlock.remove_dead_leftovers(real)]
        pending = lanejournal.read(journal)
        if pending is not None:
            landed = lanejournal.finish(root, journal, lambda p: lanejournal.record(paths.fleet_db, root, p))
            done.append(
                f"recorded commit {pending.sha[:12]} of task {pending.task_id}"
                if landed is not None
                else f"put the index entries of {', '.join(pending.paths)} back as they were"
            )
        return done


def recover_quietly(cwd: Path | str) -> None:
    """recover() for the repository holding cwd, if any; never fails the command that calls it."""
    try:
        root = gitops.main_worktree_root(cwd)
    except StellaError:
        return
    try:
        for line in recover(root):
            log.info("commit lane: %s (left by a stella process that is gone)", line)
    except (StellaError, OSError) as exc:
        log.warning("could not clean up after a stopped stella commit: %s", exc)
    for gone in scratch.sweep_dead():
        log.info("removed %s (left by a stella commit that is gone)", gone)
