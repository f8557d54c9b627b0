"""--resume after a failed shared attempt: the edits it left in its claimed file are named as the attempt's,
with its salvage ref, not as the user's, and the task's new attempt starts from them and commits them."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner, git

# first attempt: half the work, then a failure; the next one finishes what it finds
WORKER = """
if not (MARKS / "failed-once").exists():
    (WS / "claimed.txt").write_text("half done\\n")
    mark("failed-once")
    sys.exit("gave up half way")
(WS / "claimed.txt").write_text((WS / "claimed.txt").read_text() + "finished\\n")
stella_commit("finish", "claimed.txt")
report(summary="finished")
"""


def test_a_resumed_task_takes_back_its_failed_attempts_leftovers_as_its_starting_state(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    (git_repo / "claimed.txt").write_text("base\n")
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("worker", WORKER))
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "t1"\nprompt = "p"\nclaims = ["claimed.txt"]\n')
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"MARKS": str(marks)}
    failed = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo, env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    [attempt] = run_record(git_repo)["attempts"]
    assert attempt["salvage_ref"]

    resumed = stella("fleet", "--resume", "latest", "--pipeline", "command", cwd=git_repo, env=env)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "of yours" not in resumed.stderr
    assert (
        f"stella fleet: claimed.txt: left by task t1's attempt {attempt['id']} (salvaged as "
        f"{attempt['salvage_ref']}); the task starts from it\n"
    ) in resumed.stderr
    assert git("show", "HEAD:claimed.txt", cwd=git_repo) == "half done\nfinished\n"
    assert git("status", "--porcelain", "claimed.txt", cwd=git_repo) == ""
