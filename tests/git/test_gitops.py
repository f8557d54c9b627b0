"""The small git helpers, on real repositories."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stellafleet.core.errors import GitError, StellaError
from stellafleet.git import gitops, worktrees


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "config", "user.name", "t", cwd=root)
    sh("git", "config", "user.email", "t@example.invalid", cwd=root)
    (root / "README").write_text("hello\n")
    sh("git", "add", "README", cwd=root)
    sh("git", "commit", "-qm", "first", cwd=root)
    return root


def test_repository_facts(repo: Path, tmp_path: Path) -> None:
    (repo / "sub").mkdir()
    assert gitops.repo_root(repo / "sub") == repo.resolve()
    assert gitops.has_commits(repo)
    assert gitops.current_branch(repo) == "main"
    head = gitops.head_commit(repo)
    assert gitops.resolve_commit(repo, "main") == head
    with pytest.raises(StellaError, match="does not name a commit"):
        gitops.resolve_commit(repo, "no-such-ref")
    outside = tmp_path / "plain"
    outside.mkdir()
    with pytest.raises(StellaError, match="not inside a git repository"):
        gitops.repo_root(outside)


def test_empty_repository_has_no_commits(tmp_path: Path) -> None:
    sh("git", "init", "-q", cwd=tmp_path)
    assert not gitops.has_commits(tmp_path)


def test_exclude_is_written_once_and_never_to_a_tracked_file(repo: Path) -> None:
    assert gitops.ensure_excluded(repo, [".stella/private/", ".stella/worktrees/"]) == [
        ".stella/private/",
        ".stella/worktrees/",
    ]
    assert gitops.ensure_excluded(repo, [".stella/private/", ".stella/worktrees/"]) == []
    (repo / ".stella/private").mkdir(parents=True)
    (repo / ".stella/private/fleet.db").write_text("x")
    assert gitops.status_porcelain(repo) == []
    assert not (repo / ".gitignore").exists()


def test_isolated_names_are_stable_and_distinct() -> None:
    name = worktrees.isolated_name("r-1", "docs")
    assert name.startswith("docs-") and len(name.split("-")[-1]) == 16
    assert worktrees.isolated_name("r-1", "docs") == name
    assert worktrees.isolated_name("r-2", "docs") != name
    assert worktrees.slugify("Fix: the /weird/ name!") == "fix-the-weird-name"


def test_worktree_lifecycle_and_commits_between(repo: Path) -> None:
    base = gitops.head_commit(repo)
    path = repo / ".stella/worktrees/docs-x"
    worktrees.worktree_add(repo, path, "fleet/docs-x", base)
    (path / "doc.md").write_text("doc\n")
    sh("git", "add", "doc.md", cwd=path)
    sh("git", "commit", "-qm", "write the doc", cwd=path)
    commits = gitops.commits_between(repo, base, "fleet/docs-x")
    assert [c.message for c in commits] == ["write the doc"]
    assert any(t.branch == "fleet/docs-x" and t.path == path for t in worktrees.worktree_list(repo))
    assert gitops.git("branch", "--list", "fleet/*", "--format=%(refname:short)", cwd=repo).split() == [
        "fleet/docs-x"
    ]
    assert not gitops.is_ancestor(repo, commits[0].sha, "main")
    worktrees.worktree_remove(repo, path)
    gitops.branch_delete(repo, "fleet/docs-x")
    assert gitops.git("branch", "--list", "fleet/*", "--format=%(refname:short)", cwd=repo).split() == []


def test_a_forced_removal_takes_whatever_a_killed_step_left_and_never_the_main_tree(repo: Path) -> None:
    base = gitops.head_commit(repo)
    dirty, broken, gone = (repo / f".stella/worktrees/{name}" for name in ("dirty", "broken", "gone"))
    for n, path in enumerate((dirty, broken, gone)):
        worktrees.worktree_add(repo, path, f"fleet/t{n}", base)
    (dirty / "notes.txt").write_text("uncommitted\n")
    with pytest.raises(GitError):
        worktrees.worktree_remove(repo, dirty)  # unforced: uncommitted work is refused
    (broken / ".git").unlink()  # a worktree half removed: git no longer takes it for one
    (broken / "left.txt").write_text("left\n")
    shutil.rmtree(gone)
    for path in (dirty, broken, gone):
        worktrees.worktree_remove(repo, path, force=True)
        assert not path.exists()
    assert [tree.path for tree in worktrees.worktree_list(repo)] == [repo]
    with pytest.raises(GitError, match="main working tree"):
        worktrees.worktree_remove(repo, repo, force=True)
    assert (repo / ".git").is_dir()


def test_git_failure_carries_gits_message(repo: Path) -> None:
    with pytest.raises(GitError, match="git branch"):
        gitops.git("branch", "-d", "no-such-branch", cwd=repo)


# --- every git call sees the environment of the moment it runs, not a copy taken at import ---


def _env_config(monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    """Git configuration given through the environment only, after stellafleet was imported."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", key)
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", value)


def test_push_and_ls_remote_run_with_the_environment_of_now(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin, other = tmp_path / "origin.git", tmp_path / "other.git"
    sh("git", "init", "-q", "--bare", "-b", "main", str(origin), cwd=tmp_path)
    sh("git", "init", "-q", "--bare", "-b", "trunk", str(other), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(origin), cwd=repo)
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(
        '#!/bin/sh\nif [ -n "$STELLA_TEST_MARK" ]; then echo "saw $STELLA_TEST_MARK"; exit 1; fi\n'
    )
    hook.chmod(0o755)

    monkeypatch.setenv("STELLA_TEST_MARK", "now")
    with pytest.raises(GitError, match=r"was rejected: .* remote says: saw now"):
        gitops.push(repo, "origin", "main")
    monkeypatch.delenv("STELLA_TEST_MARK")
    gitops.push(repo, "origin", "main")
    assert gitops.remote_branch_exists(repo, "origin", "main")

    sh("git", "push", "-q", str(other), "main:trunk", cwd=repo)
    assert gitops.default_branch(repo, "origin") == "main"
    _env_config(monkeypatch, f"url.{other}.insteadOf", str(origin))  # origin now means the other repository
    assert gitops.default_branch(repo, "origin") == "trunk"


def test_grep_and_git_ok_run_with_the_environment_of_now(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "notes.txt").write_text("the needle\n")  # untracked, not ignored
    assert gitops.grep(repo, "needle") == "notes.txt:1:the needle\n"
    ignore = tmp_path / "ignore"
    ignore.write_text("notes.txt\n")
    _env_config(monkeypatch, "core.excludesFile", str(ignore))
    assert gitops.grep(repo, "needle") == ""
    assert gitops.git_ok("rev-parse", "--verify", "-q", "HEAD", cwd=repo)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-such-git-dir"))
    assert not gitops.git_ok("rev-parse", "--verify", "-q", "HEAD", cwd=repo)
