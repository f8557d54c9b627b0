"""The user's check command, run on a merged result in the scratch worktree.

Under the child subreaper, so a timeout stops everything it started, double forks too; of its output
(to a file, not a pipe) only the last lines are kept.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stellafleet.proc import runner
from stellafleet.proc.subreaper import reaped_argv

STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    exit_code: int | None  # None: it ran out of time
    tail: str  # its last lines


def tail_lines(text: str, lines: int) -> str:
    kept = [line.rstrip() for line in text.rstrip().splitlines()][-lines:]
    return "\n".join(kept)


def run_check(
    command: str,
    cwd: Path,
    *,
    timeout_s: float,
    tail: int,
    env: dict[str, str],
    on_start: Callable[[int], None] | None = None,
) -> CheckResult:
    """Run command in cwd with env over ours; passed when it exits 0 within timeout_s. on_start is told
    the pid (and process group) it runs as, for the merge's journal."""
    with tempfile.TemporaryFile(mode="w+b") as output:
        done = runner.run(
            reaped_argv(["/bin/sh", "-c", command]),  # what it leaves running ends with it
            cwd=cwd,
            env={**os.environ, **env},
            timeout=timeout_s,
            grace_s=STOP_GRACE_S,
            stdout=output,
            stderr=runner.STDOUT,
            on_start=on_start,
        )
        output.seek(0)
        text = output.read().decode("utf-8", "replace")
    code = None if done.timed_out else done.returncode
    shown = tail_lines(text, tail)
    if code is None:
        shown = (
            shown + "\n" if shown else ""
        ) + f"(stopped after {timeout_s:g}s: check_timeout under [merge])"
    return CheckResult(code == 0, code, shown)
