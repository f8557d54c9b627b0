"""The user's own git during a fleet: 40 shared tasks commit through `stella commit` at -j8 while another
process loops `git status --porcelain`, `git add` and `git commit` of its own files in the same tree."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.fleet import make_attempt, run_record, wait_until, write_config
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
    assert deleted.strip() == "", deleted
    for n in range(1, TASKS + 1):
        assert git("show", f"HEAD:out/t{n}.txt", cwd=git_repo) == f"written by t{n}\n"
    # the index is HEAD plus at most the user's own last staged file; the work tree matches the index
    staged = git("diff", "--cached", "--name-only", cwd=git_repo).split()
    assert all(path.startswith("mine/") for path in staged), staged
    assert git("diff", "--name-only", cwd=git_repo) == ""


# Pauses a real `git commit` between reading the index and locking it: git runs the core.fsmonitor hook
# while it reads the index. The hook answers nothing (exit 1), so git then checks every file as usual.
PAUSE_HOOK = (
    '#!/bin/sh\ntouch "$PAUSE_DIR/paused"\nwhile [ ! -e "$PAUSE_DIR/go" ]; do sleep 0.01; done\nexit 1\n'
)


def test_a_user_commit_that_read_the_index_before_a_lane_commit_fails_instead_of_undoing_it(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexlock, "LINGER_S", 3.0)
    ctx = make_attempt(git_repo)
    base = gitops.head_commit(git_repo)
    hook, pause = tmp_path / "pause-hook", tmp_path / "pause"
    hook.write_text(PAUSE_HOOK)
    hook.chmod(0o755)
    pause.mkdir()
    (git_repo / "mine.txt").write_text("the user's\n")
    git("add", "mine.txt", cwd=git_repo)  # the index was last written by the user's git, not by stella
    user = subprocess.Popen(
        ["git", "-c", f"core.fsmonitor={hook}", "commit", "-q", "-m", "user commit"],
        cwd=git_repo,
        env={**os.environ, "PAUSE_DIR": str(pause)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until((pause / "paused").exists, "the user's git commit to read the index", process=user)
    (git_repo / "a.txt").write_text("the worker's\n")
    landed: list[str] = []
    lane = threading.Thread(target=lambda: landed.append(commit_paths(ctx, ["a.txt"], "t1: add a")))
    lane.start()
    wait_until(lambda: gitops.head_commit(git_repo) != base, "the lane commit to move HEAD")
    # HEAD and the index are the lane's now; it still holds index.lock when the user's git goes on
    assert (git_repo / ".git" / "index.lock").exists()
    (pause / "go").touch()
    _, err = user.communicate(timeout=30)
    lane.join(timeout=30)
    assert user.returncode != 0 and "index.lock" in err, err
    assert landed == [gitops.head_commit(git_repo)]
    assert (
        git("ls-files", "--stage", "a.txt", cwd=git_repo).split()[1]
        == git("rev-parse", "HEAD:a.txt", cwd=git_repo).strip()
    )
    # the user's commit again: their file and the worker's are both in it, nothing deleted
    git("commit", "-q", "-m", "user commit", cwd=git_repo)
    assert git("show", "HEAD:a.txt", cwd=git_repo) == "the worker's\n"
    assert git("show", "HEAD:mine.txt", cwd=git_repo) == "the user's\n"
    assert git("log", "--diff-filter=D", "--name-only", "--format=", f"{base}..HEAD", cwd=git_repo) == ""
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""

    # with no git process of the tree running, the next lane commit holds the lock no longer than it needs;
    # with one that started before the index was replaced (a long-lived `git cat-file --batch`), it lingers
    lingered: list[float] = []
    real_linger = indexlock.IndexLock.linger

    def linger(lock: indexlock.IndexLock) -> None:
        started = time.monotonic()
        real_linger(lock)
        lingered.append(time.monotonic() - started)

    monkeypatch.setattr(indexlock.IndexLock, "linger", linger)
    monkeypatch.setattr(indexlock, "LINGER_S", 0.5)
    (git_repo / "b.txt").write_text("b\n")
    commit_paths(ctx, ["b.txt"], "t1: add b")  # no git running in the tree: no linger
    reader = subprocess.Popen(["git", "cat-file", "--batch"], cwd=git_repo, stdin=subprocess.PIPE)
    try:
        time.sleep(0.05)  # started well before the install, to the clock tick
        (git_repo / "c.txt").write_text("c\n")
        commit_paths(ctx, ["c.txt"], "t1: add c")  # one running since before: lingers its full bound
    finally:
        reader.communicate(timeout=10)
    assert lingered[0] < 0.25 and lingered[1] >= 0.5, lingered


def test_a_commit_waits_while_git_holds_the_index_lock_and_gives_up_after_a_bound(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_attempt(git_repo)
    lock = git_repo / ".git" / "index.lock"
    lock.write_bytes(b"DIRC held by another git process")
    (git_repo / "a.txt").write_text("a\n")
    # git lets go of its lock once the commit has found it held three times: the commit waited for it
    seen_held: list[Path] = []
    real_stale = indexlock.stale_marker

    def stale_marker(path: Path) -> int | None:
        seen_held.append(path)
        if len(seen_held) == 3:
            path.unlink()
        return real_stale(path)

    monkeypatch.setattr(indexlock, "stale_marker", stale_marker)
    sha = commit_paths(ctx, ["a.txt"], "Add a")
    assert seen_held == [lock] * 3
    monkeypatch.setattr(indexlock, "stale_marker", real_stale)
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


def test_a_shared_workers_git_takes_no_optional_locks_and_an_isolated_ones_is_left_alone(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    # A real `git status` run by a shared worker must not hold index.lock to write back refreshed stat
    # data, where the user's git (and the commit lane) would fail on it; in its own worktree it may.
    said = tmp_path / "said"
    write_config(git_repo, run=f'echo "$STELLA_TASK_ID ${{GIT_OPTIONAL_LOCKS-unset}}" >> {said}')
    plan = tmp_path / "plan.toml"
    shared, own = '[[tasks]]\nid = "shared"\nprompt = "p"\n', '[[tasks]]\nid = "own"\nprompt = "p"\n'
    plan.write_text(f'{shared}\n{own}isolation = "isolated"\n')
    proc = stella("fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(said.read_text().splitlines()) == ["own unset", "shared 0"]

    said.unlink()
    proc = stella(
        "fleet", "--pipeline", "command", "--plan", str(plan), cwd=git_repo, env={"GIT_OPTIONAL_LOCKS": "1"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(said.read_text().splitlines()) == ["own 1", "shared 1"]  # the user's own setting stands
