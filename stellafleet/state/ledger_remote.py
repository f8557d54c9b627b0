"""The ledger's part in running attempts on other machines: where an attempt ran and its streamed spend.

On the fleet's machine: which executor a run used, the node each attempt ran on, and the spend a remote
attempt streams back, each event once however often it arrives (spend_events.seq is unique per attempt).
On the remote node: a scratch ledger holding just the one attempt, so the worker there records spend and
commits exactly as it does at home, and the remote task reads those rows back to stream them.
"""

from __future__ import annotations

from dataclasses import dataclass

from stellafleet.core.clock import wall_ms
from stellafleet.state.ledger import Ledger


@dataclass(frozen=True)
class SpendEvent:
    """One spend event of an attempt; seq orders it within the attempt and makes re-delivery harmless."""

    seq: int
    usd: float
    input_tokens: int
    output_tokens: int


# --- on the fleet's machine ---


def set_run_executor(ledger: Ledger, run_id: str, executor: str) -> None:
    with ledger._write() as conn:
        conn.execute("UPDATE runs SET executor = ? WHERE id = ?", (executor, run_id))


def set_attempt_node(ledger: Ledger, attempt_id: int, node: str) -> None:
    """The node a remote attempt runs on; it has no worktree on this machine (its clone is on the node)."""
    with ledger._write() as conn:
        conn.execute("UPDATE attempts SET node = ?, worktree = NULL WHERE id = ?", (node, attempt_id))


def add_streamed_spend(ledger: Ledger, attempt_id: int, event: SpendEvent) -> bool:
    """Add one streamed spend event to the attempt and its run; False (nothing changed) if seen before."""
    return ledger.add_spend(
        attempt_id,
        event.usd,
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        seq=event.seq,
    )


def set_attempt_steps(ledger: Ledger, attempt_id: int, steps: int) -> None:
    """The remote attempt's step count as its worker reported it (steps travel once, at the end)."""
    with ledger._write() as conn:
        conn.execute("UPDATE attempts SET steps = MAX(steps, ?) WHERE id = ?", (steps, attempt_id))


def mark_progress(ledger: Ledger, attempt_id: int) -> None:
    """A remote attempt was heard from (a heartbeat or any event): its last sign of progress is now."""
    with ledger._write() as conn:
        conn.execute("UPDATE attempts SET last_progress_ms = ? WHERE id = ?", (wall_ms(), attempt_id))


# --- on the remote node: the scratch ledger ---


def seed_attempt(
    ledger: Ledger, run_id: str, task_id: str, attempt_id: int, *, isolation: str, token_sha256: str | None
) -> None:
    """The one run, task and attempt (under the fleet's own ids) a remote worker records against; with the
    digest of the attempt's secret, so `stella commit` on the node can prove it acts for the attempt."""
    now = wall_ms()
    with ledger._write() as conn:
        conn.execute("INSERT INTO runs (id, created_at_ms) VALUES (?, ?)", (run_id, now))
        conn.execute(
            "INSERT INTO tasks (run_id, id, isolation, status) VALUES (?, ?, ?, 'running')",
            (run_id, task_id, isolation),
        )
        conn.execute(
            "INSERT INTO attempts (id, run_id, task_id, started_at_ms, token_sha256) VALUES (?, ?, ?, ?, ?)",
            (attempt_id, run_id, task_id, now, token_sha256),
        )


def spend_after(ledger: Ledger, attempt_id: int, after: int) -> list[SpendEvent]:
    """The attempt's spend events past seq `after` (a scratch ledger's row ids are the sequence)."""
    with ledger._lock:
        rows = ledger._conn.execute(
            "SELECT id, usd, input_tokens, output_tokens FROM spend_events"
            " WHERE attempt_id = ? AND id > ? ORDER BY id",
            (attempt_id, after),
        ).fetchall()
    return [SpendEvent(int(r[0]), float(r[1]), int(r[2]), int(r[3])) for r in rows]


def attempt_steps(ledger: Ledger, attempt_id: int) -> int:
    with ledger._lock:
        row = ledger._conn.execute("SELECT steps FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
    return int(row[0]) if row else 0
