"""A lane commit is caught up on what the user's git did since it was built: without index.lock (the lock
let go at once when it finds them moved), or past LOCKLESS_S under it, in the same way.

The hook point is the start of the commit's `git update-ref` (index.HeadMove), after the commit was built
and caught up, just before index.lock is taken: the user's real git runs there, once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.git import gitops, index, lane
from stellafleet.git.indexlock import IndexLock
from stellafleet.git.lane import commit_paths


def _between_build_and_lock(monkeypatch: pytest.MonkeyPatch, user: Callable[[], None]) -> list[int]:
    """Run user once where the commit was built aside and index.lock not yet taken; count lock takes."""
    real_move, real_held = index.HeadMove, IndexLock.held.__func__  # type: ignore[attr-defined]
    locks: list[int] = []

    def head_move(root: Path, reflog: str) -> index.HeadMove:
        if not locks:
            user()
        return real_move(root, reflog)

    def held(cls: type[IndexLock], root: Path, **options: object) -> object:
        locks.append(1)
        return real_held(cls, root, **options)

    monkeypatch.setattr(index, "HeadMove", head_move)
    monkeypatch.setattr(IndexLock, "held", classmethod(held))
    return locks


@pytest.mark.parametrize(("lockless_s", "locks_taken"), [(5.0, [1, 1]), (0.0, [1])])
def test_a_user_commit_just_before_the_lock_is_built_on(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch, lockless_s: float, locks_taken: list[int]
) -> None:
    monkeypatch.setattr(lane, "LOCKLESS_S", lockless_s)
    ctx = make_attempt(git_repo)
    base = gitops.head_commit(git_repo)

    def user_commits() -> None:
        (git_repo / "mine.txt").write_text("the user's\n")
        git("add", "mine.txt", cwd=git_repo)
        git("commit", "-q", "-m", "user commit", cwd=git_repo)
        (git_repo / "staged.txt").write_text("staged, not committed\n")
        git("add", "staged.txt", cwd=git_repo)

    locks = _between_build_and_lock(monkeypatch, user_commits)
    (git_repo / "a.txt").write_text("the worker's\n")
    sha = commit_paths(ctx, ["a.txt"], "t1: add a")

    # let go and caught up without the lock, or (past LOCKLESS_S) caught up under the lock it took
    assert locks == locks_taken
    assert sha == gitops.head_commit(git_repo)
    assert git("rev-parse", f"{sha}^^", cwd=git_repo).strip() == base  # on the user's commit
    assert git("show", "--format=", "--name-status", sha, cwd=git_repo).split() == ["A", "a.txt"]
    assert git("show", f"{sha}:mine.txt", cwd=git_repo) == "the user's\n"
    # the index: HEAD's, plus the user's staged file kept staged
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == "A  staged.txt\n"


def test_a_user_add_just_before_the_lock_stays_staged_beside_the_commit(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_attempt(git_repo)

    def user_adds() -> None:
        (git_repo / "mine.txt").write_text("the user's\n")
        git("add", "mine.txt", cwd=git_repo)

    locks = _between_build_and_lock(monkeypatch, user_adds)
    (git_repo / "a.txt").write_text("the worker's\n")
    sha = commit_paths(ctx, ["a.txt"], "t1: add a")

    assert locks == [1, 1]
    assert git("show", "--format=", "--name-status", sha, cwd=git_repo).split() == ["A", "a.txt"]
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == "A  mine.txt\n"
