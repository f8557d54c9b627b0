"""Pull requests on the local GitHub API server with the real gh: closed through GraphQL (`gh pr close`)
and through REST (`PATCH /pulls/N` with a state), and merged by rebase with the git the machines have
(`git merge-tree --merge-base` needs git 2.40)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers.realgh import REPO, GitHubHost
from helpers.repo import git


def gh(host: GitHubHost, *args: str) -> str:
    done = subprocess.run(
        [host.gh, *args], capture_output=True, text=True, check=False, env=os.environ, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def open_pr(host: GitHubHost, root: Path, branch: str, *files: str) -> int:
    git("switch", "-q", "-c", branch, "main", cwd=root)
    for name in files:
        (root / name).write_text(f"{name} of {branch}\n")
        git("add", name, cwd=root)
        git("commit", "-qm", f"{branch}: {name}", cwd=root)
    git("push", "-q", "origin", branch, cwd=root)
    git("switch", "-q", "main", cwd=root)
    url = gh(host, "pr", "create", "-R", host.repo_flag, "--head", branch, "--base", "main",
             "--title", f"Add {branch}", "--body", "b").strip()  # fmt: skip
    return int(url.rsplit("/", 1)[1])


def test_gh_pr_close_and_a_rest_patch_close_a_pull_request(git_repo: Path, host: GitHubHost) -> None:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    first = open_pr(host, git_repo, "fleet/one", "one.txt")
    second = open_pr(host, git_repo, "fleet/two", "two.txt")

    gh(host, "pr", "close", str(first), "-R", host.repo_flag)  # GraphQL closePullRequest
    patched = gh(host, "api", "-X", "PATCH", f"repos/{REPO}/pulls/{second}", "-f", "state=closed")
    assert json.loads(patched)["state"] == "closed"

    assert [(pr["number"], pr["state"]) for pr in host.prs()] == [(first, "CLOSED"), (second, "CLOSED")]
    assert all(pr["closed_at"] and pr["merge_commit"] is None for pr in host.prs())
    listed = json.loads(gh(host, "pr", "view", str(first), "-R", host.repo_flag, "--json", "state,closed"))
    assert listed == {"state": "CLOSED", "closed": True}
    assert "mutation PullRequestClose" in host.operations()
    refused = subprocess.run(
        [host.gh, "pr", "merge", str(first), "--squash", "-R", host.repo_flag],
        capture_output=True, text=True, check=False, env=os.environ, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0  # a closed pull request does not merge
    assert host.remote_refs()["refs/heads/main"] == git("rev-parse", "main", cwd=git_repo).strip()


def test_a_rebase_merge_replays_each_commit_on_the_base(git_repo: Path, host: GitHubHost) -> None:
    git("remote", "add", "origin", host.clone_url(), cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)
    number = open_pr(host, git_repo, "fleet/two-commits", "a.txt", "b.txt")
    (git_repo / "main.txt").write_text("main moved on\n")  # the base moves: the rebase has work to do
    git("add", "main.txt", cwd=git_repo)
    git("commit", "-qm", "main: main.txt", cwd=git_repo)
    git("push", "-q", "origin", "main", cwd=git_repo)

    gh(host, "pr", "merge", str(number), "--rebase", "-R", host.repo_flag)

    bare = host.local_server.state.repos[REPO].path
    subjects = git("log", "--format=%s", "main", cwd=bare).splitlines()
    assert subjects[:3] == ["fleet/two-commits: b.txt", "fleet/two-commits: a.txt", "main: main.txt"]
    assert git("rev-list", "--count", "--merges", "main", cwd=bare).strip() == "0"
    tree = git("ls-tree", "--name-only", "main", cwd=bare).split()
    assert {"a.txt", "b.txt", "main.txt"} <= set(tree)
    [pr] = host.prs()
    assert pr["state"] == "MERGED" and pr["merge_commit"] == git("rev-parse", "main", cwd=bare).strip()
