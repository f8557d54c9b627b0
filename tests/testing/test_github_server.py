"""The local GitHub API server as a program: `python -m stellafleet.testing.github_server` prints where it
is, serves a repository over git's smart HTTP with the token as the password, refuses a wrong token,
answers with GitHub's rate-limit and server-error shapes on demand, and gives each pushed head a CI run."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.repo import git


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet.testing.github_server", "--repo", "octo/widgets",
         "--repo", "octo/gadgets", "--ci-seconds", "3", "--dir", str(tmp_path / "srv")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    yield {**json.loads(line), "proc": proc, "line": line}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def request(
    server: dict[str, Any], path: str, *, token: str | None = None, data: Any = None
) -> tuple[int, Any, Any]:
    context = ssl.create_default_context(cafile=server["ca_file"])
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(f"https://{server['host']}{path}", data=body)
    req.add_header("Authorization", f"token {token or server['token']}")
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as reply:
            return reply.status, reply.headers, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")


def test_it_prints_one_json_line_saying_where_it_is(server: dict[str, Any]) -> None:
    assert set(json.loads(server["line"])) == {"host", "ca_file", "token"}
    host, port = server["host"].split(":")
    assert host == "localhost" and int(port) > 0
    assert Path(server["ca_file"]).read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_a_wrong_token_is_refused(server: dict[str, Any], tmp_path: Path) -> None:
    status, _, body = request(server, "/api/v3/repos/octo/widgets", token="ghp_wrong")
    assert (status, body["message"]) == (401, "Bad credentials")
    status, _, body = request(server, "/api/v3/repos/octo/widgets")
    assert status == 200 and body["full_name"] == "octo/widgets"
    env = {**os.environ, "GIT_SSL_CAINFO": server["ca_file"], "GIT_TERMINAL_PROMPT": "0"}
    bad = subprocess.run(
        ["git", "ls-remote", f"https://x:ghp_wrong@{server['host']}/octo/widgets.git"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "Authentication failed" in bad.stderr


def test_a_push_is_real_and_starts_a_ci_run_that_fails_on_ci_result(
    server: dict[str, Any], git_repo: Path
) -> None:
    url = f"https://x-access-token:{server['token']}@{server['host']}/octo/gadgets.git"
    git("remote", "add", "origin", url, cwd=git_repo)
    env = {"GIT_SSL_CAINFO": server["ca_file"]}
    subprocess.run(
        ["git", "push", "-q", "origin", "main"], cwd=git_repo, env={**os.environ, **env}, check=True
    )
    (git_repo / ".ci-result").write_text("failure\n")
    git("add", ".ci-result", cwd=git_repo)
    git("commit", "-qm", "red", cwd=git_repo)
    subprocess.run(
        ["git", "push", "-q", "origin", "main"], cwd=git_repo, env={**os.environ, **env}, check=True
    )
    red = git("rev-parse", "HEAD", cwd=git_repo).strip()
    listed = subprocess.run(
        ["git", "ls-remote", "origin", "main"], cwd=git_repo, env={**os.environ, **env},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert listed.split()[0] == red
    status, _, first = request(server, f"/api/v3/repos/octo/gadgets/actions/runs?head_sha={red}")
    [run] = first["workflow_runs"]
    assert status == 200 and run["status"] in ("queued", "in_progress") and run["conclusion"] is None
    seen, later = [run["status"]], run
    deadline = time.monotonic() + 60
    while seen[-1] != "completed" and time.monotonic() < deadline:  # the server's own clock: 3 s of CI
        time.sleep(0.1)
        _, _, later = request(server, f"/api/v3/repos/octo/gadgets/actions/runs/{run['id']}")
        seen.append(later["status"])
    assert later["conclusion"] == "failure" and seen[-1] == "completed"
    assert "in_progress" in seen  # queued -> in_progress -> completed


@pytest.mark.parametrize(("status", "limited"), [(429, True), (403, True), (502, False)])
def test_faults_on_demand_answer_as_github_does(server: dict[str, Any], status: int, limited: bool) -> None:
    fault = {"status": status, "match": "/repos/octo/widgets", "times": 1, "retry_after": 7}
    assert request(server, "/_control/fault", data=fault)[0] == 201
    code, headers, body = request(server, "/api/v3/repos/octo/widgets")
    assert code == status and headers["Retry-After"] == "7"
    if limited:
        assert headers["x-ratelimit-remaining"] == "0"
        assert body["message"].startswith("API rate limit exceeded")
    else:
        assert headers.get("x-ratelimit-remaining") is None and body["message"] == "Server Error"
    assert request(server, "/api/v3/repos/octo/widgets")[0] == 200  # only `times` requests


def test_reset_gives_the_running_server_a_fresh_state(tmp_path: Path) -> None:
    """The suite shares one server per session: reset() empties what a test left, at the same address."""
    from stellafleet.testing.github_server import GitHubServer
    from stellafleet.testing.github_state import Fault

    with GitHubServer(["octo/widgets"], directory=tmp_path / "srv") as github:
        where = {"host": github.host, "ca_file": str(github.ca_file), "token": github.token}
        github.state.add_fault(Fault(503, "/api/v3/repos/octo/widgets"))
        assert request(where, "/api/v3/repos/octo/widgets")[0] == 503
        old = github.state
        fresh = github.reset(["octo/gadgets"], directory=tmp_path / "next", ci_seconds=1.0)
        assert github.state is fresh and fresh is not old and fresh.ci_seconds == 1.0
        assert fresh.requests == [] and fresh.faults == [] and list(fresh.repos) == ["octo/gadgets"]
        assert fresh.repos["octo/gadgets"].path.is_relative_to(tmp_path / "next")
        status, _, body = request(where, "/api/v3/repos/octo/gadgets")  # the same host, CA and token
        assert status == 200 and body["full_name"] == "octo/gadgets"
        assert request(where, "/api/v3/repos/octo/widgets")[0] == 404  # the old state's repository is gone
        assert [entry["path"] for entry in fresh.requests] == [
            "/api/v3/repos/octo/gadgets",
            "/api/v3/repos/octo/widgets",
        ]


def test_a_push_over_gits_post_buffer_is_sent_chunked_and_lands(tmp_path: Path, git_repo: Path) -> None:
    """A first push of a real project is over git's 1 MiB http.postBuffer: git sends it with
    `Transfer-Encoding: chunked` and no Content-Length, and the server must read the chunks."""
    from stellafleet.testing.github_server import GitHubServer

    (git_repo / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # random: the pack cannot shrink it
    git("add", "blob.bin", cwd=git_repo)
    git("commit", "-qm", "three megabytes", cwd=git_repo)
    with GitHubServer(["octo/widgets"], directory=tmp_path / "srv") as github:
        env = {**os.environ, **github.gh_env(), "GIT_TRACE_CURL_NO_DATA": "1", "GIT_TRACE_CURL": "1"}
        done = subprocess.run(
            ["git", "push", "-q", github.clone_url("octo/widgets"), "main"],
            cwd=git_repo, env=env, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert "Transfer-Encoding: chunked" in done.stderr  # the case itself: git chunked the body
        assert done.returncode == 0, done.stderr[-2000:]
        head = git("rev-parse", "HEAD", cwd=git_repo).strip()
        assert github.state.repos["octo/widgets"].refs()["refs/heads/main"] == head
