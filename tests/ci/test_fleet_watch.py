"""`stella fleet --watch`: after the fan-out, the branches with successful work are followed through CI."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fleet import run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.testing import fake_gh

PLAN = '[[tasks]]\nid = "feature"\nprompt = "p"\nisolation = "isolated"\n'
WORK = (
    'echo "new work" > work.txt && git add work.txt && git commit -q -m "add work" && echo "work committed"'
)
SUCCESS = [{"databaseId": 501, "name": "build", "workflowName": "CI", "status": "completed",
            "conclusion": "success", "updatedAt": "2026-11-30T12:05:00Z"}]  # fmt: skip
FAILURE = [{**SUCCESS[0], "conclusion": "failure"}]


@pytest.fixture
def origin_repo(git_repo: Path, tmp_path: Path) -> Path:
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    git("remote", "add", "origin", str(origin), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    write_config(git_repo, run=WORK, extra="[watch]\npoll_interval = 0.01\n")
    return git_repo


@pytest.fixture
def gh_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    fake_gh.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "gh-script.json"
    monkeypatch.setenv("FAKE_GH_SCRIPT", str(script))
    monkeypatch.setenv("FAKE_GH_STATE", str(tmp_path / "gh-state.json"))
    script.write_text("{}")
    yield script


def test_a_green_branch_keeps_exit_0_and_lands_in_the_json_document(
    origin_repo: Path, tmp_path: Path, gh_script: Path, stella: StellaRunner
) -> None:
    gh_script.write_text(json.dumps({"runs": {"*": [SUCCESS]}}))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    proc = stella("fleet", "--json", "--watch", "--plan", str(plan), "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    [watched] = doc["watch"]["branches"]
    assert watched["branch"] == doc["tasks"][0]["branch"] and watched["state"] == "green"
    assert git("ls-remote", "origin", watched["branch"], cwd=origin_repo).strip()


def test_a_red_branch_gives_exit_4(
    origin_repo: Path, tmp_path: Path, gh_script: Path, stella: StellaRunner
) -> None:
    gh_script.write_text(json.dumps({"runs": {"*": [FAILURE]}}))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    proc = stella("fleet", "--watch", "--plan", str(plan), "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    record = run_record(origin_repo)
    assert record["run"]["status"] == "succeeded" and record["run"]["exit_code"] == 4
    assert record["ci"][0]["state"] == "red"


def test_gh_not_ready_is_exit_2_before_anything_runs(
    origin_repo: Path, tmp_path: Path, gh_script: Path, stella: StellaRunner
) -> None:
    gh_script.write_text(json.dumps({"auth": "logged_out"}))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    proc = stella("fleet", "--watch", "--plan", str(plan), "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 2 and "gh is not authenticated" in proc.stderr
    assert not StatePaths(origin_repo).fleet_db.exists()
