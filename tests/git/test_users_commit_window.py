"""A worker's commit refused while the user's own `git commit` runs its hooks (the pre-commit framework's
stash window, which puts the workers' files back to HEAD) is tried again once that commit has ended.
A real `git commit` is held inside its hook by a file barrier; the hook refuses the worker's commit while
that window is open, as a fixer hook whose rewrite was undone does, and says so only once that commit has
ended (the worker must have seen it running as its hooks started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.fleet import make_attempt, wait_for
from helpers.repo import git

HOOK = """#!/bin/sh
if [ -n "$USERS_SIDE" ]; then
  touch "$MARKS/window-open"
  while [ ! -e "$MARKS/window-closes" ]; do sleep 0.01; done
  exit 0
fi
if [ ! -e "$MARKS/window-closes" ]; then
  touch "$MARKS/worker-refused"
  while [ ! -e "$MARKS/users-commit-ended" ]; do sleep 0.01; done
  echo "error: prettier's rewrite of w.txt was undone"
  exit 1
fi
"""


def test_a_workers_commit_refused_in_the_users_stash_window_is_retried_once_it_closes(
    git_repo: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    (git_repo / "u.txt").write_text("the user's\n")
    git("add", "u.txt", cwd=git_repo)
    env = {**os.environ, "MARKS": str(marks)}
    users = subprocess.Popen(
        ["git", "commit", "-q", "-m", "the user's"], cwd=git_repo, env={**env, "USERS_SIDE": "1"}
    )
    wait_for(marks / "window-open", process=users)
    ctx = make_attempt(git_repo)
    (git_repo / "w.txt").write_text("the worker's\n")
    worker = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "commit", "-m", "w", "w.txt"],
        cwd=git_repo, env={**env, **ctx.to_env()}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(marks / "worker-refused", process=worker)
    (marks / "window-closes").touch()
    assert users.wait(timeout=60) == 0
    (marks / "users-commit-ended").touch()  # the refusal comes after the user's commit has ended
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "a hook refused while your git commit ran; trying again once it has ended" in err
    assert git("log", "--format=%s", cwd=git_repo).split("\n")[:2] == ["w", "the user's"]
