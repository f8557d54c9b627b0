"""Money under a spend limit: the run's total never passes it, and spend reported is spend recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.run.executor import read_result

# Each worker spends 0.75, or less when its guard is smaller: a worker that respects its guard.
THRIFTY = """\
guard = float(os.environ["STELLA_SPEND_GUARD"])
mark(f"{TASK}.guard", guard)
report(spend_usd=min(0.75, guard), summary=f"{TASK} spent")
"""


def test_a_run_never_spends_more_than_its_limit(git_repo: Path, tmp_path: Path, stella: StellaRunner) -> None:
    # Once a $2.50 limit ended at $3.00: wave one spent $1.50 (under the limit), so wave two started two
    # workers with a $1.25 guard each. Now a worker gets at most what is left of the limit.
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("thrifty", THRIFTY))
    proc = stella(
        "--spend-limit", "2.5", "fleet", "--pipeline", "command", "--max-concurrency", "2",
        "one", "two", "three", "four",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    record = run_record(git_repo)
    assert record["run"]["spend_usd"] <= 2.5, proc.stdout
    assert record["run"]["spend_usd"] == pytest.approx(2.25)
    guards = {path.stem: float(path.read_text()) for path in marks.glob("*.guard")}
    # Wave two's two workers start at once: whichever reserves first gets the $1.00 left ($2.50 less the
    # $1.50 already spent), and nothing is left for the other.
    tasks = by_id(record["tasks"])
    [skipped] = [task for task in ("t3", "t4") if tasks[task]["status"] == "skipped"]
    [second] = {"t3", "t4"} - {skipped}
    assert guards == {"t1": 1.25, "t2": 1.25, second: 1.0}
    assert tasks[skipped]["reason"].startswith("spend limit reached: $2.50 of $2.50 spent or held")
    assert "less than the $0.01 minimum guard left" in tasks[skipped]["reason"]
    assert proc.returncode == 3 and record["run"]["status"] == "spend_limited", proc.stdout + proc.stderr


def test_a_task_whose_guard_would_be_under_the_minimum_is_skipped(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = Scripts(tmp_path / "scripts").python("thrifty", THRIFTY)
    write_config(git_repo, run=script, extra="[governor]\nmin_guard_usd = 0.8\n")
    proc = stella(
        "--spend-limit", "2", "fleet", "--pipeline", "command", "--max-concurrency", "2",
        "one", "two", "three",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    # wave one: $1.00 each, spends $0.75 each; $0.50 is left, under the $0.80 minimum: t3 never starts
    record = run_record(git_repo)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert record["run"]["spend_usd"] == pytest.approx(1.5)
    t3 = by_id(record["tasks"])["t3"]
    assert t3["status"] == "skipped" and not (marks / "t3.guard").exists()
    assert t3["reason"] == (
        "spend limit reached: $1.50 of $2.00 spent or held by running workers, "
        "less than the $0.80 minimum guard left"
    )


def test_spend_exactly_at_the_limit_stops_the_next_wave(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    spender = 'report(spend_usd=0.5, summary=f"{TASK} spent 0.50")'
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("spend", spender))
    proc = stella(
        "--spend-limit", "1", "fleet", "--pipeline", "command", "--max-concurrency", "2", "a", "b", "c",
        cwd=git_repo,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["spend_usd"] == pytest.approx(1.0)
    assert by_id(record["tasks"])["t3"]["reason"] == "spend limit reached: $1.00 of $1.00"


def test_a_valid_spend_next_to_a_malformed_field_is_still_recorded(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    script = 'report(spend_usd=0.25, steps="many", summary="did it")'
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("bad", script))
    proc = stella("fleet", "--pipeline", "command", "one", cwd=git_repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["run"]["spend_usd"] == pytest.approx(0.25)
    assert record["attempts"][0]["spend_usd"] == pytest.approx(0.25)
    assert "steps must be a non-negative number" in record["tasks"][0]["reason"]


def test_spend_written_by_a_command_that_was_then_killed_is_recorded(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    # The command reports its spend, then hangs past the task's timeout: the worker is stopped before
    # it ever reads the command's result file. The fleet reads it instead.
    script = 'report(spend_usd=0.4, summary="spent, then hung")\ntime.sleep(60)'
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("hang", script))
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "hang"\nprompt = "p"\ntimeout = 1\n')
    proc = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    assert record["tasks"][0]["reason"].startswith("timed out after 1s")
    assert record["attempts"][0]["spend_usd"] == pytest.approx(0.4)
    assert record["run"]["spend_usd"] == pytest.approx(0.4)


def test_a_worker_result_keeps_its_spend_when_another_field_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"success": False, "summary": "s", "spend_usd": 0.3, "steps": "x"}))
    result = read_result(path)
    assert result is not None and result.spend_usd == 0.3 and result.steps == 0
    path.write_text(json.dumps({"success": True, "summary": "s", "spend_usd": 1e308, "input_tokens": 5}))
    result = read_result(path)
    assert result is not None and result.spend_usd == 0.0 and result.input_tokens == 5


def test_a_run_whose_recorded_spend_passed_its_limit_ends_exit_3(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    """A last-wave worker that reports far past its guard ($99,999 against $5): the run cannot take it
    back, but it never ends exit 0."""
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("lavish", "report(spend_usd=99999)"))
    proc = stella("--spend-limit", "5", "fleet", "--pipeline", "command", "only", cwd=git_repo)
    record = run_record(git_repo)
    assert record["run"]["spend_usd"] > 5, record["run"]
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert record["run"]["status"] == "spend_limited"
    assert record["run"]["reason"].startswith("spend limit passed: $"), record["run"]["reason"]
    assert record["run"]["reason"].endswith(" recorded, over --spend-limit $5.00")
