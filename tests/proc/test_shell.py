"""proc/shell.py: a user's setup/teardown command, run for real, its output in the log, how it ended."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
