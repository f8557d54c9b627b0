"""`.worktreeinclude` on a real repository: which files git says to copy, and how they are copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import StellaError
from stellafleet.git import include
from stellafleet.run import bootstrap


def _repo_with_includes(root: Path, outside: Path) -> None:
    (root / ".gitignore").write_text(".env\nconfig/local/\nnode_modules/\n*.secret\nlink.env\n")
    (root / ".worktreeinclude").write_text(
        ".env\nconfig/local/\nREADME.md\nnotes.txt\n../outside.env\nlink.env\n"
    )
    git("add", ".gitignore", ".worktreeinclude", cwd=root)
    git("commit", "-q", "-m", "ignores", cwd=root)
    (root / ".env").write_text("TOKEN=1\n")
    (root / "config" / "local").mkdir(parents=True)
    (root / "config" / "local" / "db.toml").write_text("port = 5432\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "big.js").write_text("ignored but not included\n")
    (root / "a.secret").write_text("ignored, not included\n")
    (root / "notes.txt").write_text("included but not ignored: the user's untracked work, not copied\n")
    outside.write_text("outside the repository\n")
    os.symlink(".env", root / "link.env")
    (root / ".stella" / "private").mkdir(parents=True)


def test_only_ignored_untracked_files_that_match_are_listed(git_repo: Path, tmp_path: Path) -> None:
    _repo_with_includes(git_repo, tmp_path / "outside.env")
    assert include.included_files(git_repo) == [".env", "config/local/db.toml", "link.env"]
    # README.md matches a pattern but is tracked; notes.txt is not ignored; ../outside.env is outside


def test_copies_land_at_the_same_path_with_symlinks_kept_and_the_checkout_never_overwritten(
    git_repo: Path, tmp_path: Path
) -> None:
    _repo_with_includes(git_repo, tmp_path / "outside.env")
    os.chmod(git_repo / ".env", 0o600)
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", "fleet/x", str(tree), "HEAD", cwd=git_repo)
    (tree / ".env").write_text("already here\n")  # never overwritten

    copied = include.copy_into(git_repo, tree, [*include.included_files(git_repo)])

    assert copied.files == 2
    assert (tree / ".env").read_text() == "already here\n"
    assert (tree / "config" / "local" / "db.toml").read_text() == "port = 5432\n"
    assert os.readlink(tree / "link.env") == ".env"
    assert not (tree / "notes.txt").exists() and not (tree / "node_modules").exists()
    assert git("status", "--porcelain", cwd=tree) == ""  # ignored copies: the worktree is still clean


def test_a_file_over_the_limit_is_refused_by_name(git_repo: Path, tmp_path: Path) -> None:
    _repo_with_includes(git_repo, tmp_path / "outside.env")
    (git_repo / "config" / "local" / "dump.sql").write_bytes(b"x" * 3_000_000)
    paths = include.included_files(git_repo)
    with pytest.raises(StellaError) as raised:
        include.check_sizes(git_repo, paths, 2_000_000)
    assert str(raised.value) == (
        ".worktreeinclude: config/local/dump.sql (3.0 MB) over [worktree] include_max_mb = 2: "
        "raise include_max_mb, or leave the file out of .worktreeinclude"
    )
    include.check_sizes(git_repo, paths, 4_000_000)
    (git_repo / "config" / "local" / "dump.sql").write_bytes(b"x" * 1_000_001)
    with pytest.raises(
        StellaError, match=r"dump\.sql \(1,000,001 bytes\) over \[worktree\] include_max_mb = 1:"
    ):
        include.check_sizes(git_repo, paths, 1_000_000)
    (git_repo / "config" / "local" / "dump.sql").write_bytes(b"x" * 3_000_000)
    with pytest.raises(StellaError) as just_over:
        include.check_sizes(git_repo, paths, 2_999_999)
    assert str(just_over.value).startswith(
        ".worktreeinclude: config/local/dump.sql (3,000,000 bytes) over [worktree] include_max_mb = 2.999999:"
    ), just_over.value


def test_no_include_file_copies_nothing(git_repo: Path) -> None:
    (git_repo / ".env").write_text("x")
    assert include.included_files(git_repo) == []


def test_packed_files_unpack_as_copies_do(git_repo: Path, tmp_path: Path) -> None:
    """What travels to a Ray node: the same files, modes and symlinks, and the checkout still wins."""
    _repo_with_includes(git_repo, tmp_path / "outside.env")
    os.chmod(git_repo / "config" / "local" / "db.toml", 0o640)
    tree = tmp_path / "node-checkout"
    git("worktree", "add", "-q", "-b", "fleet/y", str(tree), "HEAD", cwd=git_repo)
    (tree / ".env").write_text("already here\n")

    packed = include.pack(git_repo, include.included_files(git_repo))
    unpacked = include.unpack(packed, tree)

    assert [file.path for file in packed] == [".env", "config/local/db.toml", "link.env"]
    assert (unpacked.files, unpacked.bytes) == (2, len("port = 5432\n"))
    assert (tree / ".env").read_text() == "already here\n"
    assert (tree / "config" / "local" / "db.toml").read_text() == "port = 5432\n"
    assert (tree / "config" / "local" / "db.toml").stat().st_mode & 0o777 == 0o640
    assert os.readlink(tree / "link.env") == ".env"
    assert git("status", "--porcelain", cwd=tree) == ""


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o640])
def test_a_copied_file_keeps_its_mode(git_repo: Path, tmp_path: Path, mode: int) -> None:
    """An included script keeps its x bit (and a private file stays private), copied or unpacked."""
    (git_repo / ".gitignore").write_text("tool.sh\n")
    (git_repo / ".worktreeinclude").write_text("tool.sh\n")
    (git_repo / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(git_repo / "tool.sh", mode)
    paths = include.included_files(git_repo)
    assert paths == ["tool.sh"]
    copied, unpacked = tmp_path / "copied", tmp_path / "unpacked"
    copied.mkdir(), unpacked.mkdir()
    include.copy_into(git_repo, copied, paths)
    include.unpack(include.pack(git_repo, paths), unpacked)
    for tree in (copied, unpacked):
        assert os.stat(tree / "tool.sh").st_mode & 0o777 == mode


def test_nothing_under_stella_is_ever_copied(git_repo: Path) -> None:
    """Even a .worktreeinclude that names .stella/ (or everything) never copies stella's own state: the
    ledger, the journal, other tasks' worktrees."""
    (git_repo / ".gitignore").write_text(".stella/\n*.env\n")
    (git_repo / ".worktreeinclude").write_text("*\n.stella/\n")
    (git_repo / ".stella" / "private").mkdir(parents=True)
    (git_repo / ".stella" / "private" / "fleet.db").write_text("ledger\n")
    (git_repo / ".stella" / "worktrees" / "t-1").mkdir(parents=True)
    (git_repo / ".stella" / "worktrees" / "t-1" / "work.py").write_text("another task's\n")
    (git_repo / ".stella" / "journal").mkdir()
    (git_repo / ".stella" / "journal" / "merge.json").write_text("{}\n")
    (git_repo / "local.env").write_text("A=1\n")
    assert include.included_files(git_repo) == ["local.env"]


def _symlinked_folder_in_the_task_base(root: Path, outside: Path) -> Path:
    """The user's ignored conf/local.env, and a task worktree whose commit has conf -> outside."""
    (root / ".gitignore").write_text("local.env\n")
    (root / ".worktreeinclude").write_text("conf/local.env\n")
    git("add", ".gitignore", ".worktreeinclude", cwd=root)
    git("commit", "-q", "-m", "ignores", cwd=root)
    tree = root.parent / "task"
    git("worktree", "add", "-q", "-b", "fleet/z", str(tree), "HEAD", cwd=root)
    outside.mkdir()
    os.symlink(outside, tree / "conf")
    git("add", "conf", cwd=tree)
    git("commit", "-q", "-m", "conf is a symlink here", cwd=tree)
    (root / "conf").mkdir()
    (root / "conf" / "local.env").write_text("SECRET=1\n")
    return tree


def test_a_symlinked_folder_in_the_worktree_is_refused_by_name_and_nothing_lands_outside(
    git_repo: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "somewhere"
    tree = _symlinked_folder_in_the_task_base(git_repo, outside)
    paths = include.included_files(git_repo)
    assert paths == ["conf/local.env"]

    with pytest.raises(StellaError) as copied:
        include.copy_into(git_repo, tree, paths)
    with pytest.raises(StellaError) as unpacked:  # on a Ray node too
        include.unpack(include.pack(git_repo, paths), tree)

    for raised in (copied, unpacked):
        assert str(raised.value).startswith(
            ".worktreeinclude: conf/local.env not copied: conf in the worktree is a symlink or a file"
        ), raised.value
    with pytest.raises(bootstrap.SetupFailed):  # the attempt fails with that reason, no worker starts
        bootstrap.ready(tree, WorktreeConfig(), {}, tmp_path / "task.log", root=git_repo)
    assert list(outside.iterdir()) == []
