"""One rule for every pipeline: what a succeeded isolated task left uncommitted is committed for it, with
a message saying so; and a succeeded isolated task with no commit at all is flagged in the run summary,
`stella runs RUN` and the run page's attention strip."""

from __future__ import annotations

import json
import time
from pathlib import Path

from helpers.fleet import by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.state.dashboard import load_first_view

PLAN = """\
[[tasks]]
id = "left"
title = "Leave it"
prompt = "p"
isolation = "isolated"

[[tasks]]
id = "nothing"
prompt = "p"
isolation = "isolated"
"""

# The project's own hook refuses a work-in-progress commit, as a real hook might refuse an agent's.
HOOK = '#!/bin/sh\nif grep -q WIP "$1"; then echo "no WIP commits here" >&2; exit 1; fi\n'


def test_uncommitted_work_of_an_isolated_task_is_committed_and_no_commit_is_flagged(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    hook = git_repo / ".git" / "hooks" / "commit-msg"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    # left: its own `git commit` fails in the hook, and the task still reports success
    write_config(
        git_repo,
        tasks={
            "left": "echo work > left.txt && git add left.txt && (git commit -qm 'WIP' || true)",
            "nothing": "true",
        },
    )

    proc = stella_main("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    [commit] = [c for c in record["commits"] if c["task_id"] == "left"]
    assert commit["message"] == "Leave it (command, uncommitted changes)"
    assert git("show", f"{tasks['left']['branch']}:left.txt", cwd=git_repo) == "work\n"
    assert git("status", "--porcelain", cwd=Path(tasks["left"]["worktree"])) == ""
    [attempt] = [a for a in record["attempts"] if a["task_id"] == "left"]
    assert f"committed what it left uncommitted in {commit['sha'][:12]}" in attempt["summary"]

    # nothing: succeeded with no commit, flagged everywhere a run is shown
    assert [c for c in record["commits"] if c["task_id"] == "nothing"] == []
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "NO COMMITS" in rows["nothing"] and "NO COMMITS" not in rows["left"]
    shown = stella_main("runs", "latest", cwd=git_repo)
    assert shown.stdout.count("no commits: it succeeded, but it committed nothing") == 1
    # and in the list of runs: the count in the run's row, the task's id in --json
    listed = stella_main("runs", cwd=git_repo)
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(record["run"]["id"])]
    assert " 2/0/0 (1 ok with 0 commits) " in row, listed.stdout
    [run] = json.loads(stella_main("runs", "--json", cwd=git_repo).stdout)["runs"]
    assert run["no_commits"] == ["nothing"]
    one = json.loads(stella_main("runs", "latest", "--json", cwd=git_repo).stdout)
    assert one["run"]["no_commits"] == ["nothing"]
    page = load_first_view(StatePaths(git_repo).fleet_db, None, now_ms=int(time.time() * 1000))
    flagged = [item for item in page["attention"] if item["kind"] == "no_commits"]
    assert [item["task"] for item in flagged] == ["nothing"]
