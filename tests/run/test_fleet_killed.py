"""SIGKILL of a real `stella fleet` mid-run: its workers keep their claims while they live, then stop by
themselves; the next stella command finalises the run (interrupted, attempts abandoned, claims freed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.fleet import file_locks, wait_for, write_config
from helpers.repo import StellaRunner
from helpers.spawn import ended_within

from stellafleet.core.paths import StatePaths
from stellafleet.state.claims import ClaimStore

# The worker's command: say who the worker is (the command's parent), leave a child, then wait (until the
# fleet is gone). The child's pid is written whole, then renamed: the test reads it as soon as it is there.
HOLD = 'echo $PPID > "$MARKS/worker"; sleep 300 & echo $! > "$MARKS/child.tmp"; '
HOLD += 'mv "$MARKS/child.tmp" "$MARKS/child"; wait'


def test_a_killed_fleet_keeps_claims_with_its_live_workers_stops_them_and_is_finalised_later(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "holder"\nprompt = "p"\nclaims = ["held.txt"]\n')
    write_config(git_repo, tasks={"holder": HOLD})
    fleet = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command"],
        cwd=git_repo, env={**os.environ, "MARKS": str(marks)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(marks / "child", timeout=60, process=fleet)
        worker, child = int((marks / "worker").read_text()), int((marks / "child").read_text())
        # the declared claim is held by the worker itself, not only by the fleet that took it (handed over
        # once the worker has started)
        with ClaimStore.open(StatePaths(git_repo).store_db) as store:
            deadline = time.monotonic() + 10
            while (holder := dict(store.claims()).get("held.txt")) is not None and holder.pid != worker:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        assert holder is not None and holder.pid == worker != fleet.pid
        fleet.send_signal(signal.SIGKILL)
        fleet.wait(timeout=30)
        # the workers do not run on unnoticed: the worker and what it started end by themselves
        assert ended_within(worker, 10), "the worker outlived its killed fleet"
        assert ended_within(child, 10), "the worker's child outlived its killed fleet"
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()

    runs = stella("runs", "--json", cwd=git_repo)
    assert runs.returncode == 0, runs.stderr
    [run] = json.loads(runs.stdout)["runs"]
    assert run["status"] == "interrupted"
    shown = stella("runs", "latest", "--json", cwd=git_repo)
    detail = json.loads(shown.stdout)
    assert detail["run"]["status"] == "interrupted" and "fleet process" in detail["run"]["reason"]
    [task] = [task for wave in detail["waves"] for task in wave["tasks"]]
    [attempt] = task["attempts"]
    assert task["status"] == "interrupted" and attempt["outcome"] == "abandoned"
    assert attempt["finished_at_ms"] is not None
    assert file_locks(git_repo) == []
