"""Counts and durations: one rule each, with the two variants users see."""

from __future__ import annotations

from stellafleet.core.words import duration_text, plural


def test_plural() -> None:
    assert [plural(n, "task") for n in (0, 1, 2)] == ["0 tasks", "1 task", "2 tasks"]


def test_a_measured_duration() -> None:
    assert [duration_text(s) for s in (2, 59.94, 61.9, 3599, 3600, 7322)] == [
        "2.0s", "59.9s", "1m01s", "59m59s", "1h00m", "2h02m",
    ]  # fmt: skip


def test_a_set_amount_reads_as_written_and_a_column_is_spaced() -> None:
    assert [duration_text(s, as_set=True) for s in (30, 1.5, 600, 7200)] == ["30s", "1.5s", "10m00s", "2h00m"]
    assert [duration_text(s, spaced=True) for s in (5.25, 189, 3720)] == ["5.2s", "3m 09s", "1h 02m"]
