"""Issue 49 item 15: `[fleet] require_commits = true` fails a shared task whose worker succeeded without a
commit (what it left is salvaged); a task that committed through `stella commit` still succeeds."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import by_id, run_record, write_config
from helpers.repo import StellaRunner, git

COMMITS = 'stella commit -m "b" b.txt'


def test_a_shared_task_that_succeeded_without_a_commit_fails_when_commits_are_required(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    plan = git_repo.parent / "plan.toml"
    plan.write_text(
        '[defaults]\npipeline = "command"\n\n[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["a.txt"]\n\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\nclaims = ["b.txt"]\n'
    )
    write_config(
        git_repo,
        tasks={"a": "echo left > a.txt", "b": f"echo done > b.txt && {COMMITS}"},
        extra="[fleet]\nrequire_commits = true\n",
    )
    proc = stella_main("fleet", "--plan", str(plan), "--max-concurrency", "1", cwd=git_repo)
    assert proc.returncode == 1, proc.stderr
    tasks = by_id(run_record(git_repo)["tasks"])
    assert tasks["b"]["status"] == "succeeded"
    assert tasks["a"]["status"] == "failed"
    attempt = run_record(git_repo)["attempts"][0]
    assert attempt["error"] == "succeeded without a commit ([fleet] require_commits)"
    assert attempt["salvage_ref"]  # what it left is kept
    assert git("log", "-1", "--format=%s", cwd=git_repo).strip() == "b"
