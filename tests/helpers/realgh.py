"""The real gh (installed by `python3 tools/dev.py gh`, or `agents`) against the local GitHub API server.

`real_gh()` is the binary's path: locally a test skips with the reason when it is missing, under CI=true
it fails instead. `GitHubHost` gives a test `stellafleet.testing.github_server` in this process, puts a
`gh` link to the real binary first on PATH and points gh and git at the server (GH_HOST,
GH_ENTERPRISE_TOKEN, SSL_CERT_FILE, GIT_SSL_CAINFO, a fresh GH_CONFIG_DIR). The tests share one server
per session (`shared_server`, the `github_server` fixture): each test gets it with a fresh state (its own
bare repositories in its tmp_path, no pull requests, runs, faults or requests), so starting one (its
certificate authority) is paid once.

With STELLA_TEST_GH_HOST, STELLA_TEST_GH_REPO and STELLA_TEST_GH_TOKEN set (docs/watch.md, "On your own
GitHub Enterprise test host"), a test that allows it (`external_ok=True`) runs against that host and
repository instead, and the others skip: `local` says which, and what the local server alone can say
(`operations()`, its state) is only asked when it is true.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from helpers.needs import missing
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
EXTERNAL_HOST = os.environ.get("STELLA_TEST_GH_HOST")
EXTERNAL_REPO = os.environ.get("STELLA_TEST_GH_REPO") or ""
EXTERNAL_TOKEN = os.environ.get("STELLA_TEST_GH_TOKEN") or ""
EXTERNAL_CA = os.environ.get("STELLA_TEST_GH_CA_FILE")


def find_gh() -> str | None:
    """The installed real gh (tools/dev.py's, else one on STELLA_REAL_CLI_PATH), or None."""
    return str(GH_INSTALLED) if GH_INSTALLED.exists() else _ON_PATH


def real_gh() -> str:
    """The real gh's path; skips (or fails under CI=true) with the reason when it is not installed."""
    found = find_gh()
    if found:
        return found
    reason = f"the real gh is not installed at {GH_INSTALLED}: run `python3 tools/dev.py gh`"
    missing(reason)


def gh_version(path: str | None = None) -> str:
    """`gh --version`'s first line, e.g. `gh version 2.102.0 (2026-09-30)`."""
    return _version_of(path or real_gh())


@cache  # one binary's version does not change during a session
def _version_of(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0].strip()


def shared_server(directory: Path) -> Iterator[GitHubServer | None]:
    """Body of the session's `github_server` fixture: one running server (None with an external host)."""
    if EXTERNAL_HOST:
        yield None
        return
    server = GitHubServer((), directory=directory).start()
    try:
        yield server
    finally:
        server.stop()


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
        external_ok: bool = False,
        shared: GitHubServer | None = None,
    ) -> None:
        if EXTERNAL_HOST and not external_ok:
            pytest.skip("STELLA_TEST_GH_HOST is set: this test needs the local GitHub API server's controls")
        self.gh = real_gh()
        self.version = gh_version(self.gh)
        bin_dir = tmp_path / "gh-bin"
        bin_dir.mkdir()
        (bin_dir / "gh").symlink_to(self.gh)  # the binary itself, not a wrapper script
        self.local = not EXTERNAL_HOST
        self.server: GitHubServer | None = None
        self._own_server = shared is None
        if EXTERNAL_HOST:
            self._host, self.repo, self.token = EXTERNAL_HOST, EXTERNAL_REPO, EXTERNAL_TOKEN
            self.env = {"GH_HOST": EXTERNAL_HOST, "GH_ENTERPRISE_TOKEN": EXTERNAL_TOKEN}
            if EXTERNAL_CA:
                self.env.update({"SSL_CERT_FILE": EXTERNAL_CA, "GIT_SSL_CAINFO": EXTERNAL_CA})
        else:
            if shared is not None:  # the session's server, its state fresh for this test
                self.server = shared
                shared.reset(repos, directory=tmp_path / "github", ci_seconds=ci_seconds, clock=clock)
            else:
                self.server = GitHubServer(
                    repos, directory=tmp_path / "github", ci_seconds=ci_seconds, clock=clock
                ).start()
            self._host, self.repo, self.token = self.server.host, REPO, self.server.token
            self.env = self.server.gh_env()
        self.env["GH_CONFIG_DIR"] = str(tmp_path / "gh-config")
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        for key in ("GH_TOKEN", "GITHUB_TOKEN", "GH_REPO"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    @property
    def host(self) -> str:
        return self._host

    @property
    def local_server(self) -> GitHubServer:
        """The local GitHub API server (host.local only: tests that use it are not external_ok)."""
        assert self.server is not None
        return self.server

    @property
    def repo_flag(self) -> str:
        """What `[watch] repo` says: HOST[:PORT]/OWNER/NAME (gh cannot tell a port from the remotes)."""
        return f"{self.host}/{self.repo}"

    def watch_config(self) -> str:
        """The `[watch]` section for a test: a quick poll here, a patient one on a real host."""
        if self.local:
            return f'[watch]\npoll_interval = 0.1\nrepo = "{self.repo_flag}"\n'
        return f'[watch]\npoll_interval = 10\ntotal_timeout = 1800\nrepo = "{self.repo_flag}"\n'

    @property
    def stella_timeout(self) -> float:
        """How long a `stella fleet --watch` may take: a real host's runners take minutes."""
        return 120.0 if self.local else 2400.0

    def clone_url(self, repo: str | None = None) -> str:
        return f"https://x-access-token:{self.token}@{self.host}/{repo or self.repo}.git"

    def seed(self, root: Path) -> None:
        """root's main becomes the repository's: pushed to the local server, or taken from the real host."""
        if self.local:
            subprocess.run(["git", "push", "-q", "origin", "main"], cwd=root, check=True)
        else:
            subprocess.run(["git", "fetch", "-q", "origin", self.default_branch], cwd=root, check=True)
            subprocess.run(["git", "reset", "-q", "--hard", "FETCH_HEAD"], cwd=root, check=True)

    @property
    def default_branch(self) -> str:
        if self.local:
            return "main"
        return str(self.api(f"repos/{self.repo}")["default_branch"])

    def api(self, path: str) -> Any:
        done = subprocess.run(
            [self.gh, "api", path], capture_output=True, text=True, check=True, env=os.environ
        )
        return json.loads(done.stdout)

    def fault(self, status: int, match: str, *, times: int = 1, retry_after: int | None = None) -> None:
        assert self.server is not None
        self.server.state.add_fault(Fault(status, match, times, retry_after))

    def state(self) -> dict[str, Any]:
        assert self.server is not None, "the local server's state: only with host.local"
        return snapshot(self.server.state)

    def prs(self, repo: str = REPO) -> list[dict[str, Any]]:
        """The repository's pull requests: head, base, number, title, body, state, merge_commit."""
        if self.local:
            prs: list[dict[str, Any]] = self.state()["repos"][repo]["prs"]
            return prs
        found = self.api(f"repos/{self.repo}/pulls?state=all&per_page=100")
        return [
            {
                "number": pr["number"],
                "head": pr["head"]["ref"],
                "base": pr["base"]["ref"],
                "title": pr["title"],
                "body": pr["body"] or "",
                "state": "MERGED" if pr.get("merged_at") else str(pr["state"]).upper(),
                "merge_commit": pr.get("merge_commit_sha") if pr.get("merged_at") else None,
            }
            for pr in found
        ]

    def operations(self) -> list[str]:
        """Every request so far as `METHOD PATH` (REST, git) or its GraphQL operation (host.local only)."""
        return [
            entry["operation"] or f"{entry['method']} {entry['path'].split('?')[0]}"
            for entry in self.state()["requests"]
        ]

    def remote_refs(self, repo: str = REPO) -> dict[str, str]:
        if self.server is not None:
            return self.server.state.repos[repo].refs()
        out = subprocess.run(
            ["git", "ls-remote", "--heads", self.clone_url()], capture_output=True, text=True, check=True
        ).stdout
        return {ref: sha for sha, ref in (line.split("\t") for line in out.splitlines() if "\t" in line)}

    def stop(self) -> None:
        if self.server is not None and self._own_server:
            self.server.stop()


def json_out(text: str) -> Any:
    return json.loads(text)
