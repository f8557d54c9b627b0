"""Finished runs' encoded page bodies are reused only while the ledger is unchanged; running runs never."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from stellafleet.core.status import CIState
from stellafleet.observatory.runcache import GZIP_FROM_BYTES, Body, RunPageCache
from stellafleet.state import dashboard, runpage
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import build_sample_ledger


def test_a_finished_run_is_rebuilt_only_after_a_ledger_write(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    ids = build_sample_ledger(db, live_pid=1)
    dashboard.load_run_page(db, "latest", now_ms=0)  # a first reader leaves an empty -wal file behind
    cache = RunPageCache(db, size=2)
    builds: list[str] = []

    def page(ref: str) -> Body:
        def build() -> dict[str, Any]:
            builds.append(ref)
            return runpage.load_first_view(db, ref, now_ms=0)

        return cache.get(("page", ref), build)

    first = page(ids["ok"])
    assert page(ids["ok"]) is first and builds == [ids["ok"]]  # the same bytes, not built again
    assert json.loads(first.raw)["run"]["id"] == ids["ok"]
    page(ids["running"])
    page(ids["running"])
    assert builds.count(ids["running"]) == 2  # a running run changes with the clock: never kept
    with Ledger.open(db) as ledger:  # CI reports on the finished run's branch after it ended
        ledger.ci.upsert(
            run_id=ids["ok"], branch="fleet/late", task_id="docs", head_sha="9" * 40, pr_url=None,
            pr_number=None, state=CIState.RED, conclusion="failure", reason=None, run_urls=[],
        )  # fmt: skip
    fresh = page(ids["ok"])
    assert builds.count(ids["ok"]) == 2
    assert [i["kind"] for i in json.loads(fresh.raw)["attention"]] == ["red_ci"]
    page(ids["failed"])
    page(ids["failed"][:-2])  # a prefix is its own entry: three finished documents in a cache of two
    assert len(cache._entries) == 2 and ("page", ids["ok"]) not in cache._entries


def test_a_body_is_gzipped_only_for_a_client_that_takes_it_and_only_when_it_helps() -> None:
    big = Body({"run": {"status": "succeeded"}, "bars": ["succeeded"] * 2000})
    sent, encoding = big.encoded(accept_gzip=True)
    assert encoding == "gzip" and gzip.decompress(sent) == big.raw and len(sent) < len(big.raw) / 10
    assert big.encoded(accept_gzip=True)[0] is sent  # compressed once
    assert big.encoded(accept_gzip=False) == (big.raw, None)
    small = Body({"run": {"status": "succeeded"}})
    assert len(small.raw) < GZIP_FROM_BYTES and small.encoded(accept_gzip=True) == (small.raw, None)
    assert Body({"run": {"status": "running"}}).finished is False
    strict = Body({"run": {"status": "failed"}, "usd": float("nan"), "top": float("inf")})
    assert json.loads(strict.raw) == {"run": {"status": "failed"}, "usd": None, "top": None}
