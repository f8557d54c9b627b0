"""The test-run progress line `tools/dev.py test` turns on (tests/helpers/progress.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_run_prints_how_far_along_it_is(tmp_path: Path) -> None:
    """A real pytest run with the plugin: every report past the interval prints done, total, failed and
    the elapsed time (the interval set to 0 here, so each test prints one)."""
    (tmp_path / "test_some.py").write_text(
        "def test_one():\n    pass\n\ndef test_two():\n    assert False\n\ndef test_three():\n    pass\n"
    )
    (tmp_path / "conftest.py").write_text(
        "import helpers.progress as progress\nprogress.PROGRESS_EVERY = 0.0\n\n"
        "def pytest_configure(config):\n    progress.register(config)\n"
    )
    helpers = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(helpers), "STELLA_TEST_PROGRESS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("-- ")]
    assert [line.split(" after ")[0] for line in lines[-3:]] == [
        "-- 1 of 3 tests done",
        "-- 2 of 3 tests done, 1 failed",
        "-- 3 of 3 tests done, 1 failed",
    ], done.stdout + done.stderr
    assert all(line.endswith("s") for line in lines)
