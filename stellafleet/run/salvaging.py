"""When an attempt ends without success, keep what it left uncommitted (git/salvage.py) and record it.
A salvage that fails is logged, never raised: it must not turn an attempt's end into another error."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import RunStatus
from stellafleet.core.words import plural
from stellafleet.git import dirty, gitops
from stellafleet.git import salvage as salvage_git
from stellafleet.proc.pids import pid_alive
from stellafleet.state import journal
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

log = logging.getLogger(__name__)


def salvage_attempt(
    ledger: Ledger,
    *,
    root: Path,
    run_id: str,
    task_id: str,
    attempt_id: int,
    worktree: Path | None,
    outcome: str,
    claimed: Sequence[str] = (),
) -> salvage_git.Salvaged | None:
    """Salvage one attempt's work (worktree: all of it; else the claimed paths of the shared tree) and
    record the ref and SHA on the attempt; None when there was nothing to keep."""
    paths = None if worktree is not None else list(claimed)
    workspace = worktree or root
    if paths == [] or not workspace.is_dir():
        return None
    if worktree is not None and not _ours(root, worktree):
        log.warning("not salvaging attempt %s of task %s: %s is no worktree of %s any more (its .git was "
                    "replaced)", attempt_id, task_id, worktree, root)  # fmt: skip
        return None
    saved = salvage_workspace(workspace, run_id, task_id, attempt_id, outcome, paths)
    if saved is not None:
        ledger.attempts.set_salvage(attempt_id, saved.ref, saved.sha)
    return saved


def _ours(root: Path, worktree: Path) -> bool:
    """Whether worktree's git is root's: a worker that replaced its `.git` has a repository of its own,
    and a salvage there would name a commit the user's repository does not have."""
    try:
        return gitops.common_dir(worktree).resolve() == gitops.common_dir(root).resolve()
    except StellaError:
        return False


def salvage_workspace(
    workspace: Path, run_id: str, task_id: str, attempt_id: int, outcome: str, paths: list[str] | None = None
) -> salvage_git.Salvaged | None:
    """The salvage commit of workspace (paths: only those); a Ray node's is recorded once it came home."""
    what = "its worktree" if paths is None else f"its claimed paths ({len(paths)})"
    message = (
        f"stella salvage: {task_id}, attempt {attempt_id} ({outcome})\n\n"
        f"What {what} held uncommitted when the attempt ended without success (run {run_id}).\n"
    )
    ref = salvage_git.salvage_ref(run_id, task_id, attempt_id)
    try:
        # in the shared tree, a file the user had changed when the run started: the worker's changes only
        snapshot = dirty.load(workspace, run_id) if paths else {}
        instead = dirty.salvage_entries(workspace, paths or [], snapshot) if snapshot else ({}, [])
        return salvage_git.salvage(workspace, ref, paths=paths, message=message, instead=instead)
    except (StellaError, OSError) as exc:
        log.warning("could not salvage attempt %s of task %s: %s", attempt_id, task_id, exc)
        return None


def repair(root: Path, records: Sequence[journal.Record]) -> bool:
    """The runs of a killed fleet finalised, their open attempts salvaged first; False while a worker of
    one still runs or the ledger is busy (a later command finishes it)."""
    paths = StatePaths(root)
    if not paths.fleet_db.exists():
        return True
    finished = False
    with (
        contextlib.suppress(StellaError, sqlite3.Error, OSError),
        Ledger.open(paths.fleet_db) as ledger,
        ClaimStore.open(paths.store_db) if paths.store_db.exists() else contextlib.nullcontext() as store,
    ):
        finished = all([finalise_run(ledger, store, str(r.data.get("run_id")), root=root) for r in records])
    return finished


def _salvage_open(
    ledger: Ledger, store: ClaimStore | None, root: Path, run_id: str, attempts: list[dict[str, Any]]
) -> int:
    """How many of the open attempts left work that is now on a salvage ref."""
    saved = 0
    for open_attempt in attempts:  # before they are abandoned, while their claims are still recorded
        if open_attempt["pid"] is None:
            continue  # its worker never started: what its worktree holds is its setup's, not work
        attempt_id = int(open_attempt["id"])
        row = ledger.attempts.get(attempt_id, "task_id, branch, worktree, node")
        if row is None or (row["branch"] and not row["worktree"]):
            continue  # unknown, or an isolated attempt on a remote node: no workspace here
        worktree = Path(row["worktree"]) if row["worktree"] else None
        claimed = [] if store is None or worktree else store.paths_of_attempt(run_id, attempt_id)
        kept = salvage_attempt(
            ledger,
            root=root,
            run_id=run_id,
            task_id=str(row["task_id"]),
            attempt_id=attempt_id,
            worktree=worktree,
            claimed=claimed,
            outcome="abandoned",
        )
        saved += kept is not None
    return saved


def finalise_run(ledger: Ledger, store: ClaimStore | None, run_id: str, *, root: Path | None = None) -> bool:
    """Finalise run_id, whose fleet is gone, once its workers have ended (salvaging its open attempts in
    root's tree first, when given); False while one still runs."""
    run = ledger.runs.get(run_id)
    if run is None or run["status"] != RunStatus.RUNNING:
        return True
    attempts = ledger.attempts.running(run_id)
    if any(a["pid"] is not None and pid_alive(a["pid"], a["pid_started_ms"]) for a in attempts):
        return False  # a worker still runs: its claims stay held until it has ended too
    saved = _salvage_open(ledger, store, root, run_id, attempts) if root is not None else 0
    gone = (
        f"the fleet process (pid {run['pid']}) ended without finishing its run: its attempts were abandoned"
    )
    ledger.abandon_run(run_id, gone)
    kept = (
        f"; the unfinished work of {plural(saved, 'attempt')} is kept on salvage refs (`stella runs "
        f"{run_id}` names them, `stella fleet --resume {run_id} --from-salvage` continues from them)"
        if saved
        else ""
    )
    print(f"stella: finalised run {run_id}: {gone}{kept}", file=sys.stderr)  # said by the command that did it
    if store is not None:
        for attempt in attempts:
            store.release_attempt(run_id, int(attempt["id"]))
    return True
