"""A user's shell command (`[worktree] setup` and `teardown`) run to its end with its output in a log, in
its own process group under the child subreaper, so a timeout, or the death of the stella process that
started it, stops everything it started."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stellafleet.proc import runner
from stellafleet.proc.subreaper import reaped_argv
from stellafleet.proc.tree import ProcessTree

STOP_GRACE_S = 2.0
POLL_S = 0.02  # how often a running command is checked for its end, timeout or stop


@dataclass(frozen=True)
class ShellRun:
    exit_code: int | None  # None: it ran out of time (or could not start: see `error`)
    seconds: float
    error: str | None = None
    cpu_seconds: float = 0.0  # user + system of the command and all it waited for (0: it was stopped)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self, timeout: float) -> str:
        """How it ended, in words: `exit 2 after 3.1 s`, `timed out after 600.0 s`."""
        if self.error is not None:
            return self.error
        if self.exit_code is None:
            return f"timed out after {self.seconds:.1f} s (limit {timeout:g} s)"
        if self.exit_code < 0:
            return f"killed by signal {-self.exit_code} after {self.seconds:.1f} s"
        return f"exit {self.exit_code} after {self.seconds:.1f} s"


def log_line(log_path: Path, text: str) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"[stella] {text}\n")


def run_logged(
    label: str,
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
    stop: threading.Event | None = None,
) -> ShellRun:
    """Run command in cwd with exactly env, output appended to log_path, until it ends, its timeout
    passes or stop is set (then its group is stopped); how it ended."""
    log_line(log_path, f"{label}: {command}")
    started = time.monotonic()
    stop = stop or threading.Event()
    try:
        with log_path.open("ab") as log:
            proc = runner.start(  # under the subreaper: all it starts ends with it, or with its fleet
                reaped_argv(["/bin/sh", "-c", command], with_parent=True),
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=runner.STDOUT,
            )
    except OSError as exc:
        result = ShellRun(None, time.monotonic() - started, f"could not start /bin/sh: {exc}")
    else:
        with proc:
            tree = ProcessTree(proc)  # its wait4 gives the CPU of the whole tree the wrapper reaped
            while tree.poll() is None and not stop.is_set() and time.monotonic() - started < timeout:
                stop.wait(POLL_S)
            if tree.poll() is None:  # what carries the attempt's identity goes too, double forks included
                proc.stop(STOP_GRACE_S, identity=env)
            cpu = exit_.cpu_seconds if (exit_ := tree.poll()) is not None else 0.0
        seconds = time.monotonic() - started
        if stop.is_set() and proc.returncode != 0:
            result = ShellRun(None, seconds, f"stopped after {seconds:.1f} s: the run is being stopped")
        else:
            code = None if seconds >= timeout and proc.returncode != 0 else proc.returncode
            result = ShellRun(code, seconds, cpu_seconds=cpu)
    ended = f"done in {result.seconds:.1f} s" if result.ok else result.describe(timeout)
    log_line(log_path, f"{label} {ended}")
    return result
