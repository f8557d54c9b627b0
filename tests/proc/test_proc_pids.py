"""Liveness rule 2 with its one start-time tolerance: live, dead, zombie and recycled pids, and the edges."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from helpers.needs import missing

from stellafleet.core.clock import wall_ms
from stellafleet.proc.pids import (
    START_TIME_TOLERANCE_S,
    ProcessIdentity,
    in_pid_namespace_since,
    pid_alive,
    process_start_time,
    started_after,
)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_process_is_alive(sleeper: subprocess.Popen[bytes]) -> None:
    identity = ProcessIdentity.of(sleeper.pid)
    assert identity is not None and identity.pid == sleeper.pid
    assert identity.started_at == psutil.Process(sleeper.pid).create_time()
    assert identity.is_alive()
    assert pid_alive(sleeper.pid, int(time.time() * 1000))
    assert pid_alive(sleeper.pid, None)


def test_this_process_is_alive() -> None:
    me = ProcessIdentity.of()
    assert me is not None and me.pid == os.getpid() and me.is_alive()
    assert pid_alive(os.getpid(), int(time.time() * 1000))


def test_a_dead_process_is_not_alive() -> None:
    pid = exited_pid()
    assert ProcessIdentity.of(pid) is None
    assert process_start_time(pid) is None
    assert not ProcessIdentity(pid, time.time()).is_alive()
    assert not pid_alive(pid, int(time.time() * 1000))
    assert not pid_alive(pid, None)


def test_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        identity = ProcessIdentity.of(proc.pid)
        assert identity is not None
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not identity.is_alive()
        assert not pid_alive(proc.pid, None)
    finally:
        proc.wait()


def test_no_pid_is_not_alive() -> None:
    assert not pid_alive(None, None)
    assert not pid_alive(0, None)
    assert not pid_alive(-1, None)


def test_a_recycled_pid_is_not_the_recorded_process(sleeper: subprocess.Popen[bytes]) -> None:
    # The same pid number, recorded with a start time well before the process holding it now was created:
    # what a pid handed to a new process after the recorded one ended looks like.
    started = psutil.Process(sleeper.pid).create_time()
    assert not ProcessIdentity(sleeper.pid, started - 50).is_alive()
    me = ProcessIdentity.of()
    assert me is not None and not ProcessIdentity(me.pid, me.started_at - 50).is_alive()
    assert not pid_alive(sleeper.pid, 0)  # a ledger row from the epoch
    assert not pid_alive(os.getpid(), 0)


def test_a_process_started_before_its_record_still_counts(sleeper: subprocess.Popen[bytes]) -> None:
    # A pid is only reused after its process ended, so only a later start means a different process; an
    # earlier one is a record written after the start (a run's row) or a wall clock stepped back.
    started = psutil.Process(sleeper.pid).create_time()
    assert ProcessIdentity(sleeper.pid, started + 3600).is_alive()
    assert pid_alive(sleeper.pid, int((started + 3600) * 1000))


def test_the_start_time_tolerance_edge(sleeper: subprocess.Popen[bytes]) -> None:
    started = psutil.Process(sleeper.pid).create_time()
    assert ProcessIdentity(sleeper.pid, started - START_TIME_TOLERANCE_S).is_alive()
    assert not ProcessIdentity(sleeper.pid, started - START_TIME_TOLERANCE_S - 0.01).is_alive()
    assert not started_after(started, started - START_TIME_TOLERANCE_S)
    assert started_after(started, started - START_TIME_TOLERANCE_S - 0.01)


def test_a_ledger_rows_moment_takes_the_same_tolerance(sleeper: subprocess.Popen[bytes]) -> None:
    # A ledger row holds whole milliseconds: a millisecond inside the tolerance, then one outside it.
    edge_ms = (psutil.Process(sleeper.pid).create_time() - START_TIME_TOLERANCE_S) * 1000
    assert pid_alive(sleeper.pid, math.ceil(edge_ms) + 1)
    assert not pid_alive(sleeper.pid, math.floor(edge_ms) - 1)


NAMESPACE_CHECK = (
    "import sys\n"
    "from stellafleet.proc.pids import in_pid_namespace_since\n"
    "sys.exit(0 if in_pid_namespace_since(int(sys.argv[1])) else 3)\n"
)


def _in_new_pid_namespace(since_ms: int) -> int:
    """Exit status of the check run as pid 1 of a PID namespace (with its own /proc) made just now."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        missing("making a PID namespace needs root and unshare(1)")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAMESPACE_CHECK]
    argv.append(str(since_ms))
    return subprocess.run(argv, capture_output=True, timeout=60).returncode


def test_a_sandbox_made_right_after_the_attempt_started_is_recognised_as_made_since() -> None:
    # pid 1 of the new namespace starts milliseconds after since_ms; psutil's start times, built on a boot
    # time in whole seconds, read it up to a second early (a Codex sandbox made at once was refused)
    assert _in_new_pid_namespace(wall_ms()) == 0
    # a namespace made a minute before the attempt is not one made inside it
    assert _in_new_pid_namespace(wall_ms() + 60_000) == 3
    # nor is the machine's own namespace, made at boot
    assert not in_pid_namespace_since(wall_ms())
