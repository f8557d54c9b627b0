"""A run whose fleet process is gone is finalised once its workers have ended: attempts abandoned, tasks
and run interrupted with the reason, the attempts' claims freed; other runs are never touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.run.salvaging import finalise_run
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import StepClock, add_run, sample_task


class Task:
    id, title, prompt, depends_on, claims = "t1", "T", "p", (), ("a.txt",)
    isolation, pipeline, model, timeout = "shared", None, None, None
    expands, parent, base = False, None, "pinned"
    check, check_timeout = None, 600.0


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_run_is_finalised_only_once_its_fleet_and_its_workers_are_gone(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Ledger.open(tmp_path / "fleet.db") as ledger, ClaimStore.open(tmp_path / "store.db") as store:
            add_run(ledger, "r-gone", pid=dead_pid())
            add_run(ledger, "r-live")  # this process is its fleet
            for run in ("r-gone", "r-live"):
                ledger.tasks.add(run, [Task()], {"t1": 1})
            gone = ledger.attempts.start("r-gone", "t1", pipeline="command")
            live = ledger.attempts.start("r-live", "t1", pipeline="command")
            ledger.attempts.set_pid(gone, worker.pid)
            store.acquire(["a.txt"], Holder.current("r-gone", "t1", "T", gone, worker.pid))

            assert finalise_run(ledger, store, "r-gone") is False  # its worker still runs: left alone
            assert dict(store.claims()).get("a.txt") is not None
            worker.kill()
            worker.wait()
            assert finalise_run(ledger, store, "r-gone") is True

            record = ledger.get_run("r-gone")
            assert record["run"]["status"] == "interrupted" and record["run"]["exit_code"] == 130
            assert "ended without finishing its run" in record["run"]["reason"]
            [attempt] = record["attempts"]
            assert attempt["outcome"] == "abandoned" and attempt["finished_at_ms"] is not None
            assert [t["status"] for t in record["tasks"]] == ["interrupted"]
            assert store.claims() == []
            assert ledger.get_run("r-live")["run"]["status"] == "running"
            assert [a["outcome"] for a in ledger.get_run("r-live")["attempts"]] == ["running"]
            assert live != gone
            assert finalise_run(ledger, store, "r-gone") is True  # once only: nothing changes
            assert ledger.get_run("r-gone")["run"] == record["run"]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_killed_fleets_shared_task_has_its_claimed_paths_salvaged_before_its_claims_go(
    git_repo: Path,
) -> None:
    """The shared tree holds the task's work on its claimed file and the user's on another: the salvage
    ref holds exactly the claimed file; the tree is left as it was; the claims are freed after."""
    (git_repo / "a.txt").write_text("the task's half-done work\n")
    (git_repo / "mine.txt").write_text("the user's own work\n")
    paths = StatePaths(git_repo)
    paths.fleet_db.parent.mkdir(parents=True, exist_ok=True)
    with Ledger.open(paths.fleet_db) as ledger, ClaimStore.open(paths.store_db) as store:
        add_run(ledger, "r-gone", pid=dead_pid(), root=str(git_repo))
        ledger.tasks.add("r-gone", [Task()], {"t1": 1})
        attempt = ledger.attempts.start("r-gone", "t1", pipeline="command")
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        ledger.attempts.set_pid(attempt, worker.pid)
        store.acquire(["a.txt"], Holder.current("r-gone", "t1", "T", attempt, worker.pid))
        worker.kill()
        worker.wait()
        assert finalise_run(ledger, store, "r-gone", root=git_repo) is True
        [row] = ledger.get_run("r-gone")["attempts"]
        assert (
            row["outcome"] == "abandoned" and row["salvage_ref"] == f"refs/stella/salvage/r-gone/t1/{attempt}"
        )
        assert store.claims() == []
    changed = git(
        "diff-tree",
        "-r",
        "--no-commit-id",
        "--name-only",
        f"{row['salvage_sha']}^",
        row["salvage_sha"],
        cwd=git_repo,
    )
    assert changed.split() == ["a.txt"]
    assert git("show", f"{row['salvage_sha']}:a.txt", cwd=git_repo) == "the task's half-done work\n"
    assert (git_repo / "a.txt").read_text() == "the task's half-done work\n"  # the tree untouched
    assert "mine.txt" in git("status", "--porcelain", cwd=git_repo)


def test_a_killed_run_finalised_later_finishes_when_it_last_recorded_something(tmp_path: Path) -> None:
    clock = StepClock(1_800_000_000_000)
    with Ledger.open(tmp_path / "fleet.db", now_ms=clock) as ledger:
        add_run(ledger, "r-1")
        ledger.tasks.add("r-1", [sample_task("t")], {"t": 1})
        clock.advance(10)
        attempt = ledger.attempts.start("r-1", "t", pipeline="command")
        clock.advance(10)
        ledger.spend.add(attempt, 0.1)  # the last thing the killed fleet's run recorded
        clock.advance(3600)  # an hour later, the next stella command finds the fleet gone
        ledger.abandon_run("r-1", "the fleet process ended")
        run = ledger.get_run("r-1")
    assert run["run"]["finished_at_ms"] == 1_800_000_020_000
    assert run["attempts"][0]["finished_at_ms"] == 1_800_000_020_000
