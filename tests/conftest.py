"""Shared fixtures: real git repositories in tmp_path with HOME isolated, and `stella` as a real process."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.agents import FakeAgents
from helpers.progress import register
from helpers.repo import GIT_EMAIL, GIT_NAME, StellaRunner, git, run_stella


def _gh_line() -> str:
    from helpers.realgh import GH_INSTALLED, find_gh, gh_version

    found = find_gh()
    if found is None:
        return f"gh: not installed at {GH_INSTALLED} (the real-gh CI tests skip; CI=true fails them)"
    return f"gh: {gh_version(found)} at {found}"


def pytest_report_header(config: pytest.Config) -> str:
    """The real gh the CI tests run (tests/helpers/realgh.py), at the top of a verbose run."""
    return _gh_line()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """... and at the end of every run, quiet ones too: which gh the CI tests ran against."""
    terminalreporter.write_line(_gh_line())


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # STELLA_TEST_PROGRESS=1: a line of progress every 20 s (helpers/progress.py)


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (and XDG config) in tmp_path, no system git config, no STELLA_* variables from outside."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    for key in list(os.environ):
        if key.startswith("STELLA_") or key.startswith("GIT_AUTHOR_") or key.startswith("GIT_COMMITTER_"):
            monkeypatch.delenv(key)
    return home


@pytest.fixture
def git_repo(tmp_path: Path, isolated_home: Path) -> Path:
    """A real repository at tmp_path/repo on branch main with one commit (README.md)."""
    root = tmp_path / "repo"
    root.mkdir()
    git("init", "-q", "-b", "main", cwd=root)
    git("config", "user.name", GIT_NAME, cwd=root)
    git("config", "user.email", GIT_EMAIL, cwd=root)
    (root / "README.md").write_text("# test repository\n")
    git("add", "README.md", cwd=root)
    git("commit", "-q", "-m", "initial commit", cwd=root)
    return root


@pytest.fixture
def stella(isolated_home: Path) -> StellaRunner:
    """Run `stella ARGS...` as a real process with HOME isolated, returning the completed process."""
    return run_stella


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts in the background; any still running at the end are killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, git_repo: Path) -> FakeAgents:
    """The fake agent CLIs (claude, codex, aider) first on PATH, with their script and log, in git_repo."""
    return FakeAgents(tmp_path, monkeypatch)
