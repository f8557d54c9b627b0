"""What the local GitHub API server knows: repositories, pull requests, simulated CI runs and faults.

One `GitHubState` behind a lock, shared by the server's request threads. Each repository is a real bare
git repository served over smart HTTP; every push of a branch head gets a workflow run that goes
queued -> in_progress -> completed within `ci_seconds` (thirds of it each), concluding `failure` when
the pushed tree has a file `.ci-result` that says `failure`, else `success`. Time comes from a Clock,
so a test in the same process can move it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stellafleet.core.clock import Clock, SystemClock

CI_RESULT_FILE = ".ci-result"
WORKFLOW_ID = 161335
WORKFLOW_NAME = "CI"
JOB_NAME = "build"
STEPS = ("Set up job", "Run tests", "Complete job")


def git(*args: str, cwd: Path, check: bool = True) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class PullRequest:
    number: int
    head: str
    base: str
    title: str
    body: str
    created_at: str
    updated_at: str
    state: str = "OPEN"  # OPEN | CLOSED | MERGED
    merged_at: str | None = None
    closed_at: str | None = None
    merge_commit: str | None = None
    merge_method: str | None = None
    queued_at: float | None = None  # in the merge queue since (clock seconds)

    @property
    def node_id(self) -> str:
        return f"PR_kw{self.number:08d}"


@dataclass
class WorkflowRun:
    id: int
    head_sha: str
    head_branch: str
    started: float  # clock seconds
    failing: bool
    created_at: str
    attempt: int = 1

    def phase(self, now: float, ci_seconds: float) -> tuple[str, str | None, float]:
        """(status, conclusion, when that status began) at clock time now."""
        elapsed = now - self.started
        third = ci_seconds / 3.0
        if elapsed >= ci_seconds:
            return "completed", "failure" if self.failing else "success", self.started + ci_seconds
        if elapsed >= third:
            return "in_progress", None, self.started + third
        return "queued", None, self.started


@dataclass
class Repository:
    owner: str
    name: str
    path: Path  # the bare repository
    default_branch: str = "main"
    merge_queue: bool = False
    merge_queue_method: str = "SQUASH"
    prs: list[PullRequest] = field(default_factory=list)
    runs: list[WorkflowRun] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def refs(self) -> dict[str, str]:
        out = git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", cwd=self.path)
        pairs = (line.split(" ", 1) for line in out.splitlines() if " " in line)
        return {ref: sha for ref, sha in pairs}

    def open_pr(self, head: str) -> PullRequest | None:
        return next((pr for pr in self.prs if pr.head == head and pr.state == "OPEN"), None)

    def pr(self, number: int) -> PullRequest | None:
        return next((pr for pr in self.prs if pr.number == number), None)

    def run(self, run_id: int) -> WorkflowRun | None:
        return next((run for run in self.runs if run.id == run_id), None)


_BOT = {"GIT_AUTHOR_NAME": "stella-bot", "GIT_AUTHOR_EMAIL": "stella-bot@users.noreply.github.invalid"}


class MergeConflict(Exception):
    """The pull request does not merge cleanly into its base."""


def _merge_tree(repo: Repository, ours: str, theirs: str) -> str:
    done = subprocess.run(
        ["git", "merge-tree", "--write-tree", ours, theirs],
        cwd=repo.path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise MergeConflict(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr)
    return done.stdout.split()[0]


def _pick_tree(repo: Repository, onto: str, sha: str) -> str:
    """The tree of sha's change applied onto onto (a cherry-pick). `merge-tree --merge-base` needs git 2.40,
    so on 2.38 and 2.39 two scratch commits, onto's tree and sha's, share one parent holding sha^'s tree:
    their merge base is then sha^, as a cherry-pick's is."""
    who = {**_BOT, "GIT_COMMITTER_NAME": "GitHub", "GIT_COMMITTER_EMAIL": "noreply@github.invalid"}
    root = _commit_tree(repo, f"{sha}^^{{tree}}", [], "base", who)
    ours = _commit_tree(repo, f"{onto}^{{tree}}", [root], "ours", who)
    theirs = _commit_tree(repo, f"{sha}^{{tree}}", [root], "theirs", who)
    return _merge_tree(repo, ours, theirs)


def _commit_tree(repo: Repository, tree: str, parents: list[str], message: str, env: dict[str, str]) -> str:
    args = ["git", "commit-tree", tree, *(f for p in parents for f in ("-p", p))]
    full_env = {**os.environ, **env}
    done = subprocess.run(
        args, cwd=repo.path, input=message, capture_output=True, text=True, env=full_env, check=True
    )
    return done.stdout.strip()


@dataclass
class Fault:
    """Answer the next `times` requests whose path (or GraphQL operation) contains `match` with `status`."""

    status: int
    match: str = ""
    times: int = 1
    retry_after: int | None = None
    message: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fault:
        return cls(
            status=int(data["status"]),
            match=str(data.get("match") or ""),
            times=int(data.get("times", 1)),
            retry_after=None if data.get("retry_after") is None else int(data["retry_after"]),
            message=str(data.get("message") or ""),
        )


class GitHubState:
    """The served repositories, their pull requests and CI, the faults to inject, and a request log."""

    def __init__(
        self, root: Path, repos: list[str], *, ci_seconds: float = 3.0, clock: Clock | None = None
    ) -> None:
        self.root = root
        self.ci_seconds = ci_seconds
        self.clock = clock or SystemClock()
        self._wall0 = time.time() - self.clock.now()
        self.lock = threading.RLock()
        self.repos: dict[str, Repository] = {}
        self.faults: list[Fault] = []
        self.requests: list[dict[str, Any]] = []
        self.events: list[str] = []  # "queued owner/name#N", "merged owner/name#N", in order
        self._next_id = 7_000_000_001
        for full in repos:
            self.add_repo(full)

    # --- repositories ---

    def add_repo(self, full_name: str, *, merge_queue: bool = False) -> Repository:
        owner, _, name = full_name.partition("/")
        if not owner or not name or "/" in name:
            raise ValueError(f"a repository is OWNER/NAME, not {full_name!r}")
        path = self.root / "repos" / owner / f"{name}.git"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            git("init", "-q", "--bare", "-b", "main", str(path), cwd=self.root)
            git("config", "http.receivepack", "true", cwd=path)
        repo = Repository(owner, name, path, merge_queue=merge_queue)
        self.repos[full_name.lower()] = repo
        return repo

    def repo(self, owner: str, name: str) -> Repository | None:
        if name.endswith(".git"):
            name = name[:-4]
        return self.repos.get(f"{owner}/{name}".lower())

    # --- time ---

    def now(self) -> float:
        return self.clock.now()

    def iso(self, at: float | None = None) -> str:
        stamp = self._wall0 + (self.now() if at is None else at)
        return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    # --- pushes and CI ---

    def pushed(self, repo: Repository, before: dict[str, str], after: dict[str, str]) -> None:
        """A workflow run for every branch head the push created or moved."""
        for ref, sha in after.items():
            if before.get(ref) == sha or not ref.startswith("refs/heads/"):
                continue
            self.start_run(repo, ref[len("refs/heads/") :], sha)

    def start_run(self, repo: Repository, branch: str, sha: str) -> WorkflowRun:
        said = git("show", f"{sha}:{CI_RESULT_FILE}", cwd=repo.path, check=False).strip()
        run = WorkflowRun(self.new_id(), sha, branch, self.now(), said == "failure", self.iso())
        with self.lock:
            repo.runs.append(run)
        return run

    def rerun(self, repo: Repository, run_id: int, *, failing: bool) -> WorkflowRun:
        """Re-run a workflow run, as GitHub's "Re-run jobs": the same id, the next attempt, from queued."""
        with self.lock:
            run = repo.run(run_id)
            if run is None:
                raise KeyError(run_id)
            run.attempt += 1
            run.started, run.failing, run.created_at = self.now(), failing, self.iso()
            return run

    def failed_log_lines(self, run: WorkflowRun) -> list[str]:
        """The failing step's log lines (what `gh run view --log-failed` shows, without its prefix)."""
        stamp = self.iso(run.started + self.ci_seconds / 2)
        return [
            f"{stamp} ##[group]Run python -m pytest",
            f"{stamp} python -m pytest",
            f"{stamp} ##[endgroup]",
            f"{stamp} FAILED tests/test_ci.py::test_result - {CI_RESULT_FILE} says failure"
            f" at {run.head_sha[:12]}",
            f"{stamp} ##[error]Process completed with exit code 1.",
        ]

    # --- merging ---

    def merge(self, repo: Repository, pr: PullRequest, method: str) -> str:
        """Land pr on its base in the bare repository (MERGE, SQUASH or REBASE); the new base head.
        MergeConflict when it does not apply cleanly."""
        refs = repo.refs()
        base_sha, head_sha = refs[f"refs/heads/{pr.base}"], refs[f"refs/heads/{pr.head}"]
        env = {"GIT_COMMITTER_NAME": "GitHub", "GIT_COMMITTER_EMAIL": "noreply@github.invalid"}
        if method == "REBASE":
            new = base_sha
            for sha in git("rev-list", "--reverse", f"{base_sha}..{head_sha}", cwd=repo.path).split():
                tree = _pick_tree(repo, new, sha)
                message = git("log", "-1", "--format=%B", sha, cwd=repo.path)
                author = (
                    git("log", "-1", "--format=%an%x00%ae%x00%aI", sha, cwd=repo.path).strip().split("\0")
                )
                who = {
                    "GIT_AUTHOR_NAME": author[0],
                    "GIT_AUTHOR_EMAIL": author[1],
                    "GIT_AUTHOR_DATE": author[2],
                }
                new = _commit_tree(repo, tree, [new], message, {**env, **who})
        else:
            tree = _merge_tree(repo, base_sha, head_sha)
            if method == "SQUASH":
                message = f"{pr.title} (#{pr.number})\n\n"
                new = _commit_tree(repo, tree, [base_sha], message, {**env, **_BOT})
            else:
                message = f"Merge pull request #{pr.number} from {repo.owner}/{pr.head}\n\n{pr.title}\n"
                new = _commit_tree(repo, tree, [base_sha, head_sha], message, {**env, **_BOT})
        git("update-ref", f"refs/heads/{pr.base}", new, base_sha, cwd=repo.path)
        pr.state, pr.merged_at, pr.merge_commit, pr.merge_method = "MERGED", self.iso(), new, method
        pr.closed_at = pr.merged_at
        pr.queued_at = None
        pr.updated_at = self.iso()
        self.events.append(f"merged {repo.full_name}#{pr.number}")
        self.start_run(repo, pr.base, new)
        return new

    def close(self, repo: Repository, pr: PullRequest) -> None:
        """Close pr unmerged, as a reviewer does (its branch stays)."""
        with self.lock:
            pr.state, pr.closed_at, pr.updated_at, pr.queued_at = "CLOSED", self.iso(), self.iso(), None
            self.events.append(f"closed {repo.full_name}#{pr.number}")

    def land_queue(self) -> None:
        """Merge the queued pull requests whose time in the queue (ci_seconds) has passed, in queue order."""
        with self.lock:
            for repo in self.repos.values():
                queued = sorted(
                    (pr for pr in repo.prs if pr.queued_at is not None), key=lambda p: p.queued_at or 0
                )
                for pr in queued:
                    if self.now() - (pr.queued_at or 0) < self.ci_seconds:
                        break
                    try:
                        self.merge(repo, pr, repo.merge_queue_method)
                    except MergeConflict:
                        pr.queued_at = None  # the queue drops a pull request that no longer merges

    # --- faults ---

    def add_fault(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def take_fault(self, key: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.match in key:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def log_request(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(entry)
