"""`stella fleet --resume` is exclusive: of two resumes of one run started at once only one runs, the other
is refused naming it; a run already resumed is refused naming the run that resumed it (--force to do it
anyway); and a succeeded isolated task whose branch lost its commits is not counted as done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.state.ledger import Ledger

PLAN = """\
[[tasks]]
id = "a"
prompt = "first"
isolation = "isolated"

[[tasks]]
id = "b"
prompt = "waits for its input"
"""

# a commits a file in its worktree; b fails until INPUT exists, then (resumed) waits for RELEASE
WORKER = """\
if TASK == "a":
    Path("a.txt").write_text(f"a {os.environ['STELLA_ATTEMPT_ID']}\\n")
    subprocess.run(["git", "add", "a.txt"], check=True)
    subprocess.run(["git", "commit", "-qm", "a's work"], check=True)
else:
    Path(os.environ["INPUT"]).read_text()
    Path(os.environ["MARKS"], f"b-{os.environ['STELLA_RUN_ID']}").write_text("")
    wait_file(os.environ["RELEASE"])
report(summary=f"{TASK} done")
"""

ARGS = ("fleet", "--pipeline", "command", "--max-concurrency", "2")


def first_run(git_repo: Path, tmp_path: Path, stella: StellaRunner) -> tuple[str, dict[str, str]]:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        "MARKS": str(marks),
        "INPUT": str(tmp_path / "input.txt"),
        "RELEASE": str(tmp_path / "release"),
    }
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("worker", WORKER))
    first = stella(*ARGS, "--plan", str(plan), cwd=git_repo, env=env)
    assert first.returncode == 1, first.stdout + first.stderr
    (tmp_path / "input.txt").write_text("now there")
    return run_record(git_repo)["run"]["id"], env


def start_resume(root: Path, env: dict[str, str], run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stellafleet", *ARGS, "--resume", run_id],
        cwd=root,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def resumers(root: Path, run_id: str) -> list[str]:
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        return ledger.runs.resumed_by(run_id)


def test_two_resumes_at_once_one_runs_and_the_other_is_refused_by_name(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    first_id, env = first_run(git_repo, tmp_path, stella)
    procs = [start_resume(git_repo, env, first_id) for _ in range(2)]
    try:
        # the loser ends (refused) while the winner's b waits for RELEASE
        refused = None
        while refused is None:
            refused = next((p for p in procs if p.poll() is not None), None)
        out, err = refused.communicate(timeout=60)
        assert refused.returncode == 2, out + err
        [winner_id] = resumers(git_repo, first_id)
        assert f"run {first_id} is being resumed by run {winner_id}, which is still running" in err
        assert "--force" in err and "Traceback" not in err
    finally:
        (tmp_path / "release").write_text("")
    [winner] = [p for p in procs if p is not refused]
    out, err = winner.communicate(timeout=120)
    assert winner.returncode == 0, out + err
    assert sorted(os.listdir(env["MARKS"])) == [f"b-{winner_id}"]  # b ran once, in the winner only

    # resuming it again is refused, pointing at the run that resumed it; --force does it anyway
    again = stella(*ARGS, "--resume", first_id, cwd=git_repo, env=env)
    assert again.returncode == 2
    assert f"run {first_id} was already resumed by run {winner_id}" in again.stderr
    assert f"stella fleet --resume {winner_id}" in again.stderr
    assert resumers(git_repo, first_id) == [winner_id]
    forced = stella(*ARGS, "--resume", first_id, "--force", cwd=git_repo, env=env)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert len(resumers(git_repo, first_id)) == 2


def test_a_succeeded_isolated_task_whose_branch_is_gone_runs_again(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    first_id, env = first_run(git_repo, tmp_path, stella)
    (tmp_path / "release").write_text("")
    tasks = by_id(run_record(git_repo, first_id)["tasks"])
    assert tasks["a"]["status"] == "succeeded"
    git("worktree", "remove", "--force", tasks["a"]["worktree"], cwd=git_repo)
    git("branch", "-D", tasks["a"]["branch"], cwd=git_repo)  # its only work product

    resumed = stella(*ARGS, "--resume", first_id, cwd=git_repo, env=env)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "a run again: the branch no longer holds the work" in resumed.stdout
    record = run_record(git_repo)
    assert sorted(a["task_id"] for a in record["attempts"]) == ["a", "b"]
    branch = by_id(record["tasks"])["a"]["branch"]
    assert git("show", f"{branch}:a.txt", cwd=git_repo).startswith("a ")


def test_a_branch_reset_below_its_commits_is_not_done_either(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    first_id, env = first_run(git_repo, tmp_path, stella)
    (tmp_path / "release").write_text("")
    branch = by_id(run_record(git_repo, first_id)["tasks"])["a"]["branch"]
    git("update-ref", f"refs/heads/{branch}", "main", cwd=git_repo)  # still there, without a's commit

    resumed = stella(*ARGS, "--resume", first_id, cwd=git_repo, env=env)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert sorted(a["task_id"] for a in run_record(git_repo)["attempts"]) == ["a", "b"]


def test_a_branch_cleaned_away_after_its_work_landed_is_still_done(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    first_id, env = first_run(git_repo, tmp_path, stella)
    (tmp_path / "release").write_text("")
    task = by_id(run_record(git_repo, first_id)["tasks"])["a"]
    git("merge", "-q", "--no-ff", "-m", "land a", task["branch"], cwd=git_repo)
    git("worktree", "remove", "--force", task["worktree"], cwd=git_repo)
    git("branch", "-D", task["branch"], cwd=git_repo)  # gone, but its commit is in main

    resumed = stella(*ARGS, "--resume", first_id, cwd=git_repo, env=env)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [a["task_id"] for a in run_record(git_repo)["attempts"]] == ["b"]
