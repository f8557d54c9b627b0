"""The shared tree at the start of a run: the user's uncommitted changes and a detached HEAD.

A claimed file with the user's uncommitted changes is refused by name; with --allow-dirty the run warns
and the worker's commit of that file carries only what the worker wrote, the user's edit staying
uncommitted in it. A detached HEAD is refused for shared work unless --allow-detached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.fleet import Scripts, run_record, wait_for, write_config
from helpers.repo import StellaRunner, git

PLAN = """\
[[tasks]]
id = "t1"
prompt = "add a line to notes.txt"
claims = ["notes.txt"]
"""

APPENDER = (
    'echo "line 4, the worker\'s" >> notes.txt && '
    'stella commit -m "$STELLA_TASK_ID: a line of notes" notes.txt'
)

COMMITTER = (
    'echo "by $STELLA_TASK_ID" > "$STELLA_TASK_ID.txt" && '
    'stella commit -m "$STELLA_TASK_ID" "$STELLA_TASK_ID.txt"'
)

ORIGINAL = "line 1\nline 2\nline 3\n"


def _setup(repo: Path, tmp_path: Path, command: str) -> Path:
    (repo / "notes.txt").write_text(ORIGINAL)
    git("add", "notes.txt", cwd=repo)
    git("commit", "-q", "-m", "notes", cwd=repo)
    write_config(repo, run=command)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    return plan


def test_a_claimed_file_with_the_users_changes_is_refused_by_name(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = _setup(git_repo, tmp_path, APPENDER)
    (git_repo / "notes.txt").write_text("line 1, the user's edit\nline 2\nline 3\n")
    before = git("rev-parse", "HEAD", cwd=git_repo)

    proc = stella("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)

    assert proc.returncode == 2
    assert "notes.txt (task t1)" in proc.stderr and "--allow-dirty" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert git("rev-parse", "HEAD", cwd=git_repo) == before


def test_allow_dirty_commits_only_what_the_worker_wrote(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = _setup(git_repo, tmp_path, APPENDER)
    users = "line 1, the user's edit\nline 2\nline 3\n"
    (git_repo / "notes.txt").write_text(users)

    proc = stella("fleet", "--pipeline", "command", "--allow-dirty", "--plan", str(plan), cwd=git_repo)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--allow-dirty: notes.txt has uncommitted changes of yours" in proc.stderr
    # the commit: HEAD's notes plus the worker's line; the user's edit is not in it
    assert git("show", "HEAD:notes.txt", cwd=git_repo) == ORIGINAL + "line 4, the worker's\n"
    assert (git_repo / "notes.txt").read_text() == users + "line 4, the worker's\n"
    diff = git("diff", "-U0", "notes.txt", cwd=git_repo)
    assert "-line 1\n+line 1, the user's edit" in diff and "line 4" not in diff
    assert [c["message"] for c in run_record(git_repo)["commits"]] == ["t1: a line of notes"]


def test_an_unclaimed_dirty_tree_is_reported_in_one_line_and_left_alone(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    _setup(git_repo, tmp_path, COMMITTER)
    (git_repo / "README.md").write_text("the user's edit\n")
    for n in range(6):
        (git_repo / f"note{n}.txt").write_text("mine\n")

    proc = stella("fleet", "--pipeline", "command", "write t1", cwd=git_repo)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "uncommitted changes" in line]
    assert notes == [
        "stella fleet: your work tree has uncommitted changes (7 files: README.md, note0.txt, note1.txt, "
        "note2.txt, note3.txt and 2 more): they stay yours, workers' commits leave them out"
    ]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == " M README.md\n"


def test_a_detached_head_is_refused_for_shared_work_unless_asked_for(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    _setup(git_repo, tmp_path, COMMITTER)
    git("checkout", "-q", "--detach", cwd=git_repo)
    detached = git("rev-parse", "HEAD", cwd=git_repo).strip()

    refused = stella("fleet", "--pipeline", "command", "write t1", cwd=git_repo)

    assert refused.returncode == 2
    assert f"HEAD is detached (at {detached[:12]})" in refused.stderr and "--allow-detached" in refused.stderr
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == detached

    allowed = stella("fleet", "--pipeline", "command", "--allow-detached", "write t1", cwd=git_repo)

    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert git("rev-parse", "HEAD~1", cwd=git_repo).strip() == detached
    assert git("show", "HEAD:t1.txt", cwd=git_repo) == "by t1\n"


# The worker writes its file, says so, and commits only once the test has detached HEAD under it.
LATE_COMMITTER = """
(WS / "t1.txt").write_text("by t1\\n")
mark("written")
wait_file(MARKS / "detached")
out = subprocess.run(["stella", "commit", "-m", "t1", "t1.txt"], capture_output=True, text=True)
mark("commit.out", out.stderr)
sys.exit(out.returncode)
"""


def test_a_head_detached_during_the_run_refuses_the_shared_commit(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, spawned: list[subprocess.Popen[str]]
) -> None:
    _setup(git_repo, tmp_path, Scripts(tmp_path / "scripts").python("late", LATE_COMMITTER))
    marks = tmp_path / "marks"
    marks.mkdir()
    fleet = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--pipeline", "command", "write t1"],
        cwd=git_repo, env={**os.environ, "MARKS": str(marks)}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    spawned.append(fleet)
    wait_for(marks / "written", process=fleet)
    git("checkout", "-q", "--detach", cwd=git_repo)  # the user, while the run goes on
    detached = git("rev-parse", "HEAD", cwd=git_repo).strip()
    (marks / "detached").touch()
    out, err = fleet.communicate(timeout=120)

    assert fleet.returncode == 1, out + err
    said = (marks / "commit.out").read_text().strip().splitlines()
    assert said == [
        f"stella: error: HEAD is detached (at {detached[:12]}): this shared-tree commit would go onto it, "
        "where only the reflog keeps it once a branch is checked out; check out a branch again (`git "
        "switch -` goes back to it) and commit again, or start the run with --allow-detached to commit "
        "onto a detached HEAD"
    ]
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == detached  # nothing committed onto it
    assert git("rev-parse", "main", cwd=git_repo).strip() == detached
    assert run_record(git_repo)["commits"] == []


def test_hooks_skip_warns_once_at_the_start_when_hooks_are_installed(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    _setup(git_repo, tmp_path, COMMITTER)
    write_config(git_repo, run=COMMITTER, extra='[commit]\nhooks = "skip"\n')
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho refused by the hook >&2\nexit 1\n")
    hook.chmod(0o755)

    proc = stella("fleet", "--pipeline", "command", "write t1", "write t2", cwd=git_repo)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "will not run" in line]
    assert warned == [
        'stella fleet: warning: [commit] hooks = "skip": the installed pre-commit hooks will not run for '
        "the workers' commits"
    ]
    assert "refused by the hook" not in proc.stdout + proc.stderr
