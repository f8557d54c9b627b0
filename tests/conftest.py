"""Shared fixtures: real git repositories in tmp_path with HOME isolated, and `stella` as a real process."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers.agents import FakeAgents
from helpers.progress import register
from helpers.repo import GIT_EMAIL, GIT_NAME, StellaRunner, git, run_stella, stella_here

if TYPE_CHECKING:
    from helpers.realgh import GitHubHost

    from stellafleet.testing.github_server import GitHubServer


def _cache_bytecode_outside_the_sources() -> None:
    """With PYTHONDONTWRITEBYTECODE set (some machines do), every Python process the tests start (stella,
    its workers, the fake CLIs, the real aider) compiles each module it imports from source again: aider's
    2,700 modules cost each of its runs 6 s of a 2-core machine. Their bytecode goes to one cache outside
    the source trees instead (PYTHONPYCACHEPREFIX), which keeps what the setting asks for: no __pycache__
    in the checkout or in .agents. Set here, at import, so the xdist workers inherit it too."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        cache = Path(tempfile.gettempdir()) / f"stellafleet-test-pycache-{os.getuid()}"
        os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


_cache_bytecode_outside_the_sources()


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
    """HOME (and XDG config and state) in tmp_path, no system git config, no STELLA_* variables from
    outside."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))  # the host's leases: this test's
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
def stella_main(isolated_home: Path) -> StellaRunner:
    """`stella ARGS...` through cli.main in this process (helpers/repo.py: stella_here), answering as the
    `stella` fixture does: for the tests of parsing and output, where the process is not the point."""
    return stella_here


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


@pytest.fixture(scope="session")
def github_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitHubServer | None]:
    """The session's one local GitHub API server, started when a test first needs it (helpers/realgh.py)."""
    from helpers.realgh import shared_server

    yield from shared_server(tmp_path_factory.mktemp("github-server"))


@pytest.fixture
def github_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, github_server: GitHubServer | None
) -> Iterator[Callable[..., GitHubHost]]:
    """github_host(ci_seconds=, clock=, external_ok=): the real gh and git pointed at the session's
    server, its state fresh for this test (GitHubHost's options)."""
    from helpers.realgh import GitHubHost

    made: list[GitHubHost] = []

    def make(**options: Any) -> GitHubHost:
        made.append(GitHubHost(tmp_path, monkeypatch, shared=github_server, **options))
        print(f"real gh: {made[-1].version}")  # shown with -s / -rA: which gh these tests ran
        return made[-1]

    yield make
    for host in made:
        host.stop()


@pytest.fixture
def host(github_host: Callable[..., GitHubHost], isolated_home: Path) -> GitHubHost:
    """The real gh against the local GitHub API server, CI taking 0.6 s, HOME isolated."""
    return github_host(ci_seconds=0.6)
