"""The GitHub CLI as a boundary: a small runner Protocol, the real runner, and the few gh calls watch makes.
Everything goes through ``gh``, so the user's own ``gh auth login`` is all the setup there is."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.status import CIState
from stellafleet.core.words import duration_text
from stellafleet.proc import runner

GH_MISSING = "gh is not installed: install the GitHub CLI (https://cli.github.com) and run `gh auth login`"

# gh must never stop to ask anything or print colour codes into what we parse.
GH_ENV = {
    "GH_PROMPT_DISABLED": "1",
    "GH_NO_UPDATE_NOTIFIER": "1",
    "GH_NO_EXTENSION_UPDATE_NOTIFIER": "1",
    "GH_SPINNER_DISABLED": "1",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
}

RUN_FIELDS = "databaseId,attempt,status,conclusion,updatedAt,url,name,workflowName"

GREEN_CONCLUSIONS = frozenset({"success", "skipped", "neutral"})
# When several runs are red, the branch is labelled with the first of these that occurs.
RED_CONCLUSIONS = ("failure", "timed_out", "startup_failure", "action_required", "stale", "cancelled")


@dataclass(frozen=True)
class GhResult:
    returncode: int
    stdout: str
    stderr: str

    def detail(self) -> str:
        """gh's own last words, for an error message."""
        lines = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        if len(lines) > 1 and lines[-1].startswith("https://"):  # "... already exists:" then its URL
            return f"{lines[-2]} {lines[-1]}"
        return lines[-1] if lines else f"exit status {self.returncode}"


_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b|status code: (\d{3})\b")


def github_trouble(result: GhResult) -> str | None:
    """A rate limit or server error, by name ("GitHub rate limit (HTTP 429)"), or None for other failures."""
    if result.returncode == 0:
        return None
    text = f"{result.stderr}\n{result.stdout}"
    match = _HTTP_STATUS.search(text)
    code = int(match.group(1) or match.group(2)) if match else None
    if code == 429 or (code in (403, None) and "rate limit" in text.lower()):
        return f"GitHub rate limit (HTTP {code or 403})"
    if code is not None and 500 <= code <= 599:
        return f"GitHub server error (HTTP {code})"
    return None


@dataclass(frozen=True)
class Retry:
    """How long a gh call GitHub refuses for a while is retried: every `wait` seconds (the watch's poll
    interval), at most `give_up_after` seconds in all (its stall timeout)."""

    wait: float = 30.0
    give_up_after: float = 1200.0
    clock: Clock = field(default_factory=SystemClock)
    on_retry: Callable[[str], None] = lambda _: None  # told each retry, in one line


class GhRunner(Protocol):
    def run(self, args: Sequence[str], *, cwd: Path) -> GhResult:
        """Run `gh ARGS` in cwd; raise StellaError(GH_MISSING) when gh is not installed."""
        ...


class SystemGh:
    """The real gh, found on the current PATH and run non-interactively, in its own session."""

    timeout = 120.0

    def run(self, args: Sequence[str], *, cwd: Path) -> GhResult:
        found = shutil.which("gh", path=os.environ.get("PATH", ""))
        if found is None:
            raise StellaError(GH_MISSING, exit_code=EXIT_USAGE)
        try:
            env = {**os.environ, **GH_ENV}
            done = runner.run([found, *args], cwd=cwd, env=env, timeout=self.timeout)
        except OSError as exc:
            return GhResult(127, "", f"gh: {exc}")
        if done.timed_out:
            return GhResult(124, "", f"gh {' '.join(args[:2])} did not answer within {self.timeout:g}s")
        return GhResult(done.returncode, done.stdout, done.stderr)


class GhError(StellaError):
    """A gh call that failed; the message carries gh's own words."""


@dataclass(frozen=True)
class PullRequest:
    number: int
    url: str
    body: str

    @classmethod
    def from_gh(cls, data: dict[str, Any]) -> PullRequest:
        return cls(int(data["number"]), str(data["url"]), str(data.get("body") or ""))


@dataclass(frozen=True)
class CiRun:
    """One workflow run as `gh run list --json` describes it."""

    id: int
    attempt: int
    status: str
    conclusion: str
    updated_at: str
    url: str
    name: str
    workflow: str

    @classmethod
    def from_gh(cls, data: dict[str, Any]) -> CiRun:
        run_id, attempt, *texts = (data.get(key) for key in RUN_FIELDS.split(","))  # in the fields' order
        return cls(int(run_id or 0), int(attempt or 1), *(str(text or "") for text in texts))

    @property
    def red(self) -> bool:
        return self.status == "completed" and self.conclusion not in GREEN_CONCLUSIONS

    @property
    def label(self) -> str:
        if self.workflow and self.name and self.workflow != self.name:
            return f"{self.workflow} / {self.name}"
        return self.workflow or self.name or f"run {self.id}"

    def to_json(self) -> dict[str, Any]:
        shown = ("id", "attempt", "workflow", "name", "status", "conclusion", "url")
        return {name: getattr(self, name) for name in shown} | {"conclusion": self.conclusion or None}


def latest_attempts(runs: Sequence[CiRun]) -> list[CiRun]:
    """A re-run supersedes the earlier attempts of the same run id: keep the highest attempt of each."""
    best: dict[int, CiRun] = {}
    for run in sorted(runs, key=lambda r: r.attempt, reverse=True):  # stable: the first of a tie stays
        best.setdefault(run.id, run)
    return sorted(best.values(), key=lambda r: r.id)


def fingerprint(runs: Sequence[CiRun]) -> tuple[tuple[int, int, str, str, str], ...]:
    """What must change for a branch's CI to count as making progress."""
    return tuple(sorted((r.id, r.attempt, r.status, r.conclusion, r.updated_at) for r in runs))


def ci_phase(runs: Sequence[CiRun]) -> str:
    complete = sum(1 for r in runs if r.status == "completed")
    counts = Counter(r.status or "unknown" for r in runs if r.status != "completed")
    busy = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in sorted(counts.items()))
    return f"{complete}/{len(runs)} runs complete" + (f" ({busy})" if busy else "")


def red_label(runs: Sequence[CiRun]) -> str | None:
    """The conclusion a red branch is labelled with, or None when no completed run is red."""
    found = {r.conclusion for r in runs if r.red}
    # an unknown conclusion is not green either
    return next((label for label in RED_CONCLUSIONS if label in found), min(found, default=None))


_PR_NUMBER = re.compile(r"/pull/(\d+)")


def repo_with_port(url: str | None) -> str | None:
    """`HOST:PORT/OWNER/NAME` for an http(s) remote URL whose host has a port (a GitHub Enterprise Server
    on its own port): gh matches remotes to GH_HOST by host name alone, so it must be told with --repo."""
    if not url or not url.startswith(("https://", "http://")):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    path = parts.path.strip("/").removesuffix(".git").split("/")
    if port is None or not parts.hostname or len(path) != 2 or not all(path):
        return None
    return f"{parts.hostname}:{port}/{path[0]}/{path[1]}"


@dataclass
class GitHub:
    """The gh calls watch makes, run in the repository (gh finds the GitHub repository from its remotes)."""

    runner: GhRunner
    cwd: Path
    _: KW_ONLY
    repo: str | None = None
    retry: Retry = field(default_factory=Retry)

    def _gh(self, *args: str, repo_flag: bool = True, retry: bool = True) -> GhResult:
        """gh ARGS, retried while GitHub answers with a rate limit or a server error (see Retry)."""
        extra = ["--repo", self.repo] if self.repo and repo_flag else []
        policy = self.retry
        start = policy.clock.now()
        while True:
            result = self.runner.run([*args, *extra], cwd=self.cwd)
            trouble = github_trouble(result)
            if trouble is None:
                return result
            waited = policy.clock.now() - start
            if not retry or waited + policy.wait > policy.give_up_after:
                after = (
                    f" (still failing after {duration_text(waited, as_set=True)} of retries)"
                    if retry and waited
                    else ""
                )
                return GhResult(result.returncode, result.stdout, f"{trouble}{after}: {result.detail()}")
            wait = duration_text(policy.wait, as_set=True)
            policy.on_retry(f"gh {' '.join(args[:2])}: {trouble}; retrying in {wait}")
            policy.clock.sleep(policy.wait)

    def _ok(self, *args: str, failed: str | None = None, retry: bool = True) -> GhResult:
        """gh ARGS; GhError "gh ARGS failed: gh's own last words" (or FAILED: ...) when it fails."""
        result = self._gh(*args, retry=retry)
        if result.returncode != 0:
            said = failed or f"gh {' '.join(args)} failed"
            raise GhError(f"{said}: {result.detail()}")
        return result

    def _json(self, *args: str, what: str, retry: bool = True) -> Any:
        result = self._ok(*args, failed=f"gh {what} failed", retry=retry)
        try:
            return json.loads(result.stdout or "null")
        except json.JSONDecodeError:
            raise GhError(f"gh {what} printed something that is not JSON: {result.stdout[:200]!r}") from None

    def check_auth(self) -> None:
        """StellaError (exit 2) saying what to do when gh has no usable login."""
        result = self._gh("auth", "status", repo_flag=False)  # retried like any call on a 5xx
        trouble = github_trouble(result)
        if trouble is not None:  # GitHub could not answer: that says nothing of the login
            raise StellaError(f"gh auth status: {result.detail()}: try again once GitHub answers")
        if result.returncode != 0:
            # gh auth status says "the token is invalid" for any failed call, a 502 too: GitHub's answer to a
            # plain API call (retried on a 5xx) tells a server in trouble from a login that does not work
            probe = self._gh("api", "/", repo_flag=False)
            if probe.returncode == 0:
                return
            if github_trouble(probe) is not None:
                raise StellaError(f"gh api: {probe.detail()}: try again once GitHub answers")
            text = f"{result.stdout}\n{result.stderr}"
            lines = [line.strip(" -X\u2717") for line in text.splitlines() if line.strip()]
            said = next(
                (line for line in lines if "not logged in" in line.lower() or "invalid" in line.lower()),
                result.detail(),
            )
            raise StellaError(
                f"gh is not authenticated ({said}): run `gh auth login` (or set GH_TOKEN; for a GitHub "
                "Enterprise host, GH_HOST and GH_ENTERPRISE_TOKEN) and try again",
                exit_code=EXIT_USAGE,
            )

    def find_open_pr(self, branch: str) -> PullRequest | None:
        args = ("pr", "list", "--head", branch, "--state", "open", "--json", "number,url,body")
        found = self._json(*args, what="pr list")
        return PullRequest.from_gh(found[0]) if found else None

    def create_pr(self, branch: str, base: str | None, title: str, body: str) -> PullRequest:
        base_args = ["--base", base] if base else []
        args = ("pr", "create", "--head", branch, *base_args, "--title", title, "--body", body)
        result = self._ok(*args, failed=f"gh pr create failed for {branch}")
        urls = [line.strip() for line in result.stdout.splitlines() if "/pull/" in line]
        match = _PR_NUMBER.search(urls[-1]) if urls else None
        if match is None:  # gh printed no URL: ask for the pull request it made
            return self.view_pr(branch)
        return PullRequest(int(match.group(1)), urls[-1], body)

    def view_pr(self, ref: str) -> PullRequest:
        """The pull request of a branch, number or URL."""
        return PullRequest.from_gh(self._json("pr", "view", ref, "--json", "number,url,body", what="pr view"))

    def pr_fields(self, number: int, fields: str) -> dict[str, Any]:
        return dict(self._json("pr", "view", str(number), "--json", fields, what=f"pr view {number}") or {})

    def merge_pr(self, number: int, strategy: str) -> str:
        """`gh pr merge N --merge|--squash|--rebase` (on a base that needs a merge queue, gh queues it);
        what gh said (it names the merge queue when it used one)."""
        result = self._ok("pr", "merge", str(number), f"--{strategy}")
        return f"{result.stdout}\n{result.stderr}"

    def retarget_pr(self, number: int, base: str) -> None:
        """`gh pr edit N --base BASE`: the pull request merges into BASE from now on."""
        self._ok("pr", "edit", str(number), "--base", base, failed=f"gh pr edit #{number} --base failed")

    def edit_pr_body(self, number: int, body: str) -> None:
        self._ok("pr", "edit", str(number), "--body", body, failed=f"gh pr edit #{number} failed")

    def list_runs(self, sha: str) -> list[CiRun]:
        """The commit's workflow runs; not retried here: the watch polls again at its next interval."""
        args = ("run", "list", "--commit", sha, "--limit", "100", "--json", RUN_FIELDS)
        found = self._json(*args, what="run list", retry=False) or []
        return [CiRun.from_gh(item) for item in found if isinstance(item, dict)]

    def failed_log(self, run_id: int) -> str:
        return self._ok("run", "view", str(run_id), "--log-failed").stdout


STATUS_START = "<!-- stella:status -->"
STATUS_END = "<!-- /stella:status -->"
_STATUS_BLOCK = re.compile(re.escape(STATUS_START) + r".*?" + re.escape(STATUS_END), re.DOTALL)
_HEADLINES = {CIState.NO_CI: "no CI"}


def status_block(
    state: CIState, text: str, runs: Sequence[CiRun], *, run_id: str, head_sha: str | None
) -> str:
    """The PR body's status block between its markers; rewritten in place as CI progresses."""
    lines = [STATUS_START, "### CI status", "", f"**{_HEADLINES.get(state, state)}**: {text}", ""]
    if runs:
        lines += ["| workflow | attempt | status | conclusion |", "|---|---|---|---|"]
        for r in runs:
            name = f"[{r.label}]({r.url})" if r.url else r.label
            lines.append(f"| {name} | {r.attempt} | {r.status} | {r.conclusion or '-'} |")
        lines.append("")
    sha = (head_sha or "")[:12]
    lines += [f"_Kept current by `stella watch` (run `{run_id}`, commit `{sha}`)._", STATUS_END]
    return "\n".join(lines)


def with_status(body: str, block: str) -> str:
    """body with its status block replaced, or appended when it has none (a PR someone else opened)."""
    if _STATUS_BLOCK.search(body):
        return _STATUS_BLOCK.sub(lambda _: block, body, count=1)
    return f"{body.rstrip()}\n\n{block}" if body.strip() else block
