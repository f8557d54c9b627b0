"""git/hookstash.py: which hooks may use the stash, and what they leave in it removed: only entries made from
what the hooks ran on (their HEAD and their index), never a stash of the user's made meanwhile (issue 49,
item 1)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.git import gitops, guard, hookstash


def _stash(repo: Path, n: int) -> None:
    (repo / "f.txt").write_text(f"change {n}\n")
    git("stash", "push", "-q", "-m", f"the user's {n}", cwd=repo)


@pytest.fixture
def repo(git_repo: Path) -> Path:
    (git_repo / "f.txt").write_text("original\n")
    (git_repo / "mine.txt").write_text("original\n")
    git("add", "f.txt", "mine.txt", cwd=git_repo)
    git("commit", "-q", "-m", "f", cwd=git_repo)
    for n in range(3):
        _stash(git_repo, n)
    return git_repo


def _worktree(repo: Path) -> Path:
    """An isolated task's worktree with a change staged for its commit."""
    tree = repo.parent / "wt"
    git("worktree", "add", "-q", "-b", "fleet/t1", str(tree), cwd=repo)
    (tree / "w.txt").write_text("the worker's\n")
    git("add", "w.txt", cwd=tree)
    return tree


def _backup(tree: Path, env: dict[str, str] | None = None) -> str:
    """What lint-staged does first: a backup of the work tree and index, stored in the stash by message."""
    made = gitops.git("stash", "create", cwd=tree, env=env).strip()
    gitops.git("stash", "store", "-m", hookstash.LINT_STAGED, made, cwd=tree)
    return made


def _users_stash_push(repo: Path) -> None:
    (repo / "mine.txt").write_text("the user's edit\n")
    git("stash", "push", "-q", "-m", "MY-OWN-STASH", "--", "mine.txt", cwd=repo)


def _messages(repo: Path) -> list[str]:
    return [message for _, message in hookstash.entries(repo)]


def test_a_hooks_leftover_is_removed_and_the_users_stash_made_meanwhile_in_the_main_tree_is_kept(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _worktree(repo)
    before = _messages(repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", tree):
        left = _backup(tree)  # the hook's, left behind
        _users_stash_push(repo)
    assert _messages(repo) == ["On main: MY-OWN-STASH", *before]
    assert (repo / "mine.txt").read_text() == "original\n"  # the edit is in the user's entry, not lost
    assert capsys.readouterr().err == (
        f"stella: stash entry {hookstash.entries(repo)[0][0][:12]} (On main: MY-OWN-STASH) came while a "
        "commit hook ran, not from it; left it\n"
        f"stella: a commit hook left stash entry {left[:12]} ({hookstash.LINT_STAGED}); removed it\n"
    )


def test_in_the_shared_tree_the_private_index_tells_the_hooks_stash_from_the_users(repo: Path) -> None:
    # stella commit's hooks run in the main tree itself, on the same HEAD as the user's stash: only the index
    # they see (the private one, HEAD plus the worker's paths) tells them apart
    private = repo.parent / "private-index"
    (repo / "w.txt").write_text("the worker's\n")
    env = {"GIT_INDEX_FILE": str(private)}
    gitops.git("read-tree", "HEAD", cwd=repo, env=env)
    gitops.git("add", "w.txt", cwd=repo, env=env)
    before = _messages(repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo, private):
        _users_stash_push(repo)
        _backup(repo, env)
    assert _messages(repo) == ["On main: MY-OWN-STASH", *before]


def test_an_entry_made_from_the_commit_the_hooks_passed_is_theirs(repo: Path) -> None:
    # `git commit -a` hands its hooks an index of its own: the commit's tree is what they saw
    tree = _worktree(repo)
    git("reset", "-q", cwd=tree)
    before = _messages(repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", tree):
        git("add", "w.txt", cwd=tree)
        _backup(tree)
        git("commit", "-q", "-m", "w", cwd=tree)
        git("reset", "-q", "--soft", "HEAD", cwd=tree)
    assert _messages(repo) == before


def test_an_entry_dropped_while_the_hooks_ran_is_put_back_on_top_but_not_another_lint_staged_backup(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "f.txt").write_text("the user's commit\n")
    theirs = _backup(repo)  # the user's own commit's lint-staged, running: it drops its backup itself
    before = hookstash.entries(repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo):
        git("stash", "drop", "-q", "stash@{2}", cwd=repo)  # the user's 1, dropped by place
        git("stash", "drop", "-q", "stash@{0}", cwd=repo)  # the other lint-staged's, by itself
    assert hookstash.entries(repo) == [before[2], before[1], before[3]]
    assert _messages(repo) == ["On main: the user's 1", "On main: the user's 2", "On main: the user's 0"]
    assert theirs not in git("stash", "list", "--format=%H", cwd=repo)
    assert capsys.readouterr().err == (
        f"stella: stash entry {before[2][0][:12]} (On main: the user's 1) was dropped while a commit hook "
        "ran; put it back on top\n"
    )


def test_a_stash_pushed_just_as_the_leftover_is_dropped_by_its_place_is_stored_again(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _worktree(repo)
    before = _messages(repo)
    real = gitops.git

    def the_user_pushes_first(*args: str, **kwargs: object) -> str:
        if args[:2] == ("stash", "drop") and not (repo / "mine.stashed").exists():
            (repo / "mine.stashed").touch()
            _users_stash_push(repo)  # the leftover's place now names the user's entry
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gitops, "git", the_user_pushes_first)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", tree):
        _backup(tree)
    assert _messages(repo) == ["On main: MY-OWN-STASH", *before]


def test_a_stash_git_refuses_to_tidy_does_not_fail_the_commit(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = repo / ".git" / "refs" / "stash.lock"  # another git holding refs/stash
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo):
        git("stash", "drop", "-q", cwd=repo)
        lock.touch()
    lock.unlink()
    said = capsys.readouterr().err
    assert said.startswith("stella: could not tidy the stash after the commit hooks (git stash store: ")
    assert said.endswith("; see git stash list\n")


def test_an_untouched_stash_is_left_alone(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = git("reflog", "show", "--format=%H %gs", "refs/stash", cwd=repo)
    with hookstash.guarded(repo / ".stella" / "hooks.lock", repo):
        pass
    assert git("reflog", "show", "--format=%H %gs", "refs/stash", cwd=repo) == before
    assert capsys.readouterr().err == ""


# A slow lint-staged-style hook: its backup stored, then it waits (the linters' work) while the user pushes a
# stash of their own in the main tree, then it drops its backup by its place, as lint-staged does.
SLOW_HOOK = """#!/bin/sh
set -e
git stash store -m "lint-staged automatic backup" "$(git stash create)"
touch "$SYNC/started"
while [ ! -e "$SYNC/pushed" ]; do sleep 0.01; done
at=$(git stash list --format='%gd %gs' | grep -m1 'lint-staged automatic backup' | cut -d' ' -f1)
git stash drop -q "$at"
git stash store -m "lint-staged automatic backup" "$(git stash create)"  # a second one, left behind
"""


def test_an_isolated_workers_commit_keeps_the_users_stash_pushed_while_its_slow_hook_runs(
    repo: Path, tmp_path: Path
) -> None:
    tree = _worktree(repo)
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(SLOW_HOOK)
    hook.chmod(0o755)
    ctx = dataclasses.replace(make_attempt(repo), workspace=tree, isolation="isolated", branch="fleet/t1")
    folder = guard.install(ctx.paths.private / "gitguard", guard.ISOLATED)
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**guard.guarded_env({**os.environ, **ctx.to_env()}, folder), "SYNC": str(sync)}
    before = _messages(repo)
    commit = subprocess.Popen(
        ["git", "commit", "-q", "-m", "w"], cwd=tree, env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not (sync / "started").exists() and commit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    _users_stash_push(repo)
    (sync / "pushed").touch()
    _, err = commit.communicate(timeout=30)
    assert commit.returncode == 0, err
    assert gitops.commit_subject(tree, "HEAD") == "w"
    assert _messages(repo) == ["On main: MY-OWN-STASH", *before]
    assert "lint-staged automatic backup); removed it" in err
    git("stash", "pop", "-q", cwd=repo)
    assert (repo / "mine.txt").read_text() == "the user's edit\n"


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


def test_a_binary_hook_is_read_as_bytes_for_the_stash_check(repo: Path) -> None:
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_bytes(b"\x7fELF\xff\xfe\x00 lint-staged \xc3\x28")
    hook.chmod(0o755)
    assert hookstash.may_use_stash(repo)
    hook.write_bytes(b"\x7fELF\xff\xfe\x00 eslint \xc3\x28")
    assert not hookstash.may_use_stash(repo)
