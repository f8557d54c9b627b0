"""How a fleet run ends when workers die, overrun their timeout, or the money runs out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.fleet import Scripts, by_id, file_locks, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths
from stellafleet.state.claims import ClaimStore


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("killed", ["worker", "command"])
def test_a_worker_killed_by_sigkill_fails_with_the_signal_and_its_dependents_are_skipped(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, killed: str
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "doomed"\nprompt = "p"\nclaims = ["a.txt", "b.txt"]\n\n'
        '[[tasks]]\nid = "after-doomed"\nprompt = "p"\ndepends_on = ["doomed"]\n\n'
        '[[tasks]]\nid = "later"\nprompt = "p"\ndepends_on = ["after-doomed"]\n\n'
        '[[tasks]]\nid = "bystander"\nprompt = "p"\n\n'
        '[[tasks]]\nid = "after-bystander"\nprompt = "p"\ndepends_on = ["bystander"]\n'
    )
    # The command kills with SIGKILL either the worker process, its parent, which so leaves no result, or
    # its own shell, which the worker concludes as a command killed by a signal.
    target = "$PPID" if killed == "worker" else "$$"
    reason, exit_code = (
        ("worker killed by signal SIGKILL", -9)
        if killed == "worker"
        else ("command failed: killed by signal SIGKILL", 1)
    )
    write_config(git_repo, run="echo ok", tasks={"doomed": f"kill -9 {target}; sleep 5"})

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2", cwd=git_repo
    )

    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert tasks["doomed"]["status"] == "failed"
    assert tasks["doomed"]["reason"] == reason
    attempt = next(a for a in record["attempts"] if a["task_id"] == "doomed")
    assert attempt["exit_code"] == exit_code and attempt["success"] == 0 and attempt["outcome"] == "failed"
    assert attempt["error"] == reason
    assert tasks["after-doomed"]["status"] == "skipped"
    assert tasks["after-doomed"]["reason"] == "dependency failed: doomed"
    assert tasks["later"]["status"] == "skipped"
    assert tasks["later"]["reason"] == "dependency failed: doomed"
    assert tasks["bystander"]["status"] == "succeeded"
    assert tasks["after-bystander"]["status"] == "succeeded"
    assert record["run"]["status"] == "failed" and record["run"]["exit_code"] == 1
    assert file_locks(git_repo) == []
    with ClaimStore.open(StatePaths(git_repo).store_db) as store:
        assert dict(store.claims()).get("a.txt") is None
    assert len(record["attempts"]) == 3  # nothing retried, skipped tasks never started
    assert all(a["finished_at_ms"] is not None for a in record["attempts"])


TREE = """\
import signal
if os.environ.get("IGNORE_TERM_IN_TREE") and TASK == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild below
child = subprocess.Popen(["sleep", "300"])
mark(f"{TASK}.grandchild", child.pid)
mark(f"{TASK}.child", os.getpid())
child.wait()
"""


def test_a_task_timeout_stops_the_whole_process_tree_and_fails_the_attempt(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "slow"\nprompt = "p"\ntimeout = 8\nclaims = ["slow.txt"]\n\n'
        '[[tasks]]\nid = "stubborn"\nprompt = "p"\ntimeout = 8\n\n'
        '[[tasks]]\nid = "quick"\nprompt = "p"\ntimeout = 30\n'
    )
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(
        git_repo,
        run=scripts.python("tree", TREE),
        tasks={"quick": "echo quick done"},
        extra="[fleet]\nstop_grace = 1\n",
    )

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "3",
        cwd=git_repo, env={"MARKS": str(marks), "IGNORE_TERM_IN_TREE": "1"},
    )  # fmt: skip

    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    attempts = by_id(record["attempts"], key="task_id")
    # The worker dies of SIGTERM; the stubborn tree (SIGTERM ignored) is killed after the grace period.
    assert tasks["slow"]["status"] == "failed"
    assert tasks["slow"]["reason"] == "timed out after 8s (worker killed by signal SIGTERM)"
    assert attempts["slow"]["summary"] == "timed out after 8s"
    assert tasks["stubborn"]["status"] == "failed"
    assert tasks["stubborn"]["reason"].startswith("timed out after 8s (worker killed by signal")
    for task in ("slow", "stubborn"):
        assert _gone(int((marks / f"{task}.grandchild").read_text())), f"{task}'s grandchild survived"
        assert _gone(int((marks / f"{task}.child").read_text())), f"{task}'s child survived"
        assert attempts[task]["exit_code"] < 0
    assert tasks["quick"]["status"] == "succeeded"
    assert attempts["quick"]["summary"] == "quick done"
    assert file_locks(git_repo) == []


SPENDER = """\
mark(f"{TASK}.guard", os.environ.get("STELLA_SPEND_GUARD", ""))
report(spend_usd=0.6, input_tokens=1000, output_tokens=200, steps=3, summary=f"{TASK} spent 0.60")
"""


def test_crossing_the_spend_limit_in_wave_one_stops_wave_two_with_exit_3(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=scripts.python("spend", SPENDER))

    proc = stella(
        "--spend-limit", "1", "fleet", "--pipeline", "command", "--max-concurrency", "2",
        "first", "second", "third", "fourth",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    assert proc.returncode == 3, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert [tasks[t]["status"] for t in ("t1", "t2", "t3", "t4")] == ["succeeded"] * 2 + ["skipped"] * 2
    assert tasks["t3"]["reason"] == tasks["t4"]["reason"] == "spend limit reached: $1.20 of $1.00"
    assert not (marks / "t3.guard").exists() and not (marks / "t4.guard").exists()
    assert (marks / "t1.guard").read_text() == "0.500000"  # limit / max concurrency
    assert record["run"]["status"] == "spend_limited" and record["run"]["exit_code"] == 3
    assert record["run"]["spend_usd"] == pytest.approx(1.2)
    assert sum(a["spend_usd"] for a in record["attempts"]) == pytest.approx(1.2)
    assert {a["input_tokens"] for a in record["attempts"]} == {1000}
    assert {a["steps"] for a in record["attempts"]} == {3}
    assert "spend limit reached" in proc.stdout


def test_a_spend_limit_crossed_in_the_last_wave_stops_nothing_and_the_run_says_it_was_passed(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=scripts.python("spend", SPENDER))
    proc = stella(
        "--spend-limit", "1", "fleet", "--pipeline", "command", "--max-concurrency", "2", "a", "b",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    # both tasks ran and succeeded, but the recorded total passed the limit: exit 3, by how much
    assert proc.returncode == 3, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert [t["status"] for t in record["tasks"]] == ["succeeded", "succeeded"]
    assert record["run"]["spend_usd"] == pytest.approx(1.2)
    assert record["run"]["status"] == "spend_limited"
    assert record["run"]["reason"] == "spend limit passed: $1.20 recorded, over --spend-limit $1.00"


def test_a_reader_that_goes_away_does_not_stop_the_run_half_way(git_repo: Path, tmp_path: Path) -> None:
    # `stella fleet ... | head -1`, or a terminal that hung up: writing the progress fails (EPIPE, EIO).
    # That once aborted the run mid-flight: the run left `running`, its tasks `pending`, exit 0.
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["a.txt"]\n\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\ndepends_on = ["a"]\n'
    )
    write_config(git_repo, run="echo working")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read the fleet's output
    proc = subprocess.run(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command"],
        cwd=git_repo, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip
    os.close(write_end)

    record = run_record(git_repo)
    assert record["run"]["status"] == "succeeded", proc.stderr
    assert {task["status"] for task in record["tasks"]} == {"succeeded"}
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert file_locks(git_repo) == []
