"""The kept tree on a real repository: made and readied once, moved with one checkout, cleaned of every
tracked change and untracked, non-ignored file (ignored ones stay), readied again only when a setup input
changed, serialised between users, and never used half-moved after a kill."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.repo import git

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.git.keptree import KeptTree
from stellafleet.run import bootstrap


def _commit(root: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git("add", *files, cwd=root)
    git("commit", "-q", "-m", message, cwd=root)
    return git("rev-parse", "HEAD", cwd=root).strip()


class Readier:
    """A ready callable that counts its runs and leaves an ignored file, as an install would."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, tree: Path) -> None:
        self.runs += 1
        (tree / "node_modules").mkdir(exist_ok=True)
        (tree / "node_modules" / "dep.js").write_text(f"install {self.runs}\n")


@pytest.fixture
def repo(git_repo: Path) -> Path:
    _commit(git_repo, {".gitignore": "node_modules/\n", "lock.txt": "v1\n", "src/a.txt": "a1\n"}, "base")
    return git_repo


def test_a_move_leaves_exactly_the_commit_and_the_ignored_files(repo: Path) -> None:
    first = git("rev-parse", "HEAD", cwd=repo).strip()
    second = _commit(repo, {"src/a.txt": "a2\n", "src/b.txt": "b\n"}, "two")
    ready = Readier()
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=ready)
    with kept.held():
        moved = kept.move_to(first)
        tree = kept.path
        assert (moved.made, moved.readied, ready.runs) == (True, True, 1)
        assert git("rev-parse", "HEAD", cwd=tree).strip() == first
        # a user's leftovers: a tracked edit, a staged one, a new file, a new folder, an ignored build
        (tree / "src" / "a.txt").write_text("edited\n")
        (tree / "lock.txt").write_text("staged\n")
        git("add", "lock.txt", cwd=tree)
        (tree / "new.txt").write_text("untracked\n")
        (tree / "gen").mkdir()
        (tree / "gen" / "x.txt").write_text("untracked too\n")
    with kept.held():
        moved = kept.move_to(second)
    assert (moved.made, moved.readied, moved.redone, ready.runs) == (False, False, False, 1)
    assert git("rev-parse", "HEAD", cwd=tree).strip() == second
    assert git("status", "--porcelain", "--untracked-files=all", cwd=tree) == ""
    assert (tree / "src" / "a.txt").read_text() == "a2\n" and (tree / "src" / "b.txt").exists()
    assert (tree / "node_modules" / "dep.js").read_text() == "install 1\n"  # ignored: it stays
    assert not (tree / ".stella" / "kept.moving").exists()


def test_setup_runs_again_only_when_a_setup_input_changed(repo: Path) -> None:
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    code_only = _commit(repo, {"src/a.txt": "a2\n"}, "code")
    new_lock = _commit(repo, {"lock.txt": "v2\n"}, "lockfile")
    ready = Readier()
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=ready, setup_inputs=["lock.txt"])
    with kept.held():
        runs = [kept.move_to(commit).readied for commit in (base, code_only, new_lock, new_lock, base)]
    assert runs == [True, False, True, False, True]
    assert ready.runs == 3


def test_a_failed_readying_is_redone_by_the_next_user(repo: Path) -> None:
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    calls: list[Path] = []

    def failing(tree: Path) -> None:
        calls.append(tree)
        if len(calls) == 1:
            raise bootstrap.SetupFailed("setup failed: exit 1")

    kept = KeptTree(repo, repo / ".stella" / "kept", ready=failing)
    with kept.held(), pytest.raises(bootstrap.SetupFailed):
        kept.move_to(head)
    with kept.held():
        assert kept.move_to(head).readied
    assert len(calls) == 2


def test_it_is_readied_by_the_one_readying_function(repo: Path) -> None:
    head = _commit(repo, {".worktreeinclude": ".env\n", ".gitignore": "node_modules/\n.env\n"}, "include")
    (repo / ".env").write_text("TOKEN=1\n")
    config = WorktreeConfig(setup="mkdir -p node_modules && echo set up >> node_modules/log")
    log = repo / ".stella" / "private" / "kept.log"
    ready = functools.partial(bootstrap.ready, config=config, env=dict(os.environ), log_path=log, root=repo)
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=ready)
    with kept.held():
        kept.move_to(head)
    assert (kept.path / ".env").read_text() == "TOKEN=1\n"
    assert (kept.path / "node_modules" / "log").read_text() == "set up\n"


def test_a_move_killed_halfway_is_redone_in_full(repo: Path) -> None:
    first = git("rev-parse", "HEAD", cwd=repo).strip()
    second = _commit(repo, {"src/a.txt": "a2\n"}, "two")
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=Readier())
    with kept.held():
        kept.move_to(first)
    # what a SIGKILL inside `git checkout` leaves: the marker, its index.lock, a file half written
    (repo / ".stella" / "kept.moving").write_text(second)
    index_lock = Path(git("rev-parse", "--git-path", "index.lock", cwd=kept.path).strip())
    (kept.path / index_lock).write_text("")
    (kept.path / "src" / "a.txt").write_text("a")
    with kept.held():
        moved = kept.move_to(second)
    assert moved.redone
    assert git("status", "--porcelain", "--untracked-files=all", cwd=kept.path) == ""
    assert (kept.path / "src" / "a.txt").read_text() == "a2\n"


_KILLED_IN_READY = """
import sys, time
from pathlib import Path
from stellafleet.git.keptree import KeptTree
def ready(tree):
    Path(sys.argv[3]).write_text("ready")
    time.sleep(60)
kept = KeptTree(Path(sys.argv[1]), Path(sys.argv[1]) / ".stella" / "kept", ready=ready)
with kept.held():
    kept.move_to(sys.argv[2])
"""


def test_a_user_killed_in_its_readying_leaves_it_to_the_next(repo: Path, tmp_path: Path) -> None:
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    started = tmp_path / "started"
    argv = [sys.executable, "-c", _KILLED_IN_READY, str(repo), head, str(started)]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ready = Readier()
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=ready)
    with kept.held():  # its lock went with it
        moved = kept.move_to(head)
    assert (moved.made, moved.readied, ready.runs) == (False, True, 1)


def test_users_take_turns(repo: Path) -> None:
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    kept = KeptTree(repo, repo / ".stella" / "kept", ready=Readier())
    trying = threading.Event()
    order: list[str] = []

    def second() -> None:
        other = KeptTree(repo, kept.path, ready=Readier())  # another user: its own descriptor
        trying.set()
        with other.held():
            order.append("second")

    with kept.held():
        kept.move_to(head)
        thread = threading.Thread(target=second)
        thread.start()
        trying.wait(10)
        thread.join(0.1)  # it would have run by now, were the lock not held
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]
