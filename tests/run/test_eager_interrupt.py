"""Ctrl-C under the eager schedule: once starts nothing more, twice stops the running workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, file_locks, run_record, wait_for, write_config

PLAN = """\
[[tasks]]
id = "a"
prompt = "p"
claims = ["a.txt"]

[[tasks]]
id = "b"
prompt = "p"

[[tasks]]
id = "c"
prompt = "p"
depends_on = ["a"]

[[tasks]]
id = "d"
prompt = "p"
"""

WORKER = """\
mark(f"{TASK}.started")
wait_file(MARKS / "go", timeout=120)
report(summary=f"{TASK} finished")
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_under_eager_keeps_the_interrupt_rules(
    git_repo: Path, tmp_path: Path, isolated_home: Path, presses: int
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(
        git_repo, run=Scripts(tmp_path / "s").python("worker", WORKER), extra="[fleet]\nstop_grace = 2\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command",
         "--max-concurrency", "2", "--schedule", "eager"],
        cwd=git_repo, env={**os.environ, "MARKS": str(marks)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        wait_for(marks / "a.started", process=proc)
        wait_for(marks / "b.started", process=proc)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
        assert proc.stdout is not None
        for line in proc.stdout:  # the first press is heard before the second is sent
            seen.append(line)
            if "press Ctrl-C again" in line:
                break
        if presses == 2:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            (marks / "go").write_text("go")  # the running workers finish their work
        out = "".join(seen) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert proc.returncode == 130, out
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    expected = "succeeded" if presses == 1 else "interrupted"
    assert tasks["a"]["status"] == tasks["b"]["status"] == expected, out
    assert tasks["c"]["status"] == tasks["d"]["status"] == "skipped"
    assert tasks["c"]["reason"] == tasks["d"]["reason"] == "interrupted"
    assert sorted(a["task_id"] for a in record["attempts"]) == ["a", "b"]
    assert record["run"]["status"] == "interrupted" and record["run"]["schedule"] == "eager"
    assert file_locks(git_repo) == []
