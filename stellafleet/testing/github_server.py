"""A local GitHub API server over HTTPS, for running the real `gh` (and `git push`) in tests.

    python -m stellafleet.testing.github_server --repo OWNER/NAME [--repo ...] [--ci-seconds N]

prints one JSON line, ``{"host": "localhost:PORT", "ca_file": "...", "token": "..."}``, and serves until
stopped. Point the real gh at it as at a GitHub Enterprise Server: ``GH_HOST=localhost:PORT``,
``GH_ENTERPRISE_TOKEN=TOKEN``, ``SSL_CERT_FILE=CA_FILE`` (and ``GIT_SSL_CAINFO=CA_FILE`` for git).

- REST under ``/api/v3`` (github_rest.py) and GraphQL at ``/api/graphql`` (github_graphql.py): the
  requests gh 2.102 sends for what stellafleet runs, found by running it against this server.
- Each repository over git's smart HTTP (``git http-backend``) at ``https://localhost:PORT/OWNER/NAME.git``,
  the token as the password; every pushed branch head gets a simulated CI run (github_state.py).
- A request with a wrong or missing token gets 401 ``Bad credentials``.
- Faults on demand: ``POST /_control/fault`` with ``{"status": 429, "match": "/actions/runs",
  "times": 2, "retry_after": 1}`` answers the next matching requests with that status (403 and 429 as
  GitHub's rate limit: ``Retry-After`` and ``x-ratelimit-remaining: 0``; 5xx as a server error).
  ``POST /_control/repo`` with ``{"repo": "OWNER/NAME", "merge_queue": true}`` sets a repository up;
  ``POST /_control/rerun`` with ``{"repo": "OWNER/NAME", "run_id": N, "result": "success"}`` re-runs a
  run (its next attempt);
  ``GET /_control/state`` returns the pull requests, runs and the request log.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stellafleet.core.clock import Clock
from stellafleet.testing.github_graphql import answer_graphql, operation_name
from stellafleet.testing.github_rest import Reply, answer_rest
from stellafleet.testing.github_state import Fault, GitHubState
from stellafleet.testing.github_tls import make_certificates

RATE_LIMIT_MESSAGE = "API rate limit exceeded for user ID 1."


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("STELLA_GITHUB_SERVER_LOG"):
            sys.stderr.write("github_server: " + format % args + "\n")

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    # --- one request ---

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked_body()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _chunked_body(self) -> bytes:
        """git sends a push over its http.postBuffer (1 MiB) in chunks, with no Content-Length."""
        chunks: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():  # the trailers, up to the blank line
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("token", "bearer"):
            return value.strip()
        if scheme.lower() == "basic":
            import base64

            try:
                return base64.b64decode(value).decode().partition(":")[2]
            except ValueError:
                return None
        return None

    def _serve(self) -> None:
        state = self.server.state
        path = urlsplit(self.path).path
        body = self._body()
        git = self._git_repo(path)
        if self._token() != self.server.token:
            if git is not None:
                self._send(Reply(401, b"", {"WWW-Authenticate": 'Basic realm="GitHub"'}))
            else:
                self._send(Reply.json(401, {"message": "Bad credentials"}))
            return
        key = path
        operation = None
        if path == "/api/graphql":
            operation = operation_name(body)
            key = f"{path} {operation}"
        state.log_request({"method": self.command, "path": self.path, "operation": operation})
        state.land_queue()
        if not path.startswith("/_control/"):
            fault = state.take_fault(f"{self.command} {key}")
            if fault is not None:
                self._send(_fault_reply(fault))
                return
        if git is not None:
            self._git(git, body)
        elif path.startswith("/_control/"):
            self._send(self._control(path, body))
        elif path == "/api/graphql":
            self._send(answer_graphql(state, body, self._base_url()))
        elif path.startswith("/api/v3"):
            self._send(answer_rest(state, self.command, self.path[len("/api/v3") :], body, self._base_url()))
        else:
            self._send(Reply.json(404, {"message": "Not Found"}))

    def _base_url(self) -> str:
        return f"https://{self.server.host}"

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        headers = {"Content-Type": "application/json; charset=utf-8", **reply.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    # --- control ---

    def _control(self, path: str, body: bytes) -> Reply:
        state = self.server.state
        data = json.loads(body or b"{}") if self.command == "POST" else {}
        if path == "/_control/fault":
            state.add_fault(Fault.from_json(data))
            return Reply.json(201, {"ok": True})
        if path == "/_control/repo":
            with state.lock:
                repo = state.repos.get(str(data.get("repo", "")).lower()) or state.add_repo(data["repo"])
                repo.merge_queue = bool(data.get("merge_queue", repo.merge_queue))
            return Reply.json(200, {"ok": True})
        if path == "/_control/rerun":
            repo = state.repos[str(data["repo"]).lower()]
            run = state.rerun(repo, int(data["run_id"]), failing=data.get("result") == "failure")
            return Reply.json(200, {"id": run.id, "attempt": run.attempt})
        if path == "/_control/state":
            return Reply.json(200, snapshot(state))
        return Reply.json(404, {"message": "Not Found"})

    # --- git smart HTTP ---

    def _git_repo(self, path: str) -> tuple[str, str, str] | None:
        parts = path.lstrip("/").split("/", 2)
        if len(parts) >= 2 and parts[1].endswith(".git"):
            return parts[0], parts[1][:-4], "/" + (parts[2] if len(parts) > 2 else "")
        return None

    def _git(self, where: tuple[str, str, str], body: bytes) -> None:
        state = self.server.state
        owner, name, rest = where
        repo = state.repo(owner, name)
        if repo is None:
            self._send(Reply(404, b"Repository not found.\n", {"Content-Type": "text/plain"}))
            return
        pushing = rest == "/git-receive-pack"
        with state.lock if pushing else _NO_LOCK:
            before = repo.refs() if pushing else {}
            status, headers, out = _http_backend(repo.path, self, rest, body)
            if pushing:
                state.pushed(repo, before, repo.refs())
        self._send(Reply(status, out, headers))


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


def _http_backend(
    repo_path: Path, request: BaseHTTPRequestHandler, rest: str, body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """Run `git http-backend` (CGI) for one request: (status, headers, body)."""
    split = urlsplit(request.path)
    env = {
        **os.environ,
        "GIT_PROJECT_ROOT": str(repo_path.parent),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": f"/{repo_path.name}{rest}",
        "QUERY_STRING": split.query,
        "REQUEST_METHOD": request.command,
        "CONTENT_TYPE": request.headers.get("Content-Type") or "",
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_USER": "stella",
        "REMOTE_ADDR": "127.0.0.1",
        "GIT_PROTOCOL": request.headers.get("Git-Protocol") or "",
    }
    if request.headers.get("Content-Encoding") == "gzip":
        import gzip

        body = gzip.decompress(body)
        env["CONTENT_LENGTH"] = str(len(body))
    done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
    head, _, out = done.stdout.partition(b"\r\n\r\n")
    if not _:
        head, _, out = done.stdout.partition(b"\n\n")
    status, headers = 200, {}
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers[name.strip()] = value.strip()
    return status, headers, out


def _fault_reply(fault: Fault) -> Reply:
    headers: dict[str, str] = {}
    if fault.retry_after is not None:
        headers["Retry-After"] = str(fault.retry_after)
    if fault.status in (403, 429):
        headers.update(
            {"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-used": "5000"}
        )
        message = fault.message or RATE_LIMIT_MESSAGE
    else:
        message = fault.message or "Server Error"
    return Reply.json(
        fault.status, {"message": message, "documentation_url": "https://docs.github.com/rest"}, headers
    )


def snapshot(state: GitHubState) -> dict[str, Any]:
    """What the server holds, for a test's assertions."""
    with state.lock:
        return {
            "repos": {
                repo.full_name: {
                    "merge_queue": repo.merge_queue,
                    "prs": [asdict(pr) for pr in repo.prs],
                    "runs": [
                        {**asdict(run), "status": run.phase(state.now(), state.ci_seconds)[0]}
                        for run in repo.runs
                    ],
                }
                for repo in state.repos.values()
            },
            "requests": list(state.requests),
            "events": list(state.events),
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: GitHubState, token: str, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.token = token
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.host = f"localhost:{self.server_address[1]}"


class GitHubServer:
    """The server in this process (a thread), for tests that hold the state directly."""

    def __init__(
        self,
        repos: Sequence[str],
        *,
        directory: Path | None = None,
        ci_seconds: float = 3.0,
        clock: Clock | None = None,
        token: str | None = None,
    ) -> None:
        self._tmp = None if directory is not None else tempfile.TemporaryDirectory(prefix="stella-github-")
        self.directory = directory or Path(self._tmp.name)  # type: ignore[union-attr]
        certs = make_certificates(self.directory / "tls")
        self.ca_file = certs.ca_file
        self.token = token or "ghp_" + secrets.token_hex(18)
        self.state = GitHubState(self.directory, list(repos), ci_seconds=ci_seconds, clock=clock)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs.cert_file, certs.key_file)
        self._server = _Server(self.state, self.token, context)
        self.host = self._server.host
        self._thread = threading.Thread(target=self._server.serve_forever, name="github-server", daemon=True)

    def start(self) -> GitHubServer:
        self._thread.start()
        return self

    def reset(
        self, repos: Sequence[str], *, directory: Path, ci_seconds: float = 3.0, clock: Clock | None = None
    ) -> GitHubState:
        """A fresh state behind the running server: new bare repositories in directory, no pull requests,
        runs, faults or request log. Tests share one server (its certificates, port and token) this way,
        and none sees what an earlier one left."""
        self.state = GitHubState(directory, list(repos), ci_seconds=ci_seconds, clock=clock)
        self._server.state = self.state
        return self.state

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> GitHubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def clone_url(self, repo: str) -> str:
        """The repository's URL with the token in it (git sends it as the password)."""
        return f"https://x-access-token:{self.token}@{self.host}/{repo}.git"

    def gh_env(self) -> dict[str, str]:
        """The environment that points gh and git at this server."""
        return {
            "GH_HOST": self.host,
            "GH_ENTERPRISE_TOKEN": self.token,
            "SSL_CERT_FILE": str(self.ca_file),
            "GIT_SSL_CAINFO": str(self.ca_file),
        }

    def describe(self) -> dict[str, str]:
        return {"host": self.host, "ca_file": str(self.ca_file), "token": self.token}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stellafleet.testing.github_server", description=__doc__)
    parser.add_argument(
        "--repo", action="append", default=[], metavar="OWNER/NAME", help="serve this repository"
    )
    parser.add_argument("--ci-seconds", type=float, default=3.0, help="how long each simulated CI run takes")
    parser.add_argument("--merge-queue", action="append", default=[], metavar="OWNER/NAME",
                        help="this repository lands pull requests through a merge queue")  # fmt: skip
    parser.add_argument("--dir", type=Path, help="where the repositories and the CA go (default: a temp dir)")
    args = parser.parse_args(argv)
    if not args.repo:
        parser.error("name at least one --repo OWNER/NAME")
    server = GitHubServer(args.repo, directory=args.dir, ci_seconds=args.ci_seconds)
    for full in args.merge_queue:
        server.state.add_repo(full, merge_queue=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps(server.describe()), flush=True)
    try:
        server._server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
