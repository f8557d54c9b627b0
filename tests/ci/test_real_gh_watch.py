"""`--watch`, `stella watch` and `--fix-ci` driven by the real gh, against the local GitHub API server.

The branches are pushed over HTTPS with git, the pull requests are opened and kept current by gh, and
CI is the server's simulated CI: a branch whose tree has `.ci-result` saying `failure` goes red. With
STELLA_TEST_GH_HOST set they run against that host instead (docs/watch.md), its own CI doing the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.fleet import Scripts, run_record, write_config
from helpers.realgh import TESTED_GH, GitHubHost
from helpers.repo import StellaRunner, git

from stellafleet.ci.gh import STATUS_END, STATUS_START
from stellafleet.core.paths import StatePaths

PLAN = """\
[[tasks]]
id = "green"
title = "Add the green work"
prompt = "write work.txt"
isolation = "isolated"

[[tasks]]
id = "red"
title = "Add the red work"
prompt = "write work.txt"
isolation = "isolated"
"""

# The red task's first attempt leaves `.ci-result` saying failure; a follow-up attempt (its prompt
# carries the failing log) says success. Every attempt keeps its prompt in MARKS.
WORKER = """
n = len(list(MARKS.glob(f"prompt-{TASK}-*.txt"))) + 1
prompt = os.environ["STELLA_PROMPT"]
mark(f"prompt-{TASK}-{n}.txt", prompt)
follow_up = "Failing jobs' log" in prompt
(WS / "work.txt").write_text(f"work of {TASK}, attempt {n}\\n")
(WS / ".ci-result").write_text("failure\\n" if TASK == "red" and not follow_up else "success\\n")
subprocess.run(["git", "add", "work.txt", ".ci-result"], check=True)
subject = "fix: CI passes" if follow_up else f"{TASK}: work attempt {n}"
subprocess.run(["git", "commit", "-q", "-m", subject], check=True)
report(spend_usd=0.1, summary=subject)
"""


@pytest.fixture
def host(github_host: Callable[..., GitHubHost], isolated_home: Path) -> GitHubHost:
    return github_host(ci_seconds=0.6, external_ok=True)  # these also run against an external host


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    monkeypatch.setenv("MARKS", str(path))
    return path


@pytest.fixture
def fleet_repo(git_repo: Path, host: GitHubHost, tmp_path: Path, marks: Path) -> Path:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    host.seed(git_repo)
    command = Scripts(tmp_path / "scripts").python("worker", WORKER)
    write_config(git_repo, run=command, extra=host.watch_config())
    (tmp_path / "plan.toml").write_text(PLAN)
    return git_repo


def plan_with(tmp_path: Path, *task_ids: str) -> str:
    blocks = [block for block in PLAN.split("\n\n") if any(f'id = "{t}"' in block for t in task_ids)]
    path = tmp_path / f"plan-{'-'.join(task_ids)}.toml"
    path.write_text("\n\n".join(blocks) + "\n")
    return str(path)


def test_the_real_gh_is_the_tested_version(host: GitHubHost) -> None:
    assert host.version.startswith(f"gh version {TESTED_GH} "), host.version
    assert Path(host.gh).read_bytes()[:4] == b"\x7fELF"  # the release binary, not a script named gh


def test_watch_opens_and_keeps_current_a_pr_per_branch_and_a_second_watch_reuses_them(
    fleet_repo: Path, tmp_path: Path, host: GitHubHost, stella: StellaRunner
) -> None:
    plan = plan_with(tmp_path, "green", "red")
    proc = stella(
        "fleet", "--json", "--watch", "--plan", plan, "--pipeline", "command",
        cwd=fleet_repo, timeout=host.stella_timeout,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    watched = {b["task_id"]: b for b in json.loads(proc.stdout)["watch"]["branches"]}
    assert (watched["green"]["state"], watched["green"]["conclusion"]) == ("green", "success")
    assert (watched["red"]["state"], watched["red"]["conclusion"]) == ("red", "failure")
    assert watched["red"]["reason"] == "failure: CI"

    refs = host.remote_refs()
    branches = {watched[t]["branch"] for t in ("green", "red")}
    prs = {pr["head"]: pr for pr in host.prs() if pr["head"] in branches}
    assert len(prs) == 2
    for task, verdict in (("green", "**green**: all 1 CI runs passed"), ("red", "**red**: failure: CI")):
        branch = watched[task]
        assert refs[f"refs/heads/{branch['branch']}"] == branch["head_sha"]
        pr = prs[branch["branch"]]
        assert (pr["state"], pr["base"], pr["number"]) == ("OPEN", host.default_branch, branch["pr_number"])
        assert pr["title"] == f"Add the {task} work"
        assert branch["pr_url"] == f"https://{host.host}/{host.repo}/pull/{pr['number']}"
        assert pr["body"].count(STATUS_START) == 1 and pr["body"].count(STATUS_END) == 1
        assert verdict in pr["body"] and branch["head_sha"][:12] in pr["body"]
        assert branch["run_urls"][0].startswith(f"https://{host.host}/{host.repo}/actions/runs/")
    seen = len(host.operations()) if host.local else 0
    if host.local:
        assert_asked_for_each_call(host.operations())

    # a second watch finds the same pull requests and rewrites their status blocks in place
    again = stella("watch", "--json", cwd=fleet_repo, timeout=host.stella_timeout)
    assert again.returncode == 4, again.stdout + again.stderr
    second = {b["task_id"]: b for b in json.loads(again.stdout)["branches"]}
    assert {t: b["pr_number"] for t, b in second.items()} == {t: b["pr_number"] for t, b in watched.items()}
    if host.local:
        later = host.operations()[seen:]
        assert "mutation PullRequestCreate" not in later and "query PullRequestList" in later
    mine = [pr for pr in host.prs() if pr["head"] in branches]
    assert len(mine) == 2
    for pr in mine:
        assert pr["body"].count(STATUS_START) == 1
    ci = {row["task_id"]: row for row in run_record(fleet_repo)["ci"]}
    assert ci["green"]["state"] == "green" and ci["red"]["state"] == "red"


def assert_asked_for_each_call(ops: list[str]) -> None:
    """What the local server was asked: the requests of gh auth status, pr list, pr create, pr edit and
    run list."""
    asked = ("query UserCurrent", "query PullRequestList", "mutation PullRequestCreate",
             "mutation PullRequestUpdate", "GET /api/v3/repos/octo/widgets/actions/runs")  # fmt: skip
    for expected in asked:
        assert expected in ops, (expected, sorted(set(ops)))
    assert ops.count("mutation PullRequestCreate") == 2


def test_fix_ci_sends_the_failed_log_and_the_fix_turns_the_branch_green(
    fleet_repo: Path, tmp_path: Path, host: GitHubHost, marks: Path, stella: StellaRunner
) -> None:
    plan = plan_with(tmp_path, "red")
    proc = stella(
        "fleet", "--json", "--watch", "--fix-ci", "1", "--plan", plan, "--pipeline", "command",
        cwd=fleet_repo, timeout=host.stella_timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [branch] = json.loads(proc.stdout)["watch"]["branches"]
    assert (branch["state"], branch["fix_rounds"]) == ("green", 1)
    follow_up = (marks / "prompt-red-2.txt").read_text()
    # what `gh run view --log-failed` printed: the failing step's lines from the run's log archive
    assert "build\tRun tests\t" in follow_up and ".ci-result says failure at" in follow_up
    assert host.remote_refs()[f"refs/heads/{branch['branch']}"] == branch["head_sha"]
    assert git("log", "-1", "--format=%s", branch["head_sha"], cwd=fleet_repo).strip() == "fix: CI passes"
    [pr] = [pr for pr in host.prs() if pr["head"] == branch["branch"]]
    assert "**green**: all 1 CI runs passed" in pr["body"] and branch["head_sha"][:12] in pr["body"]
    if host.local:  # gh run view --log-failed read the run's log archive
        ops = host.operations()
        assert any(op.endswith("/logs") and "/actions/runs/" in op for op in ops), sorted(set(ops))
    record = run_record(fleet_repo)
    assert [a["reason"] for a in record["attempts"]] == [None, "ci-fix"]


def test_no_login_is_exit_2_before_anything_is_pushed(
    fleet_repo: Path, tmp_path: Path, host: GitHubHost, monkeypatch: pytest.MonkeyPatch, stella: StellaRunner
) -> None:
    monkeypatch.setenv("GH_ENTERPRISE_TOKEN", "ghp_not-the-right-token")
    plan = plan_with(tmp_path, "green")
    seen = len(host.operations()) if host.local else 0
    proc = stella("fleet", "--watch", "--plan", plan, "--pipeline", "command", cwd=fleet_repo)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "gh is not authenticated (The token in GH_ENTERPRISE_TOKEN is invalid.): run `gh auth login`"
        in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not StatePaths(fleet_repo).fleet_db.exists()  # no run, so no branch either
    if host.local:
        assert list(host.remote_refs()) == ["refs/heads/main"]
        assert host.operations()[seen:] == []  # the server refused gh's one request: nothing else asked
        assert host.prs() == []
