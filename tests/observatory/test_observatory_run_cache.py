"""Finished runs' page documents are reused only while the ledger is unchanged; running runs never."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stellafleet.core.status import CIState
from stellafleet.observatory.runcache import RunPageCache
from stellafleet.state import dashboard
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import build_sample_ledger


def test_a_finished_run_is_rebuilt_only_after_a_ledger_write(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    ids = build_sample_ledger(db, live_pid=1)
    dashboard.load_run_page(db, "latest", now_ms=0)  # a first reader leaves an empty -wal file behind
    cache = RunPageCache(db, size=2)
    builds: list[str] = []

    def page(ref: str) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            builds.append(ref)
            return dashboard.load_run_page(db, ref, now_ms=0)

        return cache.get(ref, build)

    first = page(ids["ok"])
    again = page(ids["ok"])
    assert builds == [ids["ok"]] and again == first and again is not first
    again["poll_ms"] = 1  # a caller's additions never reach the kept document
    assert "poll_ms" not in page(ids["ok"])
    page(ids["running"])
    page(ids["running"])
    assert builds.count(ids["running"]) == 2  # a running run changes with the clock: never kept
    with Ledger.open(db) as ledger:  # CI reports on the finished run's branch after it ended
        ledger.upsert_ci(
            run_id=ids["ok"], branch="fleet/late", task_id="docs", head_sha="9" * 40, pr_url=None,
            pr_number=None, state=CIState.RED, conclusion="failure", reason=None, run_urls=[],
        )  # fmt: skip
    fresh = page(ids["ok"])
    assert builds.count(ids["ok"]) == 2 and [i["kind"] for i in fresh["attention"]] == ["red_ci"]
    page(ids["failed"])
    page(ids["failed"][:-2])  # a prefix is its own entry: three finished documents in a cache of two
    assert len(cache._entries) == 2 and ids["ok"] not in cache._entries
