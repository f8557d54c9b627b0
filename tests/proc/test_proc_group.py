"""stop_group: SIGTERM to a process group, a grace period, SIGKILL to what is left; real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stellafleet.proc.group import group_exists, signal_group, stop_group

# Prints the pid of a grandchild left running in the group, then waits; the grandchild ignores SIGTERM.
LEADER_WITH_STUBBORN_CHILD = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""

IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(60)"
)


def start(code: str) -> subprocess.Popen[str]:
    """A python process leading its own process group, its stdout piped."""
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return gone(pid)


def test_a_leader_that_honours_sigterm_ends_by_it() -> None:
    leader = start("import time; print('ready', flush=True); time.sleep(60)")
    assert leader.stdout is not None and leader.stdout.readline() == "ready\n"
    stop_group(leader.pid, 30.0, leader=leader)
    assert leader.returncode == -signal.SIGTERM
    assert not group_exists(leader.pid)


def test_a_leader_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    leader = start(IGNORES_TERM)
    assert leader.stdout is not None and leader.stdout.readline() == "ready\n"
    stop_group(leader.pid, 0.2, leader=leader)
    assert leader.returncode == -signal.SIGKILL


def test_no_grace_kills_at_once() -> None:
    leader = start("import time; print('ready', flush=True); time.sleep(60)")
    assert leader.stdout is not None and leader.stdout.readline() == "ready\n"
    stop_group(leader.pid, 0, leader=leader)
    assert leader.returncode == -signal.SIGKILL  # no SIGTERM first, which it would have honoured


def test_members_that_outlive_the_leader_are_killed_too() -> None:
    leader = start(LEADER_WITH_STUBBORN_CHILD)
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    stop_group(leader.pid, 5.0, leader=leader)
    assert leader.returncode == -signal.SIGTERM
    assert wait_gone(grandchild), "a member of the group outlived the stop"


def test_a_group_that_is_already_gone_is_no_error() -> None:
    leader = start("pass")
    leader.wait()
    assert not signal_group(leader.pid, signal.SIGTERM)
    stop_group(leader.pid, 5.0)  # returns at once: nothing to wait for
    stop_group(leader.pid, 5.0, leader=leader)
    assert leader.returncode == 0


DETACHED_SLEEPER = """
import subprocess, sys
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
sleeper = subprocess.Popen(sleep, start_new_session=True, **quiet)
print(sleeper.pid)
"""


def test_a_group_whose_leader_is_not_our_child_is_stopped_too() -> None:
    # The starter exits at once, so the sleeper (leading its own group) is reparented away from us.
    starter = subprocess.run(
        [sys.executable, "-c", DETACHED_SLEEPER], capture_output=True, text=True, check=True
    )
    pgid = int(starter.stdout)
    assert os.getpgid(pgid) == pgid
    stop_group(pgid, 10.0)
    assert wait_gone(pgid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_signal_group_reports_whether_the_group_was_there(sig: int) -> None:
    leader = start("import time; print('ready', flush=True); time.sleep(60)")
    assert leader.stdout is not None and leader.stdout.readline() == "ready\n"
    assert signal_group(leader.pid, sig)
    assert leader.wait(timeout=10) == -sig
    assert not signal_group(leader.pid, sig)


def test_a_set_stops_what_carries_its_identity_but_never_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process the set was not given is found by the attempt's identity in its environment; a stop made
    by a process carrying that same identity (a stella run inside the attempt) leaves the attempt be."""
    from stellafleet.proc.group import IDENTITY_KEYS, ProcessSet

    ids = dict(zip(IDENTITY_KEYS, ("/nowhere", "r-1", f"{os.getpid()}"), strict=True))
    with subprocess.Popen(["sleep", "60"], env={**os.environ, **ids}) as carrier:
        try:
            monkeypatch.setattr(os, "environ", {**os.environ, **ids})
            ProcessSet(identity=ids).stop(0.2)
            assert carrier.poll() is None
            monkeypatch.undo()
            ProcessSet(identity=ids).stop(0.2)
            assert carrier.wait(10) == -signal.SIGTERM
        finally:
            carrier.kill()
