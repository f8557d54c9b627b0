"""What once passed `stella plan check` and failed only at run time is refused by the check itself,
and a prompt of any size reaches its worker (in a file, not only in the environment)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.git.worktrees import slugify
from stellafleet.plan.schema import task_run_problems

BROKEN = """\
defaults = { isolation = "isolated" }

[[tasks]]
id = "x..y"
prompt = "work on a branch git refuses"

[[tasks]]
id = "blank-claim"
prompt = "claims a file with no name"
isolation = "shared"
claims = ["   "]

[[tasks]]
id = "nul"
prompt = "a prompt with a \\u0000 in it"
"""


def test_plan_check_refuses_what_would_only_fail_at_run_time(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(BROKEN)
    result = stella_main("plan", "check", str(plan), cwd=git_repo)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert any(
        'task "x..y": id: an isolated task works on the git branch fleet/x..y-<hash>, which git refuses: '
        "it contains '..'" in line
        for line in lines
    ), lines
    assert any(
        'task "blank-claim": claims: "   " is blank: a claim names a file' in line for line in lines
    ), lines
    assert any('task "nul": prompt: contains a NUL character' in line for line in lines), lines
    assert "Traceback" not in result.stderr
    # and the fleet refuses the plan before anything runs
    write_config(git_repo, run="echo ok")
    fleet = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert fleet.returncode == 2 and "x..y" in fleet.stderr, fleet.stdout + fleet.stderr


@pytest.mark.parametrize(
    "task_id",
    [
        "x..y", "A..B", "..", "a.lock", ".a", "a.", "-a", "a-", "_a", "a..", "ok-1", "a.b_c-d", "a.lock.b",
        "x" * 39 + "..y", "x" * 38 + "..y", "x" * 37 + "..y", "X" * 45, "a..b..c", "1..2", "a_.b",
    ],
)  # fmt: skip
def test_the_branch_check_agrees_with_git(task_id: str) -> None:
    branch = f"fleet/{slugify(task_id)}-0123456789abcdef"
    git = subprocess.run(["git", "check-ref-format", "--branch", branch], capture_output=True)
    refused = bool(task_run_problems("plan", {"id": task_id}, "isolated"))
    assert refused == (git.returncode != 0), branch


READER = """\
text = Path(os.environ["STELLA_PROMPT_FILE"]).read_text()
mark(f"{TASK}.size", len(text))
mark(f"{TASK}.same", text == ("x" * 300_000 if TASK == "big" else "small prompt"))
mark(f"{TASK}.env", len(os.environ.get("STELLA_PROMPT", "")))
"""


def test_a_prompt_of_any_size_reaches_its_worker(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("reader", READER))
    plan = tmp_path / "plan.json"
    tasks = [{"id": "big", "prompt": "x" * 300_000}, {"id": "small", "prompt": "small prompt"}]
    plan.write_text(json.dumps({"tasks": tasks}))
    result = stella_main(
        "fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo, env={"MARKS": str(marks)}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (marks / "big.size").read_text() == "300000" and (marks / "big.same").read_text() == "True"
    assert (marks / "big.env").read_text() == "0"  # too big for the environment: only the file has it
    assert (marks / "small.same").read_text() == "True"
    assert (marks / "small.env").read_text() == "12"  # a small prompt is in STELLA_PROMPT too
    assert {task["status"] for task in run_record(git_repo)["tasks"]} == {"succeeded"}
    assert os.environ.get("STELLA_PROMPT_FILE") is None
