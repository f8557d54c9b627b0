"""The user's own git during a fleet: 40 shared tasks commit through `stella commit` at -j8 while another
process loops `git status --porcelain`, `git add` and `git commit` of its own files in the same tree."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.fleet import make_attempt, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.errors import GitError
from stellafleet.git import gitops, indexlock
from stellafleet.git.lane import commit_paths

TASKS = 40

# Each task writes its own file and commits it with `stella commit` (a shell line: no interpreter to start).
COMMITTER = (
    'mkdir -p out && echo "written by $STELLA_TASK_ID" > "out/$STELLA_TASK_ID.txt" && '
    'stella commit -m "$STELLA_TASK_ID: add out/$STELLA_TASK_ID.txt" "out/$STELLA_TASK_ID.txt"'
)


# The user: git status, then a file of their own added and committed, over and over until told to stop.
# A git command that meets another's index.lock (or a HEAD that just moved) fails, as git does; the user
# tries it again.
USER_LOOP = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    root, stop = Path(sys.argv[1]), Path(sys.argv[2])
    def git(*args):
        for _ in range(200):
            if subprocess.run(["git", *args], cwd=root, capture_output=True).returncode == 0:
                return True
            time.sleep(0.01)
        return False
    (root / "mine").mkdir(exist_ok=True)
    n = 0
    while not stop.exists():
        git("status", "--porcelain")
        n += 1
        (root / "mine" / f"{n}.txt").write_text(f"user file {n}\\n")
        if git("add", f"mine/{n}.txt"):
            git("commit", "-q", "-m", f"user commit {n}")
        time.sleep(0.02)
    print(n)
""")


@pytest.mark.slow
def test_user_git_during_a_fleet_loses_nothing_and_every_worker_commit_is_recorded_once(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    write_config(git_repo, run=COMMITTER)
    git("add", ".stella/config.toml", cwd=git_repo)
    git("commit", "-q", "-m", "stella config", cwd=git_repo)
    base = gitops.head_commit(git_repo)
    stop = tmp_path / "stop-user"
    user = subprocess.Popen(
        [sys.executable, "-c", USER_LOOP, str(git_repo), str(stop)], stdout=subprocess.PIPE, text=True
    )
    try:
        prompts = [f"write file number {n}" for n in range(1, TASKS + 1)]
        proc = stella(
            "fleet", "--pipeline", "command", "--max-concurrency", "8", *prompts, cwd=git_repo, timeout=100
        )
    finally:
        stop.touch()
        user_out, _ = user.communicate(timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(user_out.strip()) > 0

    record = run_record(git_repo)
    rows = record["commits"]
    history = git("log", "--format=%H %s", f"{base}..HEAD", cwd=git_repo).splitlines()
    worker_commits = {sha for sha, subject in (line.split(" ", 1) for line in history) if subject[:1] == "t"}
    # every worker commit on HEAD has exactly one row, and every row is a commit on HEAD
    assert len(worker_commits) == TASKS
    assert sorted(row["sha"] for row in rows) == sorted(worker_commits)
    assert not (git_repo / ".git" / "index.lock").exists()
    fsck = subprocess.run(["git", "fsck", "--no-dangling"], cwd=git_repo, capture_output=True, text=True)
    assert fsck.returncode == 0 and fsck.stdout.strip() == "", fsck.stdout + fsck.stderr
    # no worker file lost, and no later commit deleted one
    deleted = git("log", "--diff-filter=D", "--format=%s", "--name-only", f"{base}..HEAD", cwd=git_repo)
    if deleted.strip():
        # A lane commit must never delete a file. A user's own `git commit` can: git reads the index
        # before it takes index.lock, so a commit that raced a lane commit may write back an index that
        # lacks the worker's file (git loses concurrent `git add`s the same way). The lane narrows that
        # window (docs/claims.md) but cannot close it from outside git: reported, not hidden.
        subjects = [line for line in deleted.splitlines() if line and not line.startswith("out/")]
        assert all(subject.startswith("user commit") for subject in subjects), deleted
        pytest.xfail(f"git's own race: a user `git commit` dropped a worker's file: {deleted.split()}")
    for n in range(1, TASKS + 1):
        assert git("show", f"HEAD:out/t{n}.txt", cwd=git_repo) == f"written by t{n}\n"
    # the index is HEAD plus at most the user's own last staged file; the work tree matches the index
    staged = git("diff", "--cached", "--name-only", cwd=git_repo).split()
    assert all(path.startswith("mine/") for path in staged), staged
    assert git("diff", "--name-only", cwd=git_repo) == ""


def test_a_commit_waits_while_git_holds_the_index_lock_and_gives_up_after_a_bound(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_attempt(git_repo)
    lock = git_repo / ".git" / "index.lock"
    lock.write_bytes(b"DIRC held by another git process")
    (git_repo / "a.txt").write_text("a\n")
    timer = threading.Timer(0.5, lock.unlink)
    timer.start()
    started = time.monotonic()
    sha = commit_paths(ctx, ["a.txt"], "Add a")
    assert time.monotonic() - started >= 0.4
    assert sha == gitops.head_commit(git_repo)
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""

    monkeypatch.setattr(indexlock, "LOCK_WAIT_S", 0.3)
    lock.write_bytes(b"DIRC held for good")
    (git_repo / "a.txt").write_text("a, again\n")
    with pytest.raises(GitError, match=r"another git process has held .*index\.lock for 0\.3s; nothing was"):
        commit_paths(ctx, ["a.txt"], "Change a")
    assert gitops.head_commit(git_repo) == sha and lock.read_bytes() == b"DIRC held for good"
    assert [row["sha"] for row in run_record(git_repo)["commits"]] == [sha]

    # a lock a killed stella left behind (its marker names a dead process) is not waited for
    lock.write_text(f"{indexlock.MARKER} 999999 0.0\n")
    assert commit_paths(ctx, ["a.txt"], "Change a") == gitops.head_commit(git_repo)
    assert not lock.exists()
