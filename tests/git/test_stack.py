"""git/stack.py: a stacked start built from commit objects alone, the same for the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.git import gitops
from stellafleet.git.stack import Conflict, Contribution, build_start


def _commit_on(repo: Path, start: str, name: str, text: str, *, branch: str | None = None) -> str:
    """A commit of name holding text on top of start (on a new branch, or on the checked-out one)."""
    if branch is not None:
        git("switch", "-q", "-c", branch, start, cwd=repo)
    (repo / name).write_text(text)
    git("add", name, cwd=repo)
    git("commit", "-q", "-m", f"{name}: {text.strip()}", cwd=repo)
    return gitops.head_commit(repo)


def test_one_isolated_parent_gives_its_tip_and_parents_merge_the_same_way_every_time(git_repo: Path) -> None:
    base = gitops.head_commit(git_repo)
    left = _commit_on(git_repo, base, "left.txt", "left\n", branch="left")
    right = _commit_on(git_repo, base, "right.txt", "right\n", branch="right")
    status_before = git("status", "--porcelain", cwd=git_repo)

    assert build_start(git_repo, base, [Contribution("left", tip=left)]) == left
    both = build_start(git_repo, base, [Contribution("left", tip=left), Contribution("right", tip=right)])
    again = build_start(git_repo, base, [Contribution("left", tip=left), Contribution("right", tip=right)])

    assert isinstance(both, str) and both == again
    assert git("ls-tree", "--name-only", both, cwd=git_repo).split() == ["README.md", "left.txt", "right.txt"]
    assert (
        gitops.head_commit(git_repo) == right and git("status", "--porcelain", cwd=git_repo) == status_before
    )


def test_a_shared_parent_brings_its_own_commits_not_the_others_on_its_branch(git_repo: Path) -> None:
    base = gitops.head_commit(git_repo)
    other = _commit_on(git_repo, base, "other.txt", "someone else\n")
    mine = _commit_on(git_repo, other, "mine.txt", "the parent\n")
    twin = _commit_on(git_repo, base, "mine.txt", "the parent\n", branch="twin")  # the same change again

    start = build_start(git_repo, base, [Contribution("parent", commits=(mine,))])
    kept = build_start(git_repo, mine, [Contribution("parent", commits=(mine, twin))])

    assert isinstance(start, str)
    assert git("ls-tree", "--name-only", start, cwd=git_repo).split() == ["README.md", "mine.txt"]
    assert git("log", "-1", "--format=%s", start, cwd=git_repo).strip() == "mine.txt: the parent"
    assert kept == mine  # a commit already in the start, and one that changes nothing, add no commit


def test_parents_that_change_one_file_differently_are_named_with_the_file(git_repo: Path) -> None:
    base = gitops.head_commit(git_repo)
    left = _commit_on(git_repo, base, "f.txt", "left\n", branch="left")
    right = _commit_on(git_repo, base, "f.txt", "right\n", branch="right")
    quiet = _commit_on(git_repo, base, "q.txt", "quiet\n", branch="quiet")

    parts = [
        Contribution("quiet", tip=quiet),
        Contribution("left", tip=left),
        Contribution("right", tip=right),
    ]
    conflict = build_start(git_repo, base, parts)

    assert conflict == Conflict("left", "right", ("f.txt",))
    assert str(conflict) == "parents left and right both change f.txt"


def test_item18_the_same_parents_give_the_same_commit_whatever_the_clock_or_the_identity(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = gitops.head_commit(git_repo)
    left = _commit_on(git_repo, base, "left.txt", "left\n", branch="left")
    right = _commit_on(git_repo, base, "right.txt", "right\n", branch="right")
    picked = _commit_on(git_repo, base, "shared.txt", "shared\n", branch="shared")
    parts = [
        Contribution("left", tip=left),
        Contribution("right", tip=right),
        Contribution("s", commits=(picked,)),
    ]
    starts = []
    for when, who in (("1700000000 +0000", "one"), ("1800000000 +0100", "two")):
        for name in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
            monkeypatch.setenv(name, when)
        for name in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
            monkeypatch.setenv(name, who)
        starts.append(build_start(git_repo, base, parts))

    assert isinstance(starts[0], str) and starts[0] == starts[1]
    assert git("ls-tree", "--name-only", starts[0], cwd=git_repo).split() == [
        "README.md", "left.txt", "right.txt", "shared.txt",
    ]  # fmt: skip


def test_item18_a_conflict_names_the_shared_parent_whose_commit_changed_the_path(git_repo: Path) -> None:
    base = gitops.head_commit(git_repo)
    quiet = _commit_on(git_repo, base, "q.txt", "quiet\n", branch="quiet")
    first = _commit_on(git_repo, base, "s.txt", "shared\n", branch="shared")
    second = _commit_on(git_repo, first, "f.txt", "shared\n")
    right = _commit_on(git_repo, base, "f.txt", "right\n", branch="right")

    parts = [
        Contribution("quiet", tip=quiet),
        Contribution("shared", commits=(first, second)),
        Contribution("right", tip=right),
    ]
    assert build_start(git_repo, base, parts) == Conflict("shared", "right", ("f.txt",))


def test_item18_a_chain_of_tips_starts_at_its_last_link_and_a_later_parent_still_counts(
    git_repo: Path,
) -> None:
    base = gitops.head_commit(git_repo)
    first = _commit_on(git_repo, base, "one.txt", "1\n", branch="one")
    second = _commit_on(git_repo, first, "two.txt", "2\n")
    side = _commit_on(git_repo, base, "side.txt", "side\n", branch="side")

    chain = [Contribution("one", tip=first), Contribution("two", tip=second)]
    assert build_start(git_repo, base, chain) == second
    start = build_start(git_repo, base, [*chain, Contribution("side", tip=side)])
    assert isinstance(start, str)
    assert git("ls-tree", "--name-only", start, cwd=git_repo).split() == [
        "README.md", "one.txt", "side.txt", "two.txt",
    ]  # fmt: skip


def test_a_conflict_names_both_parents_and_at_most_five_paths() -> None:
    assert str(Conflict("a", "b", ("x.txt",))) == "parents a and b both change x.txt"
    many = tuple(f"f{n}.txt" for n in range(7))
    assert str(Conflict("a", "b", many)) == (
        "parents a and b both change f0.txt, f1.txt, f2.txt, f3.txt, f4.txt and 2 more"
    )
    assert str(Conflict("a", "b", many[:5])).endswith("f3.txt, f4.txt")  # five: all named, no "more"


def test_a_conflict_in_a_path_git_would_read_as_a_pattern_names_the_parent_that_changed_it(
    git_repo: Path,
) -> None:
    """`a*.txt` and `é.txt` are paths, not patterns, nor quoted: the parent changing `ab.txt` is not named."""
    base = gitops.head_commit(git_repo)
    lookalike = _commit_on(git_repo, base, "ab.txt", "other\n", branch="lookalike")
    for name in ("a*.txt", "é.txt"):
        left = _commit_on(git_repo, base, name, "left\n", branch=f"left-{len(name)}")
        right = _commit_on(git_repo, base, name, "right\n", branch=f"right-{len(name)}")
        parts = [Contribution("lookalike", tip=lookalike), Contribution("left", tip=left)]
        found = build_start(git_repo, base, [*parts, Contribution("right", tip=right)])
        assert found == Conflict("left", "right", (name,))
