"""Real fleets whose attempts end without success keep their uncommitted work on a salvage ref: a timeout,
a watchdog stall, a SIGKILL of the fleet itself; `--from-salvage` starts the resumed task from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.fleet import Scripts, run_record, wait_for, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.state import dashboard

# Write work, then never finish: the attempt must be stopped (timeout, watchdog or a dead fleet).
WRITE_THEN_HANG = """\
(WS / "work.txt").write_text(f"{TASK} was half way\\n")
(WS / "README.md").write_text("edited by the task\\n")
if MARKS:
    mark(f"{TASK}.wrote")
time.sleep(300)
"""

LOOK = """\
mark("work", (WS / "work.txt").read_text())
mark("prompt", Path(os.environ["STELLA_PROMPT_FILE"]).read_text())
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=WS, capture_output=True, text=True).stdout
mark("head", head)
mark("told", os.environ.get("STELLA_SALVAGE_START", "<unset>"))
"""


def _salvaged_files(root: Path, sha: str) -> dict[str, str]:
    names = git("diff-tree", "-r", "--no-commit-id", "--name-only", f"{sha}^", sha, cwd=root).split()
    return {name: git("show", f"{sha}:{name}", cwd=root) for name in names}


def test_a_timed_out_isolated_task_leaves_a_salvage_ref_and_from_salvage_resumes_from_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    # timeout 8 s: room for the worker and its command to start on a busy machine before they write
    write_config(git_repo, run=scripts.python("hang", WRITE_THEN_HANG), extra="[fleet]\nstop_grace = 1\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "slow"\nprompt = "finish it"\nisolation = "isolated"\ntimeout = 8\n')
    ran = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    record = run_record(git_repo)
    run_id = record["run"]["id"]
    [attempt] = record["attempts"]
    assert attempt["salvage_ref"] == f"refs/stella/salvage/{run_id}/slow/{attempt['id']}"
    sha = attempt["salvage_sha"]
    assert git("rev-parse", attempt["salvage_ref"], cwd=git_repo).strip() == sha
    assert _salvaged_files(git_repo, sha) == {
        "README.md": "edited by the task\n",
        "work.txt": "slow was half way\n",
    }
    shown = stella("runs", run_id, cwd=git_repo).stdout
    restore = f"git cherry-pick --no-commit {sha[:12]}"
    assert f"salvaged: {attempt['salvage_ref']} ({sha[:12]}); restore: {restore}" in shown, shown
    detail = json.loads(stella("runs", run_id, "--json", cwd=git_repo).stdout)
    [task] = [task for wave in detail["waves"] for task in wave["tasks"]]
    assert task["attempts"][0]["salvage_restore"] == restore
    opened = dashboard.load_attempt(
        StatePaths(git_repo).fleet_db, attempt["id"], now_ms=int(time.time() * 1000)
    )
    assert opened is not None  # the dashboard's attempt panel gets the ref, the SHA and the command
    shown_there = opened["attempt"]
    assert (shown_there["salvage_ref"], shown_there["salvage_sha"]) == (attempt["salvage_ref"], sha)
    assert shown_there["salvage_restore"] == restore

    # the resumed task's worktree holds the salvaged work staged on the salvage's parent, and its prompt
    # says so: the work goes into the task's own next commit, no `stella salvage:` commit under it
    marks = tmp_path / "marks"
    marks.mkdir()
    commit = 'subprocess.run(["git", "commit", "-qm", "feat: finish it"], cwd=WS, check=True)\n'
    write_config(git_repo, run=scripts.python("look", LOOK + commit))
    resumed = stella(
        "fleet", "--resume", run_id, "--from-salvage", "--pipeline", "command",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (marks / "work").read_text() == "slow was half way\n"
    assert (marks / "head").read_text().strip() == git("rev-parse", f"{sha}^", cwd=git_repo).strip()
    assert (marks / "told").read_text() == sha  # a command worker is told so too
    prompt = (marks / "prompt").read_text()
    assert prompt.startswith("Your worktree holds, staged, the work an earlier attempt") and prompt.endswith(
        "finish it"
    )
    assert f"(salvaged by stella in commit {sha[:12]})" in prompt
    [branch] = [b for b in run_record(git_repo)["tasks"] if b["id"] == "slow"]
    base = record["run"]["base_commit"]
    assert git("log", "--format=%s", f"{base}..{branch['branch']}", cwd=git_repo).splitlines() == [
        "feat: finish it"
    ]
    assert git("show", f"{branch['branch']}:work.txt", cwd=git_repo) == "slow was half way\n"


def test_a_stalled_shared_task_salvages_only_its_claimed_paths_and_leaves_the_users_work_alone(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "mine.txt").write_text("base\n")
    git("add", "mine.txt", cwd=git_repo)
    git("commit", "-q", "-m", "mine", cwd=git_repo)
    (git_repo / "mine.txt").write_text("the user's own uncommitted edit\n")
    (git_repo / "staged.txt").write_text("staged by the user\n")
    git("add", "staged.txt", cwd=git_repo)
    hang = Scripts(tmp_path / "scripts").python(
        "stall", '(WS / "claimed.txt").write_text("half done\\n")\ntime.sleep(300)'
    )
    write_config(git_repo, run=hang, extra="[fleet]\nidle_timeout = 1\nstop_grace = 1\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "stuck"\nprompt = "p"\nclaims = ["claimed.txt"]\n')
    staged_before = git("diff", "--cached", cwd=git_repo)
    head = git("rev-parse", "HEAD", cwd=git_repo)

    ran = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)

    assert ran.returncode == 1, ran.stdout + ran.stderr
    [attempt] = run_record(git_repo)["attempts"]
    assert attempt["outcome"] == "stalled"
    assert _salvaged_files(git_repo, attempt["salvage_sha"]) == {"claimed.txt": "half done\n"}
    assert git("rev-parse", f"{attempt['salvage_sha']}^", cwd=git_repo) == head
    assert git("diff", "--cached", cwd=git_repo) == staged_before
    assert (git_repo / "mine.txt").read_text() == "the user's own uncommitted edit\n"
    assert (git_repo / "claimed.txt").read_text() == "half done\n"  # the files stay as they were


def _wait_interrupted(stella: StellaRunner, root: Path) -> tuple[dict, str]:
    """`stella runs latest` until it shows the killed run finalised (its orphaned worker has ended); the
    run's detail and what those commands said on stderr."""
    deadline = time.monotonic() + 30
    said = ""
    while True:
        shown = stella("runs", "latest", "--json", cwd=root)
        said += shown.stderr
        detail = json.loads(shown.stdout)
        if detail["run"]["status"] == "interrupted" or time.monotonic() > deadline:
            return detail, said
        time.sleep(0.2)


def test_sigkill_of_the_fleet_then_stella_runs_salvages_exactly_the_tasks_files(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("hang", WRITE_THEN_HANG))
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "killed"\nprompt = "p"\nisolation = "isolated"\n')
    fleet = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command"],
        cwd=git_repo, env={**os.environ, "MARKS": str(marks)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(marks / "killed.wrote", timeout=60)
        fleet.send_signal(signal.SIGKILL)
        fleet.wait(timeout=30)
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()

    detail, said = _wait_interrupted(stella, git_repo)
    [task] = [task for wave in detail["waves"] for task in wave["tasks"]]
    [attempt] = task["attempts"]
    assert attempt["outcome"] == "abandoned"
    run_id = detail["run"]["id"]
    # the command that finalised the killed run says so, and where its work went
    assert f"stella: finalised run {run_id}: the fleet process (pid {fleet.pid}) ended without" in said
    assert (
        f"the unfinished work of 1 attempt is kept on salvage refs (`stella runs {run_id}` names them, "
        f"`stella fleet --resume {run_id} --from-salvage` continues from them)"
    ) in said, said
    assert attempt["salvage_ref"].endswith(f"/killed/{attempt['id']}")
    assert _salvaged_files(git_repo, attempt["salvage_sha"]) == {
        "README.md": "edited by the task\n",
        "work.txt": "killed was half way\n",
    }
    # clean removes the worktree now that the salvage holds its work, and the branch with it
    report = json.loads(stella("clean", "--json", cwd=git_repo).stdout)
    reasons = {item["kind"]: item["reason"] for item in report["removed"]}
    held = f"kept in {attempt['salvage_ref']} ({attempt['salvage_sha'][:7]})"
    assert reasons["worktree"] == f"uncommitted changes (2) {held}", report
    assert reasons["branch"].startswith("merged into main"), report
    # salvage refs go only when asked
    assert git("for-each-ref", "refs/stella/salvage/", cwd=git_repo).strip()
    young = json.loads(stella("clean", "--salvage", "--older-than", "1", "--json", cwd=git_repo).stdout)
    assert young["removed"] == [] and git("for-each-ref", "refs/stella/salvage/", cwd=git_repo).strip()
    swept = stella("clean", "--salvage", "--json", cwd=git_repo)
    assert swept.returncode == 0, swept.stderr
    gone = json.loads(swept.stdout)
    assert [item["kind"] for item in gone["removed"]] == ["salvage"]
    assert git("for-each-ref", "refs/stella/salvage/", cwd=git_repo) == ""
