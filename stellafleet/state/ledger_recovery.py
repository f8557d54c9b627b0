"""Finalising a run whose fleet process is gone (killed, or its machine rebooted).

Such a run would otherwise stay `running` forever, its attempts open and their claims recorded. The next
stella command that opens the ledger (`stella fleet`, `runs`, `observatory`, `clean`) finalises it: every
attempt still open becomes `abandoned`, its task `interrupted`, the attempts' claims are freed, and the run
becomes `interrupted` with the reason recorded. A run none of whose workers has ended yet (a worker lives
on for a moment after its fleet: it ends itself once orphaned) is left for a later command.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.proc.pids import pid_alive
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

Alive = Callable[[int | None, int | None], bool]
# Called with a run's open attempts just before they are abandoned, their claims still recorded: what the
# run layer does then (run/salvaging.py keeps their uncommitted work).
BeforeAbandon = Callable[[Ledger, ClaimStore | None, str, list[dict[str, Any]]], None]


def fleet_gone_reason(pid: int | None) -> str:
    return f"the fleet process (pid {pid}) ended without finishing its run: its attempts were abandoned"


def finalise_orphaned_runs(
    ledger: Ledger,
    store: ClaimStore | None,
    *,
    alive: Alive = pid_alive,
    before_abandon: BeforeAbandon | None = None,
) -> list[str]:
    """Finalise every `running` run whose fleet is gone and whose workers have ended; their ids."""
    finalised: list[str] = []
    for run in ledger.runs.running():
        if run["pid"] is None or alive(run["pid"], run["created_at_ms"]):
            continue
        attempts = ledger.attempts.running(run["id"])
        if any(a["pid"] is not None and alive(a["pid"], a["started_at_ms"]) for a in attempts):
            continue  # a worker still runs: its claims stay held until it has ended too
        if before_abandon is not None:
            before_abandon(ledger, store, run["id"], attempts)
        ledger.abandon_run(run["id"], fleet_gone_reason(run["pid"]))
        if store is not None:
            for attempt in attempts:
                store.release_attempt(run["id"], int(attempt["id"]))
        finalised.append(str(run["id"]))
    return finalised


def finalise_orphaned_runs_in(root: Path, before_abandon: BeforeAbandon | None = None) -> list[str]:
    """finalise_orphaned_runs for the repository at root (nothing when it has no ledger).

    Best effort: a ledger that cannot be written right now is left for the next command."""
    fleet_db, store_db = StatePaths(root).fleet_db, StatePaths(root).store_db
    if not fleet_db.exists():
        return []
    with contextlib.suppress(StellaError, sqlite3.Error, OSError), Ledger.open(fleet_db) as ledger:
        store = ClaimStore.open(store_db) if store_db.exists() else None
        try:
            return finalise_orphaned_runs(ledger, store, before_abandon=before_abandon)
        finally:
            if store is not None:
                store.close()
    return []
