"""The host's lease store: named locks all at once or none, oldest waiter first; ports leased once each,
verified free by binding; what a dead holder left reclaimed, but never a live holder's nor a port of a
worktree that still exists."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stellafleet.proc.pids import ProcessIdentity
from stellafleet.state.leases import LeaseHolder, LeaseStore, PortAsk, parse_range


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LeaseStore:
    monkeypatch.setenv("STELLA_HOST_STATE", str(tmp_path / "host"))
    with LeaseStore.open() as opened:
        yield opened


def holder(name: str, run: str = "r1", pid_of: ProcessIdentity | None = None) -> LeaseHolder:
    me = pid_of or ProcessIdentity.of()
    assert me is not None
    return LeaseHolder(f"token-{name}", "/repo", run, name, me.pid, me.started_at)


def test_locks_are_taken_all_at_once_and_the_oldest_waiter_goes_first(store: LeaseStore) -> None:
    assert store.try_locks(["db:test"], holder("a")) is None
    blocked = store.try_locks(["db:test", "port:5199"], holder("b"))
    assert blocked is not None and (blocked.lock, blocked.holder.task_id) == ("db:test", "a")
    # port:5199 is free, but b waits for it first: c, who asked later, does not take it from under b
    later = store.try_locks(["port:5199"], holder("c"))
    assert later is not None and (later.lock, later.holder.task_id, later.waiting) == ("port:5199", "b", True)
    assert {row["name"] for row in store.held()["locks"]} == {"db:test"}  # b holds nothing meanwhile

    store.release("token-a")
    assert store.try_locks(["port:5199"], holder("c")) is not None  # still b's turn
    assert store.try_locks(["db:test", "port:5199"], holder("b")) is None
    assert {(row["name"], row["task_id"]) for row in store.held()["locks"]} == {
        ("db:test", "b"),
        ("port:5199", "b"),
    }
    store.release("token-b")
    assert store.try_locks(["port:5199"], holder("c")) is None
    assert store.held()["waiting"] == []


def test_a_waiting_task_polls_on_the_clock_until_the_lock_is_free_or_the_run_stops(store: LeaseStore) -> None:
    store.try_locks(["db:test"], holder("a"))
    said = []

    class ReleasingClock:
        """Time for the waiter: a's attempt ends after its third poll."""

        sleeps = 0

        def now(self) -> float:
            return float(self.sleeps)

        def sleep(self, seconds: float) -> None:
            self.sleeps += 1
            if self.sleeps == 3:
                store.release("token-a")

    clock = ReleasingClock()
    taken = store.take(["db:test"], holder("b"), clock=clock, stop=threading.Event(), on_wait=said.append)
    assert taken == [] and clock.sleeps == 3
    assert [(b.lock, b.holder.task_id) for b in said] == [("db:test", "a")]  # said once, not per poll

    stop = threading.Event()
    stop.set()
    assert store.take(["db:test"], holder("c"), PortAsk(1, (30000, 30999)), clock=clock, stop=stop) is None
    assert store.held()["waiting"] == []  # a stopped waiter leaves the line


def test_ports_are_leased_once_each_across_repositories_and_skip_a_port_in_use(
    store: LeaseStore, tmp_path: Path
) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    span = (taken, taken + 40)
    leased: list[list[int]] = []

    def lease(number: int) -> None:
        who = holder(f"t{number}", run=f"r{number % 2}")
        leased.append(store.lease_ports(2, span, who))

    threads = [threading.Thread(target=lease, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy.close()
    ports = [port for pair in leased for port in pair]
    assert len(ports) == 32 and len(set(ports)) == 32  # no port given twice
    assert taken not in ports  # found in use by binding it
    with pytest.raises(Exception, match="no 10 free ports"):
        store.lease_ports(10, span, holder("late"))

    worktree = tmp_path / "wt"
    first = store.lease_ports(2, (30000, 30999), holder("w"), worktree)
    assert store.lease_ports(2, (30000, 30999), holder("w", run="r2"), worktree) == first  # its own, again
    assert store.ports_of(worktree) == first
    assert store.release_worktree(worktree) == first
    assert parse_range("20000-29999") == (20000, 29999)
    with pytest.raises(ValueError, match="FIRST-LAST"):
        parse_range("20000")


def test_a_killed_holders_leases_are_reclaimed_but_a_live_ones_and_an_existing_worktrees_are_not(
    store: LeaseStore, tmp_path: Path
) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = ProcessIdentity.of(other.pid)
        assert alive is not None
        store.try_locks(["db:test"], holder("live", pid_of=alive))
        assert store.try_locks(["db:test"], holder("me")) is not None  # a live holder's lock stays its own
        worktree = tmp_path / "kept-worktree"
        worktree.mkdir()
        kept = store.lease_ports(1, (31000, 31999), holder("live", pid_of=alive), worktree)
        gone = store.lease_ports(1, (31000, 31999), holder("live", pid_of=alive), tmp_path / "no-such")
        shared = store.lease_ports(1, (31000, 31999), holder("live", pid_of=alive))
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
    store.reclaim()  # what the next command on the host does first
    held = store.held()
    assert held["locks"] == []
    assert [row["task_id"] for row in held["waiting"]] == ["me"]  # a live waiter keeps its place in line
    assert {row["port"] for row in held["ports"]} == set(kept)  # its worktree still exists
    assert not set(gone + shared) & {row["port"] for row in held["ports"]}
    assert store.try_locks(["db:test"], holder("me")) is None
