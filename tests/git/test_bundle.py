"""Bundles: the base travels to a scratch clone on the task's branch, base..branch travels back."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git

from stellafleet.git import bundle, gitops


def test_a_branch_travels_out_and_back_as_git_objects(git_repo: Path, tmp_path: Path) -> None:
    base = gitops.head_commit(git_repo)
    (git_repo / "later.txt").write_text("after the base\n")
    git("add", "later.txt", cwd=git_repo)
    git("commit", "-q", "-m", "after the base", cwd=git_repo)
    out = tmp_path / "base.bundle"
    bundle.create_base(git_repo, base, out, tag="r1")
    assert gitops.git("for-each-ref", "refs/stella", cwd=git_repo) == ""  # the helper ref is gone again

    clone = tmp_path / "clone"
    assert bundle.clone_on_branch(out, clone, "fleet/t1-abc") == base
    assert gitops.current_branch(clone) == "fleet/t1-abc"
    assert not (clone / "later.txt").exists()
    assert not bundle.create_range(clone, base, "fleet/t1-abc", tmp_path / "none.bundle")
    git("config", "user.name", "Remote", cwd=clone)
    git("config", "user.email", "remote@example.invalid", cwd=clone)
    (clone / "work.txt").write_text("done remotely\n")
    git("add", "work.txt", cwd=clone)
    git("commit", "-q", "-m", "remote work", cwd=clone)
    back = tmp_path / "back.bundle"
    assert bundle.create_range(clone, base, "fleet/t1-abc", back)

    bundle.fetch_branch(git_repo, back, "fleet/t1-abc", base)
    assert git("log", "--format=%s", f"{base}..fleet/t1-abc", cwd=git_repo) == "remote work\n"
    assert git("show", "fleet/t1-abc:work.txt", cwd=git_repo) == "done remotely\n"
    assert gitops.current_branch(git_repo) == "main"  # nothing checked out, no worktree made

    bundle.fetch_branch(git_repo, None, "fleet/t2-def", base)  # nothing came back: the branch is the base
    assert gitops.resolve_commit(git_repo, "fleet/t2-def") == base
