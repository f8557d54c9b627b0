"""`stella merge --via-gh`: GitHub (the real gh, against the local GitHub API server) merges each green
pull request in dependency order, with the chosen strategy or through the repository's merge queue."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.fleet import Scripts, run_record, write_config
from helpers.realgh import REPO, GitHubHost
from helpers.repo import StellaRunner, git

PLAN = """\
[[tasks]]
id = "base"
title = "Add the base"
prompt = "p"
isolation = "isolated"

[[tasks]]
id = "top"
title = "Add the top"
prompt = "p"
isolation = "isolated"
depends_on = ["base"]

[[tasks]]
id = "broken"
title = "Add the broken part"
prompt = "p"
isolation = "isolated"
"""

WORKER = """
(WS / f"{TASK}.txt").write_text(f"work of {TASK}\\n")
(WS / ".ci-result").write_text("failure\\n" if TASK == "broken" else "success\\n")
subprocess.run(["git", "add", f"{TASK}.txt", ".ci-result"], check=True)
subprocess.run(["git", "commit", "-q", "-m", f"{TASK}: add {TASK}.txt"], check=True)
report(spend_usd=0.1, summary=f"added {TASK}.txt")
"""


@pytest.fixture
def watched(git_repo: Path, host: GitHubHost, tmp_path: Path, stella_main: StellaRunner) -> dict[str, dict]:
    """A fleet whose base and top branches ended green and broken red, each with its pull request."""
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    command = Scripts(tmp_path / "scripts").python("worker", WORKER)
    write_config(git_repo, run=command, extra=f'[watch]\npoll_interval = 0.1\nrepo = "{host.repo_flag}"\n')
    (tmp_path / "plan.toml").write_text(PLAN)
    proc = stella_main(
        "fleet", "--json", "--watch", "--plan", str(tmp_path / "plan.toml"), "--pipeline", "command",
        cwd=git_repo,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    return {b["task_id"]: b for b in json.loads(proc.stdout)["watch"]["branches"]}


def main_log(host: GitHubHost) -> list[str]:
    path = host.local_server.state.repos[REPO].path
    return git("log", "--format=%s", "main", cwd=path).splitlines()


def test_via_gh_squashes_each_green_pr_in_dependency_order_and_records_it(
    git_repo: Path, host: GitHubHost, watched: dict[str, dict], stella_main: StellaRunner
) -> None:
    assert watched["broken"]["state"] == "red"
    dry = stella_main("merge", "--via-gh", "--strategy", "squash", "--dry-run", cwd=git_repo)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would ask GitHub to merge PR #{watched['base']['pr_number']} (squash)" in dry.stdout
    refused = stella_main("merge", "--via-gh", "--resolve", cwd=git_repo)
    assert refused.returncode == 2 and "does not go with --via-gh" in refused.stderr
    assert "mutation PullRequestMerge" not in host.operations() and run_record(git_repo)["merges"] == []

    proc = stella_main("merge", "--via-gh", "--strategy", "squash", "--json", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [(i["task_id"], i["status"]) for i in doc["queue"]] == [("base", "merged"), ("top", "merged")]
    assert [i["task_id"] for i in doc["left_out"]] == ["broken"]
    prs = {pr["head"]: pr for pr in host.prs()}
    for task in ("base", "top"):
        pr = prs[watched[task]["branch"]]
        assert (pr["state"], pr["merge_method"]) == ("MERGED", "SQUASH")
        item = next(i for i in doc["queue"] if i["task_id"] == task)
        assert item["after_sha"] == pr["merge_commit"]
        assert item["reason"].startswith(f"GitHub merged PR #{pr['number']} into main with squash at ")
    assert prs[watched["broken"]["branch"]]["state"] == "OPEN"
    numbers = {t: watched[t]["pr_number"] for t in ("base", "top")}
    assert main_log(host)[:2] == [f"Add the top (#{numbers['top']})", f"Add the base (#{numbers['base']})"]
    assert "mutation PullRequestMerge" in host.operations()
    rows = run_record(git_repo)["merges"]
    assert [(r["task_id"], r["status"], r["strategy"], r["onto_ref"]) for r in rows] == [
        ("base", "merged", "gh squash", "main"),
        ("top", "merged", "gh squash", "main"),
    ]
    assert [r["after_sha"] for r in rows] == [
        prs[watched[t]["branch"]]["merge_commit"] for t in ("base", "top")
    ]

    again = stella_main("merge", "--via-gh", cwd=git_repo)  # already merged: nothing asked of GitHub again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already merged (PR #" in again.stdout
    assert host.operations().count("mutation PullRequestMerge") == 2


def test_via_gh_goes_through_the_merge_queue_when_the_repository_has_one(
    git_repo: Path, host: GitHubHost, watched: dict[str, dict], stella_main: StellaRunner
) -> None:
    host.local_server.state.repos[REPO].merge_queue = True
    proc = stella_main("merge", "--via-gh", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "GitHub merged PR" in line]
    assert len(lines) == 2 and all("through the merge queue" in line for line in lines), proc.stdout
    assert lines[0].split()[2] == watched["base"]["branch"]  # the dependency first
    ops = host.operations()
    assert ops.count("mutation PullRequestAutoMerge") == 2 and "mutation PullRequestMerge" not in ops
    # stella waited for the queue to merge base before it queued top
    base, top = (f"{REPO}#{watched[t]['pr_number']}" for t in ("base", "top"))
    assert host.state()["events"] == [f"queued {base}", f"merged {base}", f"queued {top}", f"merged {top}"]
    merged = {pr["head"]: pr for pr in host.prs()}
    assert merged[watched["top"]["branch"]]["merge_method"] == "SQUASH"  # the queue's method
    assert "run " in proc.stdout and "GitHub merged 2, failed 0" in proc.stdout


def test_via_gh_lands_a_stacked_pr_after_its_parent_retargeted_to_where_the_parent_landed(
    git_repo: Path, host: GitHubHost, tmp_path: Path, stella_main: StellaRunner
) -> None:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    command = Scripts(tmp_path / "scripts").python("worker", WORKER)
    write_config(git_repo, run=command, extra=f'[watch]\npoll_interval = 0.1\nrepo = "{host.repo_flag}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.split('\n\n[[tasks]]\nid = "broken"')[0] + '\nbase = "parents"\n')
    fleet = ("fleet", "--json", "--watch", "--plan", str(plan), "--pipeline", "command")
    proc = stella_main(*fleet, cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    watched = {b["task_id"]: b for b in json.loads(proc.stdout)["watch"]["branches"]}
    prs = {pr["head"]: pr for pr in host.prs()}
    assert prs[watched["top"]["branch"]]["base"] == watched["base"]["branch"]  # stacked

    merged = stella_main("merge", "--via-gh", "--strategy", "squash", "--json", cwd=git_repo)

    assert merged.returncode == 0, merged.stdout + merged.stderr
    queue = json.loads(merged.stdout)["queue"]
    assert [(i["task_id"], i["status"]) for i in queue] == [("base", "merged"), ("top", "merged")]
    assert queue[1]["reason"].endswith(f"into main with squash at {queue[1]['after_sha'][:12]} "
                                       f"(retargeted from {watched['base']['branch']})")  # fmt: skip
    prs = {pr["head"]: pr for pr in host.prs()}
    assert prs[watched["top"]["branch"]]["base"] == "main"
    numbers = {t: watched[t]["pr_number"] for t in ("base", "top")}
    assert main_log(host)[:2] == [f"Add the top (#{numbers['top']})", f"Add the base (#{numbers['base']})"]
    files = git("ls-tree", "--name-only", "main", cwd=host.local_server.state.repos[REPO].path).split()
    assert {"base.txt", "top.txt"} <= set(files)


def test_via_gh_rebases_and_refuses_a_pull_request_a_reviewer_closed_after_the_watch(
    git_repo: Path, host: GitHubHost, watched: dict[str, dict], stella_main: StellaRunner
) -> None:
    """The watch saw both green; then the reviewer closed top's pull request. --via-gh lands base by
    rebase (on the machines' git 2.39) and does not land top, by name."""
    closed = subprocess.run(
        [host.gh, "pr", "close", str(watched["top"]["pr_number"]), "-R", host.repo_flag],
        capture_output=True, text=True, check=False, env=os.environ,
    )  # fmt: skip
    assert closed.returncode == 0, closed.stderr
    proc = stella_main("merge", "--via-gh", "--strategy", "rebase", "--json", cwd=git_repo)
    doc = json.loads(proc.stdout)
    status = {i["task_id"]: (i["status"], i["reason"]) for i in doc["queue"]}
    assert status["base"][0] == "merged" and "with rebase" in status["base"][1]
    assert status["top"] == ("error", f"PR #{watched['top']['pr_number']} is closed, not open")
    assert proc.returncode != 0
    prs = {pr["head"]: pr for pr in host.prs()}
    assert prs[watched["top"]["branch"]]["state"] == "CLOSED"
    assert main_log(host)[0] == "base: add base.txt"  # the commit itself, replayed: no merge commit
