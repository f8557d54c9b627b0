"""Many worker processes adding spend at once: nothing lost, to the cent."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers.spawn import run_together

from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run

PROCESSES = 8
ADDS = 150


def _spender(
    path: str, own_attempt: int, shared_attempt: int, seed: int, barrier: object, out: object
) -> None:
    rng = random.Random(seed)
    reported_micro = 0  # exact integer micro-dollars, what this process says it spent
    tokens = 0
    barrier.wait()  # type: ignore[attr-defined]
    with Ledger.open(Path(path)) as ledger:
        for i in range(ADDS):
            micro = rng.randint(1, 250_000)  # $0.000001 .. $0.25 per model call
            attempt = own_attempt if i % 3 else shared_attempt
            ledger.spend.add(attempt, micro / 1_000_000, input_tokens=micro % 1000, output_tokens=1, steps=1)
            reported_micro += micro
            tokens += micro % 1000
    out.put((own_attempt, reported_micro, tokens))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_eight_processes_adding_spend_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Ledger.open(db) as ledger:
        add_run(ledger, "r-spend", base_ref="HEAD", max_concurrency=PROCESSES, argv=[], root="/", pid=1)
        shared = ledger.attempts.start("r-spend", "shared", pipeline="command")
        own = [ledger.attempts.start("r-spend", f"t{n}", pipeline="command") for n in range(PROCESSES)]
    reports = run_together(_spender, lambda n: (str(db), own[n], shared, n), PROCESSES)
    reported_usd = sum(r[1] for r in reports) / 1_000_000
    with Ledger.open(db, readonly=True) as ledger:
        total = ledger.spend.of_run("r-spend")
        run = ledger.get_run("r-spend")
    attempts_total = sum(a["spend_usd"] for a in run["attempts"])
    assert round(total, 2) == round(reported_usd, 2)
    assert abs(total - reported_usd) < 1e-6 and abs(attempts_total - reported_usd) < 1e-6
    assert sum(a["steps"] for a in run["attempts"]) == PROCESSES * ADDS
    assert sum(a["input_tokens"] for a in run["attempts"]) == sum(r[2] for r in reports)
    import sqlite3

    conn = sqlite3.connect(db)
    events, event_usd = conn.execute(
        "SELECT count(*), sum(usd) FROM spend_events WHERE run_id = 'r-spend'"
    ).fetchone()
    conn.close()
    assert events == PROCESSES * ADDS and abs(event_usd - reported_usd) < 1e-6
