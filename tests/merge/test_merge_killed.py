"""A `stella merge` killed with SIGKILL in the middle of landing a branch is finished by the next stella
command: a moved ref gets its index and files, the check it was running is stopped, its scratch worktree
and directory are removed and its `planned` row is settled (merged only when the branch is in main)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from helpers.merging import build_run, merges
from helpers.repo import StellaRunner, git
from helpers.spawn import ended_within

from stellafleet.core.paths import StatePaths

REAL_GIT = shutil.which("git")


def start_merge(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`stella merge` in a session of its own, so the whole command (its git children too) can be killed
    at once, as a terminal's kill of the job would."""
    return subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "merge", "--serial", *args],
        cwd=root,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(path: Path, seconds: float = 60.0, *, proc: subprocess.Popen[str] | None = None) -> None:
    """Wait for path to appear; fail at once, with what it said, when proc ended before it did."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{path} never appeared: the merge ended ({proc.returncode}):\n{out}{err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def kill_merge(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def worktrees(root: Path) -> list[str]:
    out = git("worktree", "list", "--porcelain", cwd=root)
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def test_a_merge_killed_between_the_ref_and_the_tree_is_finished_by_the_next_command(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    heads = build_run(git_repo).heads
    # The PATH shim widens the window between `update-ref` and `read-tree -m -u` (the kill lands there
    # every time instead of 1 in 25): the shim's read-tree marks that it started, then waits to be killed.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "git").write_text(
        f'#!/bin/sh\nif [ "$1" = read-tree ]; then touch "$MARK"; sleep 60; fi\nexec {REAL_GIT} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    mark = tmp_path / "read-tree.started"
    env = {"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "MARK": str(mark)}
    proc = start_merge(git_repo, env)
    wait_for(mark)
    kill_merge(proc)

    # the half-done state the issue saw: main moved to a's result, the index and files are still old
    journal = json.loads(StatePaths(git_repo).merge_journal.read_text())
    scratch, new = Path(journal["scratch"]), journal["landing"]["new"]
    assert git("rev-parse", "main", cwd=git_repo).strip() == new
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo).strip()
    assert not (git_repo / "a.txt").exists()
    assert scratch.is_dir() and len(worktrees(git_repo)) == 2
    assert [r["status"] for r in merges(git_repo)] == ["planned"]

    done = stella("runs", cwd=git_repo)  # any stella command finishes it
    assert done.returncode == 0, done.stderr
    assert "a killed stella merge" in done.stderr and "recorded merged" in done.stderr
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    assert (git_repo / "a.txt").read_text() == "a\n"
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == new
    assert git("merge-base", "--is-ancestor", heads["a"], new, cwd=git_repo) == ""
    [row] = merges(git_repo)
    assert row["status"] == "merged" and row["after_sha"] == new and "killed" in row["reason"]
    assert not scratch.exists() and worktrees(git_repo) == [str(git_repo)]
    assert not StatePaths(git_repo).merge_journal.exists()

    # and stella merge goes on from there: a is already in, b lands on it
    again = stella("merge", cwd=git_repo)
    statuses = {r["task_id"]: r["status"] for r in merges(git_repo)[1:]}
    assert statuses["a"] == "skipped" and statuses["b"] == "merged", again.stdout + again.stderr
    assert "planned" not in [r["status"] for r in merges(git_repo)]


def test_a_merge_killed_during_its_check_leaves_no_check_worktree_or_planned_row(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    start = git("rev-parse", "main", cwd=git_repo).strip()
    pid_file = tmp_path / "check.pid"
    check = f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; sleep 60"
    proc = start_merge(git_repo, {}, "--check", check)
    wait_for(pid_file)
    check_pid = int(pid_file.read_text())
    kill_merge(proc)
    assert psutil.pid_exists(check_pid)  # the check has its own session: the kill did not reach it
    scratch = Path(json.loads(StatePaths(git_repo).merge_journal.read_text())["scratch"])

    done = stella("runs", cwd=git_repo)
    assert done.returncode == 0, done.stderr
    assert "its check (pid " in done.stderr and ") stopped" in done.stderr
    assert ended_within(check_pid, 10)
    [row] = merges(git_repo)
    assert row["status"] == "error" and "stopped before this branch landed" in row["reason"]
    assert git("rev-parse", "main", cwd=git_repo).strip() == start
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    kept = str(StatePaths(git_repo).private / "merge-trees" / "check-1")  # the kept check tree stays
    assert not scratch.exists() and worktrees(git_repo) == [str(git_repo), kept]


def test_a_second_merge_is_refused_while_one_runs(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    pid_file = tmp_path / "check.pid"
    proc = start_merge(git_repo, {}, "--check", f"touch {pid_file}; sleep 60")
    wait_for(pid_file)
    try:
        second = stella("merge", cwd=git_repo)
        assert second.returncode == 2 and "another stella merge is running" in second.stderr
        assert stella("runs", cwd=git_repo).stderr == ""  # a live merge is left alone
    finally:
        kill_merge(proc)
    stella("runs", cwd=git_repo)


def test_a_merge_interrupted_with_ctrl_c_settles_its_row_and_scratch_at_once(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    pid_file = tmp_path / "check.pid"
    proc = start_merge(
        git_repo, {}, "--check", f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; sleep 60"
    )
    wait_for(pid_file)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert ended_within(int(pid_file.read_text()), 10)
    assert not StatePaths(git_repo).merge_journal.exists()
    [row] = merges(git_repo)
    assert row["status"] == "error" and "stopped before this branch landed" in row["reason"]
    kept = str(StatePaths(git_repo).private / "merge-trees" / "check-1")  # the kept check tree stays
    assert worktrees(git_repo) == [str(git_repo), kept]
    assert stella("runs", cwd=git_repo).stderr == ""  # nothing left for the next command to finish


def slow_checkout_of(root: Path, path: str, mark: Path) -> None:
    """Make the real `git read-tree -m -u` in root stop inside its checkout of path, holding git's own
    .git/index.lock, until it is killed: a smudge filter for path that, in root's work tree and only the
    first time, marks that it started and sleeps. This widens the window a kill has to land in; the lock
    and the half-written tree are git's own. Files before path in the index (README.md) are already
    written by then."""
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "attributes").write_text(f"{path} filter=slow\n")
    smudge = f'if [ "$(pwd)" = "{root}" ] && [ ! -e "{mark}" ]; then touch "{mark}"; sleep 60; fi; cat'
    git("config", "filter.slow.smudge", smudge, cwd=root)
    git("config", "filter.slow.clean", "cat", cwd=root)


def test_a_merge_killed_inside_read_tree_has_gits_index_lock_removed_and_the_step_finished(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    heads = build_run(git_repo).heads
    mark = tmp_path / "checkout.started"
    slow_checkout_of(git_repo, "a.txt", mark)
    proc = start_merge(git_repo, {})
    wait_for(mark)
    kill_merge(proc)

    lock = git_repo / ".git" / "index.lock"
    assert lock.exists()  # git's own, left by the killed read-tree
    new = json.loads(StatePaths(git_repo).merge_journal.read_text())["landing"]["new"]
    assert git("rev-parse", "main", cwd=git_repo).strip() == new
    # README.md was written before the kill, the index still has the old one
    assert (git_repo / "README.md").read_text() == "# changed by a\n"

    done = stella("runs", cwd=git_repo)
    assert done.returncode == 0, done.stderr
    assert "removed the .git/index.lock its killed git left" in done.stderr, done.stderr
    assert "recorded merged" in done.stderr
    assert not lock.exists()
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    assert (git_repo / "a.txt").read_text() == "a\n"
    assert git("merge-base", "--is-ancestor", heads["a"], "HEAD", cwd=git_repo) == ""
    [row] = merges(git_repo)
    assert row["status"] == "merged" and row["after_sha"] == new
    assert not StatePaths(git_repo).merge_journal.exists()


def test_an_index_lock_with_a_live_git_in_the_repository_is_left_and_said_in_one_line(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    mark = tmp_path / "checkout.started"
    slow_checkout_of(git_repo, "a.txt", mark)
    # a git of the user's started before the lock was made and still runs in the repository (waiting on
    # its input, as a git waiting for an editor would): the lock may be its own, so it stays
    other = subprocess.Popen(
        [REAL_GIT or "git", "hash-object", "--stdin"], cwd=git_repo, stdin=subprocess.PIPE, text=True
    )
    try:
        proc = start_merge(git_repo, {})
        wait_for(mark)
        kill_merge(proc)
        done = stella("runs", cwd=git_repo)
    finally:
        other.communicate("x", timeout=30)
    lock = git_repo / ".git" / "index.lock"
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "index.lock" in line]
    assert len(said) == 1 and "a git process runs in this repository" in said[0], done.stderr
    assert lock.exists() and StatePaths(git_repo).merge_journal.exists()

    again = stella("runs", cwd=git_repo)  # once it has ended, the next command finishes the merge
    assert "removed the .git/index.lock" in again.stderr and "recorded merged" in again.stderr
    assert not lock.exists() and not StatePaths(git_repo).merge_journal.exists()
