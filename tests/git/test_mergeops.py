"""git/mergeops.py: a fast-forward killed between moving its branch and checking out is finished."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git

from stellafleet.git import gitops, mergeops


def test_a_fast_forward_killed_in_its_checkout_adopts_the_files_it_wrote_and_finishes(git_repo: Path) -> None:
    branch = gitops.current_branch(git_repo)
    assert branch is not None
    (git_repo / "a.txt").write_text("old\n")
    (git_repo / "gone.txt").write_text("gone\n")
    git("add", "a.txt", "gone.txt", cwd=git_repo)
    git("commit", "-q", "-m", "old", cwd=git_repo)
    old = gitops.head_commit(git_repo)
    git("switch", "-q", "-c", "next", cwd=git_repo)
    (git_repo / "a.txt").write_text("new\n")
    (git_repo / "b.txt").write_text("b\n")
    git("rm", "-q", "gone.txt", cwd=git_repo)
    git("add", "a.txt", "b.txt", cwd=git_repo)
    git("commit", "-q", "-m", "new", cwd=git_repo)
    new = gitops.head_commit(git_repo)
    git("switch", "-q", branch, cwd=git_repo)
    # killed after `update-ref` and part of `read-tree -m -u`: the index is old's, two files are new's
    git("update-ref", f"refs/heads/{branch}", new, old, cwd=git_repo)
    (git_repo / "a.txt").write_text("new\n")
    (git_repo / "b.txt").write_text("b\n")

    assert mergeops.finish_advance(git_repo, branch, old, new)
    assert git("status", "--porcelain", cwd=git_repo) == ""
    assert not (git_repo / "gone.txt").exists()


def test_an_advance_whose_branch_never_moved_is_not_finished(git_repo: Path) -> None:
    branch = gitops.current_branch(git_repo)
    assert branch is not None
    head = gitops.head_commit(git_repo)
    assert not mergeops.finish_advance(git_repo, branch, head, "0" * 40)
