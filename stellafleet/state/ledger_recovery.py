"""Finalising a run whose fleet is gone, which would otherwise stay `running` forever: once its workers
have ended too, its open attempts are abandoned and their claims freed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stellafleet.core.status import RunStatus
from stellafleet.proc.pids import pid_alive
from stellafleet.state.claims import ClaimStore
from stellafleet.state.ledger import Ledger

# called with a run's open attempts before they are abandoned, their claims still recorded (run/salvaging.py)
BeforeAbandon = Callable[[Ledger, ClaimStore | None, str, list[dict[str, Any]]], None]


def finalise_run(
    ledger: Ledger,
    store: ClaimStore | None,
    run_id: str,
    *,
    before_abandon: BeforeAbandon | None = None,
) -> bool:
    """Finalise run_id, whose fleet is gone, once its workers have ended; False while one still runs."""
    run = ledger.runs.get(run_id)
    if run is None or run["status"] != RunStatus.RUNNING:
        return True
    attempts = ledger.attempts.running(run_id)
    if any(a["pid"] is not None and pid_alive(a["pid"], a["started_at_ms"]) for a in attempts):
        return False  # a worker still runs: its claims stay held until it has ended too
    if before_abandon is not None:
        before_abandon(ledger, store, run_id, attempts)
    gone = (
        f"the fleet process (pid {run['pid']}) ended without finishing its run: its attempts were abandoned"
    )
    ledger.abandon_run(run_id, gone)
    if store is not None:
        for attempt in attempts:
            store.release_attempt(run_id, int(attempt["id"]))
    return True
