"""Every bench script still runs end to end (at toy sizes), so a refactor cannot silently break one.

The figures at these sizes mean nothing; the full-size runs are what the docs and notes quote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
OBSERVATORY_TOY = "--runs 60 --attempts-per-run 2 --repeat 3 --tasks 20 --big-attempts 40 --spend-events 200"
OBSERVATORY_TOY += " --log-mb 1 --no-browser"


FLEET_OVERHEAD_TOY = ["--tasks", "4", "--concurrency", "2", "--seconds", "0.2", "--files", "50"]


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("plan_scale.py", ["--tasks", "200", "--edges", "400", "--repeat", "1"], "ratio total / baseline"),
        ("claims_throughput.py", ["--seconds", "0.2", "--processes", "2"], "pairs/s"),
        ("ledger_listing.py", ["--runs", "120"], "list_runs first page"),
        ("observatory.py", OBSERVATORY_TOY.split(), "log tail"),
        ("engine_tools.py", ["--files", "300", "--repeat", "1"], "git grep"),
        ("stack.py", ["--files", "50", "--fan", "2", "--depth", "2", "--repeat", "1"], "worst per task"),
        ("schedule.py", ["--tasks", "6", "--concurrency", "2", "--scale", "0.05"], "lower bound"),
        ("lane_user_git.py", ["--tasks", "3", "--concurrency", "2"], "user git calls"),
        (
            "git_guard.py",
            ["--calls", "3", "--files", "20", "--workers", "2", "--hook-seconds", "0.1"],
            "guard adds",
        ),
        ("bootstrap.py", ["--mb", "1", "--worktrees", "2", "--skip-fleet"], "ratio stellafleet / cp -r"),
        ("check_overhead.py", ["--files", "50", "--rounds", "1"], "what a check adds per task"),
        (
            "fleet_limits.py",
            ["--tasks", "2", "--concurrency", "2", "--reads", "2", "--limited", "1", "--retry-after", "0.5"],
            "model calls saved",
        ),
        (
            "fleet_overhead.py",
            FLEET_OVERHEAD_TOY,
            "the lower bound",
        ),
    ],
)
def test_bench_script_runs(script: str, args: list[str], expected: str, tmp_path: Path) -> None:
    extra = (
        ["--dir", str(tmp_path)]
        if script in {"claims_throughput.py", "ledger_listing.py", "observatory.py", "lane_user_git.py"}
        else []
    )
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *args, *extra],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert expected in result.stdout
    assert "Traceback" not in result.stderr
