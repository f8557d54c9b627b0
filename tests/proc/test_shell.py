"""proc/shell.py: a user's setup/teardown command, run for real, its output in the log, how it ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers.fleet import wait_for
from helpers.spawn import ended_within

from stellafleet.proc import shell


def test_its_output_goes_to_the_log_between_stellas_lines(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    done = shell.run_logged(
        "setup",
        "echo out; echo err >&2; exit 2",
        cwd=tmp_path,
        env=dict(os.environ),
        log_path=log,
        timeout=30,
    )
    assert done.exit_code == 2 and not done.ok
    assert done.describe(30).startswith("exit 2 after ")
    lines = log.read_text().splitlines()
    assert lines[0] == "[stella] setup: echo out; echo err >&2; exit 2"
    assert lines[1:3] == ["out", "err"]
    assert lines[3].startswith("[stella] setup exit 2 after ")


def test_a_timeout_stops_the_command_and_says_so(tmp_path: Path) -> None:
    done = shell.run_logged(
        "setup", "sleep 30", cwd=tmp_path, env=dict(os.environ), log_path=tmp_path / "l", timeout=0.3
    )
    assert done.exit_code is None and done.seconds < 10
    assert done.describe(0.3).startswith("timed out after ") and done.describe(0.3).endswith("(limit 0.3 s)")


def test_stop_ends_a_running_command_at_once(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    done = shell.run_logged(
        "setup",
        "sleep 30",
        cwd=tmp_path,
        env=dict(os.environ),
        log_path=tmp_path / "l",
        timeout=60,
        stop=stop,
    )
    assert done.seconds < 10 and done.error is not None and "the run is being stopped" in done.error


def test_a_timeout_ends_what_the_command_left_outside_its_group_and_tree(tmp_path: Path) -> None:
    """A setup that double-forks a daemon into a session of its own: its attempt's identity, which the
    daemon inherited, names it when the setup is stopped. Another repository's same ids are left alone."""
    ids = {"STELLA_ROOT": str(tmp_path), "STELLA_RUN_ID": "r-1", "STELLA_ATTEMPT_ID": "1"}
    theirs = {**os.environ, **ids, "STELLA_ROOT": str(tmp_path / "theirs")}
    pidfile = tmp_path / "daemon.pid"
    daemon = f"(setsid sleep 300 & echo $! > {pidfile}); sleep 300"
    with subprocess.Popen(["sleep", "300"], env=theirs) as other:
        try:
            done = shell.run_logged(
                "setup", daemon, cwd=tmp_path, env={**os.environ, **ids}, log_path=tmp_path / "l", timeout=1
            )
            assert done.exit_code is None
            assert ended_within(int(pidfile.read_text()), 10.0)
            assert other.poll() is None
        finally:
            other.kill()


SETUP_OF_A_FLEET = """\
import os, sys
from pathlib import Path
from stellafleet.proc import shell
here = Path(sys.argv[1])
shell.run_logged("setup", sys.argv[2], cwd=here, env=dict(os.environ), log_path=here / "l", timeout=600)
"""


def test_a_setup_ends_when_the_process_that_started_it_is_sigkilled(tmp_path: Path) -> None:
    """A fleet SIGKILLed during `[worktree] setup`: the setup (a make, here a sleep it started in the
    background) is stopped with it, never left writing the worktree."""
    pidfile = tmp_path / "make.pid"
    setup = f"sleep 300 & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait"
    with subprocess.Popen([sys.executable, "-c", SETUP_OF_A_FLEET, str(tmp_path), setup]) as fleet:
        try:
            wait_for(pidfile, 60, process=fleet)
            fleet.send_signal(signal.SIGKILL)
        finally:
            fleet.kill()
    make = int(pidfile.read_text())
    try:
        assert ended_within(make, 10.0), "the setup outlived its fleet"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(make, signal.SIGKILL)
