"""The commit lane when something goes wrong: an error after HEAD moved, and what a dead holder left."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import make_attempt, run_record
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, indexlock, lanejournal
from stellafleet.git.indexlock import IndexLock
from stellafleet.git.lane import commit_paths


def test_a_commit_that_fails_after_head_moved_is_recorded_and_its_journal_cleared_first(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_attempt(git_repo)
    journal = StatePaths(git_repo).private / lanejournal.JOURNAL_NAME
    seen: dict[str, object] = {}

    def fail_after_head_moved(lock: IndexLock) -> None:
        raise RuntimeError("killed just after HEAD moved")

    real_finish = lanejournal.finish

    def finish_then_look(root: Path, path: Path, record: object) -> object:
        done = real_finish(root, path, record)  # type: ignore[arg-type]
        # what the error's caller will find, looked at just before the error propagates
        seen["commits"] = [row["sha"] for row in run_record(git_repo)["commits"]]
        seen["journal"] = path.exists()
        return done

    monkeypatch.setattr(IndexLock, "linger", fail_after_head_moved)
    monkeypatch.setattr(lanejournal, "finish", finish_then_look)
    before = gitops.head_commit(git_repo)
    (git_repo / "a.txt").write_text("a\n")
    with pytest.raises(RuntimeError, match="killed just after HEAD moved"):
        commit_paths(ctx, ["a.txt"], "Add a")
    moved = gitops.head_commit(git_repo)
    assert moved != before  # the commit landed before the error
    assert seen == {"commits": [moved], "journal": False}
    assert [row["sha"] for row in run_record(git_repo)["commits"]] == [moved]
    assert not journal.exists()
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""


def test_a_dead_holders_leftovers_beside_the_index_are_gone_after_the_next_lane_commit(
    git_repo: Path,
) -> None:
    ctx = make_attempt(git_repo)
    git_dir = git_repo / ".git"
    dead = 999_999  # no such process: its lock marker names a holder that is gone
    (git_dir / "index.lock").write_text(f"{indexlock.MARKER} {dead} 0.0\n")
    leftovers = [git_dir / f"index.stella-{what}-{dead}" for what in ("lock", "new", "noting")]
    for leftover in leftovers:
        leftover.write_text("left by a killed stella\n")
    (git_repo / "a.txt").write_text("a\n")
    sha = commit_paths(ctx, ["a.txt"], "Add a")
    assert sha == gitops.head_commit(git_repo)
    assert [path.name for path in leftovers if path.exists()] == []
    assert not (git_dir / "index.lock").exists()
    assert sorted(p.name for p in git_dir.glob("index.stella-*")) == []
