"""The REST half of the local GitHub API server (under /api/v3): what gh asks for auth and Actions runs."""

from __future__ import annotations

import io
import json
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stellafleet.testing.github_state import (
    JOB_NAME,
    STEPS,
    WORKFLOW_ID,
    WORKFLOW_NAME,
    GitHubState,
    PullRequest,
    Repository,
    WorkflowRun,
)

SCOPES = "repo, workflow, read:org, gist"
GHES_VERSION = "3.17.0"  # the GitHub Enterprise Server release this server answers as


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, data: Any, headers: dict[str, str] | None = None) -> Reply:
        return cls(status, json.dumps(data).encode(), dict(headers or {}))


NOT_FOUND = Reply.json(404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"})


@dataclass
class Call:
    state: GitHubState
    repo: Repository
    match: re.Match[str]
    query: dict[str, list[str]]
    base: str
    body: bytes = b""

    def body_json(self) -> dict[str, Any]:
        data = json.loads(self.body or b"{}")
        return data if isinstance(data, dict) else {}

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def api(self, path: str) -> str:
        return f"{self.base}/api/v3/repos/{self.repo.full_name}{path}"

    def html(self, path: str) -> str:
        return f"{self.base}/{self.repo.full_name}{path}"


def answer_rest(state: GitHubState, method: str, target: str, body: bytes, base: str) -> Reply:
    split = urlsplit(target)
    path = split.path.rstrip("/") or "/"
    if path == "/" and method == "GET":
        return Reply.json(200, {"current_user_url": f"{base}/api/v3/user"}, {"X-Oauth-Scopes": SCOPES})
    if path == "/meta" and method == "GET":
        return Reply.json(
            200, {"installed_version": GHES_VERSION, "verifiable_password_authentication": False}
        )
    for verb, pattern, handler in _ROUTES:
        match = pattern.fullmatch(path)
        if match is None or verb != method:
            continue
        repo = state.repo(match.group("owner"), match.group("name"))
        if repo is None:
            return NOT_FOUND
        with state.lock:
            return handler(Call(state, repo, match, parse_qs(split.query), base, body))
    sys.stderr.write(f"github_server: no REST route for {method} {target} {body[:300]!r}\n")
    return NOT_FOUND


# --- repository ---


def _repo(call: Call) -> Reply:
    return Reply.json(200, repo_json(call))


def repo_json(call: Call) -> dict[str, Any]:
    repo = call.repo
    return {
        "id": 1,
        "node_id": "R_kgDOtest",
        "name": repo.name,
        "full_name": repo.full_name,
        "owner": {"login": repo.owner, "type": "Organization"},
        "private": True,
        "html_url": call.html(""),
        "url": call.api(""),
        "default_branch": repo.default_branch,
        "permissions": {"admin": True, "push": True, "pull": True},
    }


def pull_json(call: Call, pr: PullRequest) -> dict[str, Any]:
    return {
        "number": pr.number,
        "html_url": call.html(f"/pull/{pr.number}"),
        "state": "open" if pr.state == "OPEN" else "closed",
        "title": pr.title,
        "body": pr.body,
        "head": {"ref": pr.head, "sha": call.repo.refs().get(f"refs/heads/{pr.head}")},
        "base": {"ref": pr.base},
        "merged": pr.state == "MERGED",
        "merged_at": pr.merged_at,
        "closed_at": pr.closed_at,
        "merge_commit_sha": pr.merge_commit,
        "created_at": pr.created_at,
        "updated_at": pr.updated_at,
    }


def _pulls(call: Call) -> Reply:
    """GET /repos/O/N/pulls (what `gh api` shows of pull requests; stella itself uses GraphQL for them)."""
    wanted = call.arg("state") or "open"
    found = [pull_json(call, pr) for pr in reversed(call.repo.prs)]
    return Reply.json(200, [pr for pr in found if wanted in ("all", pr["state"])])


def _the_pull(call: Call) -> PullRequest | None:
    return call.repo.pr(int(call.match.group("number")))


def _pull(call: Call) -> Reply:
    pr = _the_pull(call)
    return NOT_FOUND if pr is None else Reply.json(200, pull_json(call, pr))


def _update_pull(call: Call) -> Reply:
    """PATCH /repos/O/N/pulls/N: a new title or body, or `state: closed` (close it unmerged)."""
    pr = _the_pull(call)
    if pr is None:
        return NOT_FOUND
    given = call.body_json()
    if given.get("state") == "closed" and pr.state == "OPEN":
        call.state.close(call.repo, pr)
    elif given.get("state") == "open" and pr.state == "CLOSED":
        pr.state, pr.closed_at = "OPEN", None
    pr.title = str(given.get("title", pr.title))
    pr.body = str(given.get("body", pr.body))
    pr.updated_at = call.state.iso()
    return Reply.json(200, pull_json(call, pr))


# --- actions ---


def run_json(call: Call, run: WorkflowRun) -> dict[str, Any]:
    state = call.state
    status, conclusion, since = run.phase(state.now(), state.ci_seconds)
    pr = call.repo.open_pr(run.head_branch)
    return {
        "id": run.id,
        "name": WORKFLOW_NAME,
        "node_id": f"WFR_{run.id}",
        "head_branch": run.head_branch,
        "head_sha": run.head_sha,
        "path": ".github/workflows/ci.yml",
        "display_title": f"CI for {run.head_branch}",
        "run_number": run.id % 1000,
        "event": "pull_request" if pr is not None else "push",
        "status": status,
        "conclusion": conclusion,
        "workflow_id": WORKFLOW_ID,
        "check_suite_id": run.id + 1,
        "url": call.api(f"/actions/runs/{run.id}"),
        "html_url": call.html(f"/actions/runs/{run.id}"),
        "jobs_url": call.api(f"/actions/runs/{run.id}/jobs"),
        "logs_url": call.api(f"/actions/runs/{run.id}/logs"),
        "workflow_url": call.api(f"/actions/workflows/{WORKFLOW_ID}"),
        "pull_requests": [],
        "created_at": run.created_at,
        "updated_at": state.iso(since),
        "run_started_at": run.created_at,
        "run_attempt": run.attempt,
        "actor": {"login": "stella-bot"},
        "triggering_actor": {"login": "stella-bot"},
        "head_commit": {"id": run.head_sha, "message": "", "author": {"name": "stella"}},
        "repository": {"full_name": call.repo.full_name, "name": call.repo.name},
    }


def _runs(call: Call) -> Reply:
    runs = list(reversed(call.repo.runs))
    sha, branch = call.arg("head_sha"), call.arg("branch")
    runs = [
        r for r in runs if (sha is None or r.head_sha == sha) and (branch is None or r.head_branch == branch)
    ]
    per_page = int(call.arg("per_page") or 30)
    page = int(call.arg("page") or 1)
    shown = runs[(page - 1) * per_page : page * per_page]
    return Reply.json(200, {"total_count": len(runs), "workflow_runs": [run_json(call, r) for r in shown]})


def _the_run(call: Call) -> WorkflowRun | None:
    return call.repo.run(int(call.match.group("id")))


def _run(call: Call) -> Reply:
    run = _the_run(call)
    return NOT_FOUND if run is None else Reply.json(200, run_json(call, run))


def job_json(call: Call, run: WorkflowRun) -> dict[str, Any]:
    state = call.state
    status, conclusion, _ = run.phase(state.now(), state.ci_seconds)
    steps = []
    for number, name in enumerate(STEPS, start=1):
        failed = conclusion == "failure" and name == "Run tests"
        step_conclusion = None if conclusion is None else ("failure" if failed else "success")
        steps.append(
            {"name": name, "status": status, "conclusion": step_conclusion, "number": number,
             "started_at": run.created_at, "completed_at": run.created_at if conclusion else None}
        )  # fmt: skip
    return {
        "id": run.id * 10 + 1,
        "run_id": run.id,
        "run_attempt": run.attempt,
        "node_id": f"CR_{run.id}",
        "head_sha": run.head_sha,
        "url": call.api(f"/actions/jobs/{run.id * 10 + 1}"),
        "html_url": call.html(f"/actions/runs/{run.id}/job/{run.id * 10 + 1}"),
        "status": status,
        "conclusion": conclusion,
        "started_at": run.created_at,
        "completed_at": run.created_at if conclusion else None,
        "name": JOB_NAME,
        "steps": steps,
        "workflow_name": WORKFLOW_NAME,
        "head_branch": run.head_branch,
        "labels": ["ubuntu-latest"],
    }


def _jobs(call: Call) -> Reply:
    run = _the_run(call)
    if run is None:
        return NOT_FOUND
    return Reply.json(200, {"total_count": 1, "jobs": [job_json(call, run)]})


def step_logs(call: Call, run: WorkflowRun) -> dict[str, str]:
    """Each step's log text, by step name."""
    state = call.state
    stamp = state.iso(run.started)
    _, conclusion, _ = run.phase(state.now(), state.ci_seconds)
    tests = state.failed_log_lines(run) if conclusion == "failure" else [f"{stamp} 3 passed in 0.42s"]
    return {
        "Set up job": f"{stamp} Current runner version: '2.330.0'\n{stamp} Operating System\n",
        "Run tests": "\n".join(tests) + "\n",
        "Complete job": f"{stamp} Cleaning up orphan processes\n",
    }


def _logs_zip(call: Call) -> Reply:
    run = _the_run(call)
    if run is None:
        return NOT_FOUND
    buffer = io.BytesIO()
    logs = step_logs(call, run)
    with zipfile.ZipFile(buffer, "w") as archive:
        whole = "".join(logs[name] for name in STEPS)
        archive.writestr(f"0_{JOB_NAME}.txt", whole)
        for number, name in enumerate(STEPS, start=1):
            archive.writestr(f"{JOB_NAME}/{number}_{name}.txt", logs[name])
    return Reply(200, buffer.getvalue(), {"Content-Type": "application/zip"})


def _job_logs(call: Call) -> Reply:
    run = call.repo.run(int(call.match.group("id")) // 10)
    if run is None:
        return NOT_FOUND
    logs = step_logs(call, run)
    return Reply(200, "".join(logs[name] for name in STEPS).encode(), {"Content-Type": "text/plain"})


def workflow_json(call: Call) -> dict[str, Any]:
    return {
        "id": WORKFLOW_ID,
        "node_id": f"W_{WORKFLOW_ID}",
        "name": WORKFLOW_NAME,
        "path": ".github/workflows/ci.yml",
        "state": "active",
        "url": call.api(f"/actions/workflows/{WORKFLOW_ID}"),
        "html_url": call.html("/blob/main/.github/workflows/ci.yml"),
    }


def _workflows(call: Call) -> Reply:
    return Reply.json(200, {"total_count": 1, "workflows": [workflow_json(call)]})


def _workflow(call: Call) -> Reply:
    return Reply.json(200, workflow_json(call))


_REPO = r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], Callable[[Call], Reply]]] = [
    ("GET", re.compile(_REPO), _repo),
    ("GET", re.compile(_REPO + r"/pulls"), _pulls),
    ("GET", re.compile(_REPO + r"/pulls/(?P<number>\d+)"), _pull),
    ("PATCH", re.compile(_REPO + r"/pulls/(?P<number>\d+)"), _update_pull),
    ("GET", re.compile(_REPO + r"/actions/runs"), _runs),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)"), _run),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)/attempts/\d+"), _run),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)/jobs"), _jobs),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)/attempts/\d+/jobs"), _jobs),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)/logs"), _logs_zip),
    ("GET", re.compile(_REPO + r"/actions/runs/(?P<id>\d+)/attempts/\d+/logs"), _logs_zip),
    ("GET", re.compile(_REPO + r"/actions/jobs/(?P<id>\d+)/logs"), _job_logs),
    ("GET", re.compile(_REPO + r"/actions/workflows"), _workflows),
    ("GET", re.compile(_REPO + r"/actions/workflows/(?P<id>\d+)"), _workflow),
]
