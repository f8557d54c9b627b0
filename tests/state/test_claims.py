"""File claims on a real store.db: all-or-nothing acquire, the conflict message, staleness, the lane."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stellafleet.core.errors import ClaimConflict, StellaError
from stellafleet.state import claims
from stellafleet.state.claims import ClaimStore, Holder, normalize_path
from stellafleet.state.sqlitefile import Database, Schema
from stellafleet.testing.clock import FakeClock


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / ".stella" / "private" / "store.db"


@pytest.fixture
def store(store_path: Path) -> Iterator[ClaimStore]:
    with ClaimStore.open(store_path) as opened:
        yield opened


def holder(
    task: str, attempt: int, *, run: str = "r-20261130-aaaa", title: str = "", pid: int | None = None
) -> Holder:
    return Holder.current(run, task, title or f"Title of {task}", attempt, pid)


def live_holder(store: ClaimStore, path: str) -> Holder | None:
    """The live holder of path, or None when it is free or its holder is dead (stale)."""
    found = dict(store.claims()).get(path)
    return found if found is not None and found.is_alive() else None


class HoldingProcess:
    """A real process that takes claims (or the commit lane) and then waits to be killed."""

    def __init__(self, store_path: Path, code: str) -> None:
        script = (
            textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from stellafleet.state.claims import ClaimStore, Holder
            store = ClaimStore.open(Path({str(store_path)!r}))
            me = Holder.current("r-other", "reader", "Read path", 7)
        """)
            + textwrap.dedent(code)
            + "\nprint('holding', flush=True)\ntime.sleep(120)\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "holding", line
        self.pid = self.proc.pid

    def kill(self) -> None:
        """SIGKILL, and leave it unreaped: a zombie still has its pid but is not a live holder."""
        os.kill(self.pid, signal.SIGKILL)
        proc = psutil.Process(self.pid)
        for _ in range(400):
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
            time.sleep(0.005)
        raise AssertionError(f"process {self.pid} did not die")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def test_acquire_is_all_or_nothing_and_names_the_holder(store: ClaimStore) -> None:
    reader = holder("reader", 1, title="Read path")
    store.acquire(["src/store/read.rs", "src/store/schema.rs"], reader)
    writer = holder("writer", 2, title="Write path")
    with pytest.raises(ClaimConflict) as caught:
        store.acquire(["src/store/write.rs", "./src//store/schema.rs"], writer)
    assert str(caught.value) == (
        f'claim conflict: src/store/schema.rs is held by task "reader" (Read path) '
        f"(run r-20261130-aaaa, pid {os.getpid()})"
    )
    assert caught.value.exit_code == 1
    assert live_holder(store, "src/store/write.rs") is None  # nothing of the failed acquire stayed
    assert live_holder(store, "src/store/schema.rs") == reader
    assert store.release_attempt("r-20261130-aaaa", 1) == 2
    store.acquire(["src/store/write.rs", "src/store/schema.rs"], writer)
    assert [path for path, _ in store.claims()] == ["src/store/schema.rs", "src/store/write.rs"]


def test_another_fleet_run_in_the_same_repository_conflicts_too(store_path: Path) -> None:
    with ClaimStore.open(store_path) as first, ClaimStore.open(store_path) as second:
        first.acquire(["Cargo.toml"], holder("t1", 1, run="r-one"))
        with pytest.raises(ClaimConflict, match=r'held by task "t1" \(Title of t1\) \(run r-one, pid \d+\)'):
            second.acquire(["Cargo.toml"], holder("t1", 1, run="r-two"))


def test_the_same_attempt_never_conflicts_with_itself_even_from_another_process(store: ClaimStore) -> None:
    fleet_side = holder("t1", 5)
    store.acquire(["a.py"], fleet_side)
    parent = psutil.Process().ppid()
    worker_side = holder("t1", 5, pid=parent)  # another live process acting for the same attempt
    store.acquire(["a.py", "b.py"], worker_side)
    store.touch("a.py", worker_side)
    store.touch("c.py", worker_side)
    assert live_holder(store, "a.py") == fleet_side and live_holder(store, "c.py") == worker_side
    with pytest.raises(ClaimConflict, match=r'c\.py is held by task "t1"'):
        store.touch("c.py", holder("t2", 6))
    assert store.release_attempt("r-20261130-aaaa", 5) == 3
    assert store.release_attempt("r-20261130-aaaa", 5) == 0


def test_paths_are_compared_in_one_spelling(store: ClaimStore) -> None:
    assert normalize_path("./src//a.py") == "src/a.py" == normalize_path("src/x/../a.py")
    for bad in ("", ".", "/etc/passwd", "../outside", "a/../../b"):
        with pytest.raises(StellaError, match="relative to the workspace"):
            store.acquire([bad], holder("t", 1))


def test_a_claim_of_a_dead_process_is_reclaimed_and_logged(
    store: ClaimStore, caplog: pytest.LogCaptureFixture
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = Holder("r-old", "writer", "Write path", 3, gone.pid, 1_000_000.0)
    store.acquire(["src/w.rs"], dead)  # recorded as it was by a process that has since exited
    reused = Holder(
        "r-old", "other", "Other", 4, os.getpid(), Holder.current("r", "t", "", 1).pid_started - 50
    )
    store.acquire(["src/reused.rs"], reused)  # our pid, but a different start time: a reused pid
    assert live_holder(store, "src/w.rs") is None and live_holder(store, "src/reused.rs") is None
    caplog.set_level(logging.WARNING, logger="stellafleet.state.claims")
    me = holder("t9", 9)
    store.acquire(["src/w.rs", "src/reused.rs", "src/new.rs"], me)
    assert all(live_holder(store, p) == me for p in ("src/w.rs", "src/reused.rs", "src/new.rs"))
    messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == "stellafleet.state.claims" and r.levelno == logging.WARNING
    ]
    assert (
        f'reclaimed stale claim on src/w.rs from task "writer" (Write path) (run r-old, pid {gone.pid})'
        in messages[0]
    )
    assert "src/reused.rs" in messages[1] and f"pid {os.getpid()}" in messages[1]


def test_a_holder_killed_mid_hold_loses_its_claims_to_the_next_acquirer(
    store: ClaimStore, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = HoldingProcess(store_path, "store.acquire(['src/store/read.rs', 'src/shared.rs'], me)")
    try:
        with pytest.raises(ClaimConflict) as caught:
            store.acquire(["src/shared.rs"], holder("writer", 2))
        assert str(caught.value) == (
            'claim conflict: src/shared.rs is held by task "reader" (Read path) '
            f"(run r-other, pid {victim.pid})"
        )
        victim.kill()
        caplog.set_level(logging.WARNING, logger="stellafleet.state.claims")
        store.acquire(["src/shared.rs", "src/store/read.rs"], holder("writer", 2))
        assert live_holder(store, "src/shared.rs") == holder("writer", 2)
        logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "stellafleet.state.claims")
        for path in ("src/shared.rs", "src/store/read.rs"):
            assert (
                f'reclaimed stale claim on {path} from task "reader" (Read path) '
                f"(run r-other, pid {victim.pid})" in logged
            )
    finally:
        victim.close()


def test_commit_lane_is_one_holder_at_a_time_with_a_bounded_wait(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "LANE_POLL_S", 0.25)  # binary-exact: 1.5 s is exactly six polls
    clock = FakeClock()
    with ClaimStore.open(store_path, clock=clock) as store:
        first, second = holder("t1", 1), holder("t2", 2)
        with store.commit_lane(first):
            assert store.lane_holder() == first
            held = r'commit lane is still held by task "t1" .* after 1.5s'
            with pytest.raises(StellaError, match=held), store.commit_lane(second, timeout=1.5):
                pytest.fail("entered a held lane")
            assert clock.sleeps == [0.25] * 6 and clock.now() == 1.5  # not one poll more, nor one less
        assert store.lane_holder() is None
        with store.commit_lane(second, timeout=0):
            assert store.lane_holder() == second
        with pytest.raises(RuntimeError), store.commit_lane(first):
            raise RuntimeError("the commit failed")
        assert store.lane_holder() is None  # released on the way out of an error too


def test_commit_lane_of_a_killed_process_is_taken_over(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = HoldingProcess(store_path, "lane = store.commit_lane(me)\nlane.__enter__()")
    try:
        clock = FakeClock()
        with ClaimStore.open(store_path, clock=clock) as store:
            assert store.lane_holder() is not None and store.lane_holder().pid == victim.pid  # type: ignore[union-attr]
            with (
                pytest.raises(
                    StellaError,
                    match=f'still held by task "reader" \\(Read path\\) \\(run r-other, pid {victim.pid}\\)',
                ),
                store.commit_lane(holder("t1", 1), timeout=0.1),
            ):
                pass
            victim.kill()
            caplog.set_level(logging.WARNING, logger="stellafleet.state.claims")
            with store.commit_lane(holder("t1", 1), timeout=0):
                assert store.lane_holder() == holder("t1", 1)
        logged = [r.getMessage() for r in caplog.records if r.name == "stellafleet.state.claims"]
        assert logged == [
            f'took over the commit lane from task "reader" (Read path) (run r-other, pid {victim.pid}): '
            "that process is no longer running"
        ]
    finally:
        victim.close()


def test_the_store_refuses_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"not sqlite at all")
    with pytest.raises(StellaError, match="is not a claim store"):
        ClaimStore.open(path)
    assert path.read_bytes() == b"not sqlite at all"


def test_write_spans_are_reported_opened_closed_once_and_dropped(store: ClaimStore) -> None:
    assert store.write_spans("r-1", 1) is None  # a pipeline that reports none: covered for its whole run
    store.report_spans("r-1", 1)
    assert store.write_spans("r-1", 1) == []
    store.open_span("r-1", 1, "b", 300)
    store.open_span("r-1", 1, "a", 100)
    store.open_span("r-1", 1, "a", 999)  # the same call seen twice keeps its start
    store.close_span("r-1", 1, "a", 200)
    store.close_span("r-1", 1, "a", 250)  # closed once: a late duplicate changes nothing
    store.open_span("r-1", 2, "a", 5)  # another attempt's, unreported
    assert store.write_spans("r-1", 1) == [(100, 200), (300, None)]
    store.drop_spans("r-1", 1)
    assert store.write_spans("r-1", 1) is None
    assert store.write_spans("r-1", 2) is None


def test_an_older_store_gains_the_span_tables_when_opened(store_path: Path) -> None:
    old = Schema("claim store", claims.STORE_SCHEMA.application_id, claims.STORE_SCHEMA.migrations[:1])
    store_path.parent.mkdir(parents=True)
    Database(store_path, old, readonly=False, now_ms=lambda: 0).close()
    with ClaimStore.open(store_path) as store:
        store.report_spans("r-1", 1)
        assert store.write_spans("r-1", 1) == []
