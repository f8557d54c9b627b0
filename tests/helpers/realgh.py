"""The real gh (installed by `python3 tools/dev.py gh`, or `agents`) against the local GitHub API server.

`real_gh()` is the binary's path: locally a test skips with the reason when it is missing, under CI=true
it fails instead. `GitHubHost` starts `stellafleet.testing.github_server` in this process, puts a `gh`
link to the real binary first on PATH and points gh and git at the server (GH_HOST, GH_ENTERPRISE_TOKEN,
SSL_CERT_FILE, GIT_SSL_CAINFO, a fresh GH_CONFIG_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stellafleet.core.clock import Clock
from stellafleet.testing.github_server import GitHubServer, snapshot
from stellafleet.testing.github_state import Fault

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(os.environ.get("STELLA_AGENTS_DIR") or ROOT / ".agents")
GH_INSTALLED = AGENTS / "gh" / "bin" / "gh"
TESTED_GH = "2.102.0"  # tools/dev.py's pin; docs/watch.md names it
REPO = "octo/widgets"
# Read once at import: the fixtures that isolate a test's environment drop STELLA_* variables.
_ON_PATH = shutil.which("gh", path=os.environ.get("STELLA_REAL_CLI_PATH", ""))


def find_gh() -> str | None:
    """The installed real gh (tools/dev.py's, else one on STELLA_REAL_CLI_PATH), or None."""
    return str(GH_INSTALLED) if GH_INSTALLED.exists() else _ON_PATH


def real_gh() -> str:
    """The real gh's path; skips (or fails under CI=true) with the reason when it is not installed."""
    found = find_gh()
    if found:
        return found
    reason = f"the real gh is not installed at {GH_INSTALLED}: run `python3 tools/dev.py gh`"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def gh_version(path: str | None = None) -> str:
    """`gh --version`'s first line, e.g. `gh version 2.102.0 (2026-09-30)`."""
    done = subprocess.run([path or real_gh(), "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0].strip()


class GitHubHost:
    """The local GitHub API server, with the real gh and git pointed at it, for one test."""

    def __init__(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        *,
        ci_seconds: float = 0.6,
        clock: Clock | None = None,
        repos: tuple[str, ...] = (REPO,),
    ) -> None:
        self.gh = real_gh()
        self.version = gh_version(self.gh)
        bin_dir = tmp_path / "gh-bin"
        bin_dir.mkdir()
        (bin_dir / "gh").symlink_to(self.gh)  # the binary itself, not a wrapper script
        self.server = GitHubServer(repos, directory=tmp_path / "github", ci_seconds=ci_seconds, clock=clock)
        self.server.start()
        self.env = {**self.server.gh_env(), "GH_CONFIG_DIR": str(tmp_path / "gh-config")}
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        for key in ("GH_TOKEN", "GITHUB_TOKEN", "GH_REPO"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def repo_flag(self) -> str:
        """What `[watch] repo` says: HOST:PORT/OWNER/NAME (gh cannot tell a port from the remotes)."""
        return f"{self.host}/{REPO}"

    def clone_url(self, repo: str = REPO) -> str:
        return self.server.clone_url(repo)

    def fault(self, status: int, match: str, *, times: int = 1, retry_after: int | None = None) -> None:
        self.server.state.add_fault(Fault(status, match, times, retry_after))

    def state(self) -> dict[str, Any]:
        return snapshot(self.server.state)

    def prs(self, repo: str = REPO) -> list[dict[str, Any]]:
        prs: list[dict[str, Any]] = self.state()["repos"][repo]["prs"]
        return prs

    def operations(self) -> list[str]:
        """Every request so far as `METHOD PATH` (REST, git) or its GraphQL operation."""
        return [
            entry["operation"] or f"{entry['method']} {entry['path'].split('?')[0]}"
            for entry in self.state()["requests"]
        ]

    def remote_refs(self, repo: str = REPO) -> dict[str, str]:
        return self.server.state.repos[repo].refs()

    def stop(self) -> None:
        self.server.stop()


def json_out(text: str) -> Any:
    return json.loads(text)
