"""The guard ends the process groups of a killed fleet's direct commands, and only those."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from stellafleet.proc.guard import _still_that_group
from stellafleet.proc.pids import ProcessIdentity

# Plays the fleet: starts a guard and three process groups (a `sleep` leading each, with a child), has
# the guard watch them, forgets the second, then ends as the test says: killed, or after `bye`.
FLEET = textwrap.dedent(
    """\
    import os, subprocess, sys
    from stellafleet.proc.guard import Guard

    guard = Guard.start()
    groups = []
    for _ in range(3):
        leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
        guard.watch(leader.pid)
        groups.append(leader.pid)
    guard.forget(groups[1])
    print(" ".join(map(str, groups)), flush=True)
    if sys.argv[1] == "bye":
        guard.close()
    sys.stdin.read()  # until the test kills it or closes its stdin
    """
)


def _members(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _wait_until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _fleet(tmp_path: Path, ending: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "fleet.py"
    script.write_text(FLEET)
    fleet = subprocess.Popen(
        [sys.executable, str(script), ending], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert fleet.stdout is not None
    groups = [int(pid) for pid in fleet.stdout.readline().split()]
    assert len(groups) == 3
    assert all(_wait_until(lambda g=g: len(_members(g)) >= 2) for g in groups)  # the child started
    return fleet, groups


def _end(groups: list[int]) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_a_killed_fleet_takes_the_groups_it_still_guards_with_it(tmp_path: Path) -> None:
    fleet, groups = _fleet(tmp_path, "killed")
    try:
        fleet.kill()
        fleet.wait()
        assert _wait_until(lambda: not _members(groups[0]) and not _members(groups[2]))
        assert len(_members(groups[1])) >= 2  # forgotten: it had ended, its number is no longer ours
    finally:
        _end(groups)


def test_a_fleet_that_said_bye_leaves_every_group_alone(tmp_path: Path) -> None:
    fleet, groups = _fleet(tmp_path, "bye")
    try:
        fleet.kill()
        fleet.wait()
        time.sleep(0.5)
        assert all(len(_members(pgid)) >= 2 for pgid in groups)
    finally:
        _end(groups)


def test_a_group_number_now_held_by_a_newer_process_is_not_the_group_the_fleet_named() -> None:
    me = ProcessIdentity.of()
    assert me is not None
    assert _still_that_group(me.pid, me)  # its leader still runs
    # the fleet named a group whose leader started an hour before the process that holds its pid now
    assert not _still_that_group(me.pid, ProcessIdentity(me.pid, me.started_at - 3600))
    ended = subprocess.Popen(["true"])
    ended.wait()
    # a leader that ended while members of its group may live on: still the group, to be ended
    assert _still_that_group(ended.pid, ProcessIdentity(ended.pid, time.time() - 1))
