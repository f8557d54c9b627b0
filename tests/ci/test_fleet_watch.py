"""`stella fleet --watch`: after the fan-out, the branches with successful work are followed through CI,
with the real gh against the local GitHub API server (its simulated CI reads `.ci-result`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fleet import run_record, write_config
from helpers.realgh import GitHubHost
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths

PLAN = '[[tasks]]\nid = "feature"\nprompt = "p"\nisolation = "isolated"\n'


def work(ci_result: str) -> str:
    return (
        f'echo "new work" > work.txt && echo {ci_result} > .ci-result && git add work.txt .ci-result && '
        'git commit -q -m "add work" && echo "work committed"'
    )


@pytest.fixture
def origin_repo(git_repo: Path, tmp_path: Path, host: GitHubHost) -> Path:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    (tmp_path / "plan.toml").write_text(PLAN)
    return git_repo


def configure(root: Path, host: GitHubHost, ci_result: str) -> None:
    extra = f'[watch]\npoll_interval = 0.1\nrepo = "{host.repo_flag}"\n'
    write_config(root, run=work(ci_result), extra=extra)


def test_a_green_branch_keeps_exit_0_and_lands_in_the_json_document(
    origin_repo: Path, tmp_path: Path, host: GitHubHost, stella_main: StellaRunner
) -> None:
    configure(origin_repo, host, "success")
    plan = str(tmp_path / "plan.toml")
    proc = stella_main("fleet", "--json", "--watch", "--plan", plan, "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    [watched] = doc["watch"]["branches"]
    assert watched["branch"] == doc["tasks"][0]["branch"] and watched["state"] == "green"
    assert git("ls-remote", "origin", watched["branch"], cwd=origin_repo).split()[0] == watched["head_sha"]


def test_a_red_branch_gives_exit_4(
    origin_repo: Path, tmp_path: Path, host: GitHubHost, stella_main: StellaRunner
) -> None:
    configure(origin_repo, host, "failure")
    plan = str(tmp_path / "plan.toml")
    proc = stella_main("fleet", "--watch", "--plan", plan, "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    record = run_record(origin_repo)
    assert record["run"]["status"] == "succeeded" and record["run"]["exit_code"] == 4
    assert record["ci"][0]["state"] == "red"


def test_gh_not_ready_is_exit_2_before_anything_runs(
    origin_repo: Path,
    tmp_path: Path,
    host: GitHubHost,
    monkeypatch: pytest.MonkeyPatch,
    stella_main: StellaRunner,
) -> None:
    configure(origin_repo, host, "success")
    monkeypatch.delenv("GH_ENTERPRISE_TOKEN")
    plan = str(tmp_path / "plan.toml")
    proc = stella_main("fleet", "--watch", "--plan", plan, "--pipeline", "command", cwd=origin_repo)
    assert proc.returncode == 2 and "gh is not authenticated" in proc.stderr, proc.stderr
    assert not StatePaths(origin_repo).fleet_db.exists()
