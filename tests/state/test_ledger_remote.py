"""Streamed spend lands once per (attempt, seq); the node and the executor are recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_attempts import SpendEvent
from stellafleet.testing.sample_ledger import add_run


def test_streamed_spend_counts_once_however_often_it_arrives(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "fleet.db") as ledger:
        add_run(ledger, "r1", argv=[], root=str(tmp_path), pid=1)
        attempt = ledger.attempts.start("r1", "t1", pipeline="command", worktree="/nowhere")
        first = SpendEvent(seq=1, usd=0.25, input_tokens=10, output_tokens=2)
        assert ledger.spend.add(attempt, **dataclasses.asdict(first))
        assert not ledger.spend.add(attempt, **dataclasses.asdict(first))  # re-delivered: ignored
        assert ledger.spend.add(attempt, **dataclasses.asdict(SpendEvent(2, 0.5, 0, 0)))
        assert ledger.spend.of_attempt(attempt) == pytest.approx(0.75)
        assert ledger.spend.of_run("r1") == pytest.approx(0.75)
        ledger.attempts.set_node(attempt, "node-b")
        ledger.runs.set_executor("r1", "ray")
        record = ledger.get_run("r1")
    assert record["run"]["executor"] == "ray"
    assert record["attempts"][0]["node"] == "node-b" and record["attempts"][0]["worktree"] is None
    assert record["attempts"][0]["input_tokens"] == 10


def test_a_scratch_ledger_holds_the_fleets_attempt_and_reads_its_spend_back(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "scratch.db") as ledger:
        ledger.seed_attempt("r1", "t1", 42, isolation="isolated", token_sha256=None)
        ledger.spend.add(42, 0.1, input_tokens=5, steps=3)
        ledger.spend.add(42, 0.2, output_tokens=7)
        events = ledger.spend.after(42, 0)
        assert [(e.usd, e.input_tokens, e.output_tokens) for e in events] == [(0.1, 5, 0), (0.2, 0, 7)]
        assert ledger.spend.after(42, events[0].seq) == events[1:]
        assert ledger.attempts.steps(42) == 3
