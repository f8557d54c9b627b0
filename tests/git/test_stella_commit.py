"""`stella commit -m MSG PATH ...`: only inside a worker, exactly the named paths, recorded for the task."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.fleet import RUN, make_attempt
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger


def test_outside_a_worker_it_is_the_users_own_commit_of_exactly_those_paths(
    git_repo: Path, stella: StellaRunner
) -> None:
    (git_repo / "a.txt").write_text("a\n")
    (git_repo / "b.txt").write_text("b\n")
    hook = git_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text('#!/bin/sh\ngit diff --cached --name-only > "$SEEN"\n')
    hook.chmod(0o755)
    seen = git_repo.parent / "seen"
    proc = stella("commit", "-m", "mine", "a.txt", cwd=git_repo, env={"SEEN": str(seen)})
    assert proc.returncode == 0, proc.stderr
    assert git("show", "--name-only", "--format=%s", "HEAD", cwd=git_repo).split() == ["mine", "a.txt"]
    assert seen.read_text() == "a.txt\n"  # the hooks ran on exactly its paths
    assert git("status", "--porcelain", "b.txt", cwd=git_repo) == "?? b.txt\n"
    with Ledger.open(git_repo / ".stella" / "private" / "fleet.db") as ledger:
        assert ledger.runs.latest_id() is None  # recorded for no task
    with ClaimStore.open(git_repo / ".stella" / "private" / "store.db") as store:
        assert store.claims() == []


def test_inside_a_worker_it_commits_exactly_the_named_paths_and_records_them(
    git_repo: Path, stella: StellaRunner
) -> None:
    ctx = make_attempt(git_repo)
    env = ctx.to_env()
    (git_repo / "src").mkdir()
    (git_repo / "src" / "mine.py").write_text("print('mine')\n")
    (git_repo / "src" / "theirs.py").write_text("print('theirs')\n")
    (git_repo / "README.md").write_text("user edit\n")
    before = gitops.head_commit(git_repo)

    # a path relative to the current directory, from a subdirectory of the workspace
    proc = stella("commit", "-m", "Add mine.py\n\nbody", "mine.py", cwd=git_repo / "src", env=env)

    assert proc.returncode == 0, proc.stderr
    sha = proc.stdout.strip()
    assert len(sha) == 40 and sha == gitops.head_commit(git_repo)
    assert git("rev-parse", f"{sha}~1", cwd=git_repo).strip() == before
    assert git("show", "--name-only", "--format=", sha, cwd=git_repo).split() == ["src/mine.py"]
    status = git("status", "--porcelain", cwd=git_repo).splitlines()
    assert " M README.md" in status and "?? src/theirs.py" in status
    assert not any("mine.py" in line for line in status)
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        commits = ledger.get_run(RUN)["commits"]
    assert [(c["sha"], c["task_id"], c["attempt_id"], c["branch"], c["message"]) for c in commits] == [
        (sha, "t1", ctx.attempt_id, "main", "Add mine.py")
    ]


def test_a_path_another_live_worker_holds_is_refused_by_name(git_repo: Path, stella: StellaRunner) -> None:
    ctx = make_attempt(git_repo)
    (git_repo / "held.txt").write_text("x\n")
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.acquire(["held.txt"], Holder.current(RUN, "owner", "The owner", 999, pid=os.getpid()))
    proc = stella("commit", "-m", "grab", "held.txt", cwd=git_repo, env=ctx.to_env())
    assert proc.returncode == 1
    assert f'claim conflict: held.txt is held by task "owner" (The owner) (run {RUN}, pid {os.getpid()})' in (
        proc.stderr
    )
    assert git("rev-list", "--count", "HEAD", cwd=git_repo).strip() == "1"


def test_paths_outside_the_workspace_are_refused(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    ctx = make_attempt(git_repo)
    (tmp_path / "outside.txt").write_text("x\n")
    proc = stella("commit", "-m", "escape", "../outside.txt", cwd=git_repo, env=ctx.to_env())
    assert proc.returncode == 2 and "inside the workspace" in proc.stderr
    missing = stella("commit", "-m", "nothing", cwd=git_repo, env=ctx.to_env())
    assert missing.returncode == 2 and "PATH" in missing.stderr


def test_a_path_with_a_glob_character_is_that_file_alone(git_repo: Path, stella: StellaRunner) -> None:
    """`a*.txt` is committed as the one file it names: the user's staged ab.txt stays staged, uncommitted."""
    for name in ("a*.txt", "ab.txt"):
        (git_repo / name).write_text("old\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    (git_repo / "ab.txt").write_text("the user's staged change\n")
    git("add", "ab.txt", cwd=git_repo)
    ctx = make_attempt(git_repo)
    (git_repo / "a*.txt").write_text("the worker's\n")

    done = stella("commit", "-m", "Change a*", "a*.txt", cwd=git_repo, env=ctx.to_env())

    assert done.returncode == 0, done.stderr
    assert git("show", "--name-only", "--format=", "HEAD", cwd=git_repo).split() == ["a*.txt"]
    assert git("diff", "--cached", "--name-only", cwd=git_repo).split() == ["ab.txt"]
