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


LINES = "".join(f"line {n}\n" for n in range(1, 21))


def near_edits(repo: Path) -> tuple[str, str]:
    """main with f.txt; fleet/a changes its line 10 and fleet/b its line 12 (within git's three lines of
    context), both off main; their tips."""
    (repo / "f.txt").write_text(LINES)
    git("add", "f.txt", cwd=repo)
    git("commit", "-q", "-m", "f", cwd=repo)
    tips = []
    for name, line in (("a", 10), ("b", 12)):
        git("switch", "-q", "-c", f"fleet/{name}", "main", cwd=repo)
        (repo / "f.txt").write_text(LINES.replace(f"line {line}\n", f"line {line} by {name}\n"))
        git("commit", "-q", "-am", f"{name} edits line {line}", cwd=repo)
        tips.append(gitops.head_commit(repo))
    git("switch", "-q", "main", cwd=repo)
    return tips[0], tips[1]


def test_a_branch_rebased_next_to_anothers_change_is_held_though_its_patch_id_changed(git_repo: Path) -> None:
    a, b = near_edits(git_repo)
    git("merge", "-q", "--ff-only", a, cwd=git_repo)
    git("rebase", "-q", "main", "fleet/b", cwd=git_repo)  # b's patch now has a's line in its context
    rebased = gitops.head_commit(git_repo)
    git("switch", "-q", "main", cwd=git_repo)
    assert git("cherry", rebased, b, cwd=git_repo).startswith("+")  # a patch id no longer tells

    assert mergeops.contains(git_repo, rebased, b)
    assert mergeops.contains(git_repo, rebased, a)
    assert not mergeops.contains(git_repo, a, b)  # main with a alone does not hold b
    git("switch", "-q", "-c", "undone", rebased, cwd=git_repo)
    (git_repo / "f.txt").write_text(LINES.replace("line 10\n", "line 10 by a\n"))
    git("commit", "-q", "-am", "b's edit undone", cwd=git_repo)
    assert not mergeops.contains(git_repo, gitops.head_commit(git_repo), b)  # b's change is gone again


def test_conflicted_paths_git_would_quote_come_back_as_they_are_with_their_markers(git_repo: Path) -> None:
    names = ("two words*.txt", "é.txt")  # in git's (byte) order
    for name in names:
        (git_repo / name).write_text("base\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "base", cwd=git_repo)
    base = gitops.head_commit(git_repo)
    tips = []
    for side in ("ours", "theirs"):
        git("switch", "-q", "-c", side, base, cwd=git_repo)
        for name in names:
            (git_repo / name).write_text(f"{side}\n")
        git("commit", "-q", "-am", side, cwd=git_repo)
        tips.append(gitops.head_commit(git_repo))

    assert mergeops.merge_tree(git_repo, *tips) == (None, names)
    step = mergeops.rebase_onto(git_repo, tips[0], base, tips[1])
    assert step.head is None and step.conflicts == names
    assert step.conflict_diff.count("<<<<<<<") == 2 and "two words*.txt" in step.conflict_diff
    (git_repo / "two words and more.txt").write_text("a file the pattern would match\n")
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "lookalike", cwd=git_repo)  # on theirs (detached)
    landed = mergeops.landed_with(git_repo, base, "HEAD", ("two words*.txt",))
    assert [line.split(" ", 1)[1] for line in landed] == ["theirs"]  # the commits touching that path alone
