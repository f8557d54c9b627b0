"""A `stella commit` killed while it holds the commit lane: the lane is free at once, nothing half-done.

The killed process is held at the moment HEAD moves by a real `reference-transaction` hook (git runs it
for the lane's `update-ref`), inside a stand-in worker: a shell carrying the attempt's environment that
lives on after its `stella commit` is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.fleet import RUN, make_attempt, wait_for
from helpers.repo import StellaRunner, git, run_stella

from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger


def gate_hook(repo: Path, gate: Path, entered: Path, release: Path, committed: Path) -> None:
    """A reference-transaction hook that holds the first ref update while `gate` exists."""
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(
        "#!/bin/sh\ncat >/dev/null\n"
        f'if [ "$1" = prepared ] && [ -e {gate} ]; then\n'
        f"  rm -f {gate}; touch {entered}\n"
        f"  while [ ! -e {release} ]; do sleep 0.02; done\n"
        "fi\n"
        f'if [ "$1" = committed ]; then touch {committed}; fi\n'
    )
    hook.chmod(0o755)


def commit_child(worker: subprocess.Popen[bytes]) -> psutil.Process:
    """The `stella commit` process the stand-in worker started."""
    for child in psutil.Process(worker.pid).children(recursive=True):
        if "stellafleet" in " ".join(child.cmdline()):
            return child
    raise AssertionError("the worker's stella commit is not running")


def test_a_killed_stella_commit_frees_the_lane_at_once_and_its_commit_is_finished(
    git_repo: Path, tmp_path: Path
) -> None:
    ctx = make_attempt(git_repo)
    marks = {name: tmp_path / name for name in ("gate", "entered", "release", "committed")}
    gate_hook(git_repo, **marks)
    marks["gate"].touch()
    (git_repo / "a.txt").write_text("a\n")
    command = f"{sys.executable} -m stellafleet commit -m 'Add a' a.txt; sleep 60"
    env = {**os.environ, **ctx.to_env()}
    worker = subprocess.Popen(["sh", "-c", command], cwd=git_repo, env=env, start_new_session=True)
    try:
        wait_for(marks["entered"], timeout=30, process=worker)
        os.kill(commit_child(worker).pid, signal.SIGKILL)
        marks["release"].touch()  # its orphaned update-ref now moves HEAD: a commit with no record yet
        wait_for(marks["committed"], timeout=10, process=worker)
        # free at once: with no time at all to wait, the lane of the killed holder is taken over
        probe = Holder.current(RUN, "probe", "Probe", 99)
        with ClaimStore.open(ctx.paths.store_db) as store, store.commit_lane(probe, timeout=0):
            pass
        (git_repo / "b.txt").write_text("b\n")
        proc = run_stella("commit", "-m", "Add b", "b.txt", cwd=git_repo, env=ctx.to_env(), timeout=30)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert proc.returncode == 0, proc.stderr
    head_commits = git("rev-list", "HEAD", "--not", "HEAD~2", cwd=git_repo).split()
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        rows = ledger.get_run(RUN)["commits"]
    assert sorted(row["sha"] for row in rows) == sorted(head_commits)
    assert {row["message"] for row in rows} == {"Add a", "Add b"}
    # the index holds both commits' files: nothing staged, nothing left as a deletion, no stale lock
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    assert not (git_repo / ".git" / "index.lock").exists()


def _hold_hook(repo: Path, entered: Path) -> None:
    """A reference-transaction hook that holds the lane's `update-ref` for good, once it has started: the
    `stella commit` is then inside git's index.lock with the index installed and HEAD not yet moved."""
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(
        f'#!/bin/sh\ncat >/dev/null\nif [ "$1" = prepared ]; then touch {entered}; sleep 600; fi\n'
    )
    hook.chmod(0o755)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stella_commit_killed_holding_index_lock_is_cleaned_up_by_the_next_stella_command(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, signum: int
) -> None:
    """The hook stands in for the instant between installing the index and moving HEAD (a window a few
    milliseconds wide in real life: the hook only holds it open)."""
    ctx = make_attempt(git_repo)
    before = git("rev-parse", "HEAD", cwd=git_repo).strip()
    (git_repo / "mine.txt").write_text("the user's staged file\n")
    git("add", "mine.txt", cwd=git_repo)
    entered = tmp_path / "entered"
    _hold_hook(git_repo, entered)
    (git_repo / "a.txt").write_text("the worker's\n")
    env = {**os.environ, **ctx.to_env()}
    commit = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "commit", "-m", "Add a", "a.txt"],
        cwd=git_repo, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(entered, timeout=30)
        dot_git = git_repo / ".git"
        assert (dot_git / "index.lock").exists()
        assert (git_repo / ".stella" / "private" / "commit-lane.json").exists()
        os.killpg(commit.pid, signum)  # the `stella commit` and its git (the hook too)
        commit.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(commit.pid, signal.SIGKILL)
    (dot_git / "hooks" / "reference-transaction").unlink()
    assert (dot_git / "index.lock").exists()  # what the killed commit left: the user's git would fail
    user = subprocess.run(["git", "commit", "-q", "-m", "x"], cwd=git_repo, capture_output=True, text=True)
    assert user.returncode != 0 and "index.lock" in user.stderr

    runs = stella("runs", cwd=git_repo)  # any stella command

    assert runs.returncode == 0, runs.stderr
    assert not (dot_git / "index.lock").exists()
    assert list(dot_git.glob("index.stella-*")) == []
    assert not (git_repo / ".stella" / "private" / "commit-lane.json").exists()
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == before
    # the user's index is what it was: their staged file, and not the killed attempt's
    assert git("diff", "--cached", "--name-only", cwd=git_repo).split() == ["mine.txt"]
    git("commit", "-q", "-m", "the user's commit", cwd=git_repo)
    assert git("show", "--name-only", "--format=", "HEAD", cwd=git_repo).split() == ["mine.txt"]
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        assert ledger.get_run(RUN)["commits"] == []
