"""git/hookstash.py: which hooks may use the stash, and the stash list put back as it was around them."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.git import hookstash


def _stash(repo: Path, n: int) -> None:
    (repo / "f.txt").write_text(f"change {n}\n")
    git("stash", "push", "-q", "-m", f"the user's {n}", cwd=repo)


@pytest.fixture
def repo(git_repo: Path) -> Path:
    (git_repo / "f.txt").write_text("original\n")
    git("add", "f.txt", cwd=git_repo)
    git("commit", "-q", "-m", "f", cwd=git_repo)
    for n in range(3):
        _stash(git_repo, n)
    return git_repo


def test_an_entry_a_hook_left_is_removed_and_one_it_dropped_is_put_back_in_its_place(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = hookstash.entries(repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo):
        git("stash", "drop", "-q", "stash@{1}", cwd=repo)  # the middle one: the user's 1
        _stash(repo, 9)  # a backup left behind
    assert hookstash.entries(repo) == before
    assert [message for _, message in before] == [
        "On main: the user's 2",
        "On main: the user's 1",
        "On main: the user's 0",
    ]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2
    assert said[0].startswith("stella: a commit hook left stash entry ") and said[0].endswith("; removed it")
    assert said[1].endswith("(On main: the user's 1); put it back")


def test_an_untouched_stash_is_left_alone(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = git("reflog", "show", "--format=%H %gs", "refs/stash", cwd=repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo):
        pass
    assert git("reflog", "show", "--format=%H %gs", "refs/stash", cwd=repo) == before
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("where", "text", "uses"),
    [
        (".git/hooks/pre-commit", "#!/bin/sh\nnpx lint-staged\n", True),
        (".git/hooks/commit-msg", "#!/bin/sh\ngit  stash push -q\n", True),
        (".git/hooks/pre-commit", "#!/bin/sh\nexec ruff check\n", False),
        (".husky/pre-commit", "npx lint-staged\n", True),  # run by husky's .husky/_/pre-commit
    ],
)
def test_auto_serialises_hooks_that_may_use_the_stash(repo: Path, where: str, text: str, uses: bool) -> None:
    if where.startswith(".husky"):
        (repo / ".husky" / "_").mkdir(parents=True)
        (repo / ".husky" / "_" / "pre-commit").write_text('#!/bin/sh\n. "$(dirname "$0")/h"\n')
        git("config", "core.hooksPath", ".husky/_", cwd=repo)
    script = repo / where
    script.write_text(text)
    script.chmod(0o755)
    assert hookstash.serialised("auto", repo) is uses
    assert hookstash.serialised(True, repo) and not hookstash.serialised(False, repo)
