"""A killed `stella commit` leaves no scratch directory behind once the next stella command has run.

A commit stages into a private index in a directory of the system temp folder. SIGKILL (and SIGTERM,
which ends Python without unwinding) left it there, one per stopped commit, each a copy of the index:
before, 95 were left in the temp folder after about 190 random kills in fleets. The commit is held
inside a real pre-commit hook (while its scratch directory exists) and killed there; a stella command
run while it lives leaves its directory alone (the commit holds an flock on it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fleet import make_attempt, wait_for
from helpers.repo import git, run_stella


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_scratch_directory_of_a_killed_commit_is_removed_by_the_next_stella_command(
    git_repo: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    entered = tmp_path / "entered"
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {entered}\nsleep 60\n")
    hook.chmod(0o755)
    ctx = make_attempt(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    env = {**os.environ, **ctx.to_env(), "TMPDIR": str(temp)}
    commit = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "commit", "-m", "Add a", "a.txt"],
        cwd=git_repo, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(entered, timeout=60, process=commit)
        [left] = list(temp.iterdir())
        assert left.name.startswith("stella-commit-")
        swept = run_stella("runs", cwd=git_repo, env={"TMPDIR": str(temp)})
        assert swept.returncode == 0 and left.exists()  # a live commit's directory is left alone
        commit.send_signal(sig)
        commit.wait(timeout=30)
    finally:
        os.killpg(commit.pid, signal.SIGKILL)  # the hook's sleep too
    assert left.exists()  # nothing removed it as the commit died

    done = run_stella("runs", cwd=git_repo, env={"TMPDIR": str(temp)})

    assert done.returncode == 0, done.stderr
    assert list(temp.iterdir()) == []
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
