"""A scriptable in-process stand-in for the GitHub CLI (`gh`), for tests of the watch's own logic.

``FakeGh`` is a ``stellafleet.ci.gh.GhRunner`` for the cases the real gh cannot be made to produce
against the local GitHub API server (``stellafleet.testing.github_server``, which every test of what gh
itself does runs against): cancelled, timed-out or unknown conclusions, runs that stall, a scripted
failure of one call. Its outputs are the real gh 2.102's, as seen against that server: the same lines
on stdout and stderr, the same exit codes, only the fields asked for with ``--json``.

It answers ``auth status``, ``pr list``, ``pr create``, ``pr edit``, ``pr view``, ``run list`` and
``run view ID --log-failed``.

The script (every key optional)::

    {
      "repo": "octo/widgets",          # used in the URLs it prints
      "auth": "ok" | "logged_out" | "bad_token",
      "prs": [{"number": 7, "headRefName": "fleet/x", "body": "..."}],    # pull requests already open
      "runs": {"<commit sha>" or "*": [snapshot, snapshot, ...]},
          # successive `gh run list --commit SHA` calls get successive snapshots; the last one repeats.
          # A snapshot is a list of runs (gh's field names; missing fields are filled in) or a reply.
          # "{n}" in a run's string fields becomes the call number, for a run that keeps progressing.
          # A key "subject:TEXT" serves every commit whose subject contains TEXT (commits made during a
          # test, whose SHAs cannot be known in advance), after an exact SHA and before "*".
      "logs": {"<run databaseId>" or "*": "text"},
          # what `gh run view ID --log-failed` prints (the failed jobs' log lines)
      "replies": {"pr create": [reply, ...]}
          # canned replies for "<group> <verb>", used before the built-in behaviour; the last repeats.
          # A reply is {"exit": 1, "stdout": "", "stderr": "..."}, or null for the built-in behaviour.
    }
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stellafleet.ci.gh import GhResult
from stellafleet.git import gitops

NOT_LOGGED_IN = "You are not logged into any GitHub hosts. To log in, run: gh auth login\n"
BAD_TOKEN = (
    "github.com\n  X Failed to log in to github.com using token (GH_TOKEN)\n  - Active account: true\n"
    "  - The token in GH_TOKEN is invalid.\n"
)
LOGGED_IN = (
    "github.com\n  \u2713 Logged in to github.com account octo (GH_TOKEN)\n  - Active account: true\n"
    "  - Git operations protocol: https\n  - Token: gho_************************************\n"
    "  - Token scopes: 'gist', 'read:org', 'repo', 'workflow'\n"
)


# The flags that take no value (every other flag watch uses takes one).
_SWITCHES = frozenset({"--log-failed"})


def _parse(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Positional words and --flag values."""
    words: list[str] = []
    flags: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token in _SWITCHES:
            flags[token[2:]] = ""
        elif token.startswith("--") and "=" in token:
            key, value = token[2:].split("=", 1)
            flags[key] = value
        elif token.startswith("--") or token in ("-R", "-B", "-H", "-t", "-b"):
            short = {"-R": "repo", "-B": "base", "-H": "head", "-t": "title", "-b": "body"}
            flags[short.get(token, token[2:])] = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        else:
            words.append(token)
        i += 1
    return words, flags


def _pick(item: Mapping[str, Any], fields: str | None) -> dict[str, Any]:
    if not fields:
        return dict(item)
    return {name: item.get(name) for name in fields.split(",") if name}


class FakeGh:
    """Answers gh commands from a script, keeping its pull requests, counters and calls in memory."""

    def __init__(
        self,
        script: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.script: dict[str, Any] = dict(script or {})
        self.env = env
        self._memory: dict[str, Any] | None = None
        self._cwd = Path.cwd()

    # --- state ---

    def state(self) -> dict[str, Any]:
        if self._memory is None:
            prs = [self._fill_pr(dict(pr)) for pr in self.script.get("prs", [])]
            self._memory = {"calls": [], "counters": {}, "prs": prs}
        return self._memory

    def _save(self, state: dict[str, Any]) -> None:
        self._memory = state

    @property
    def calls(self) -> list[list[str]]:
        return [call["args"] for call in self.state()["calls"]]

    @property
    def prs(self) -> list[dict[str, Any]]:
        return list(self.state()["prs"])

    @property
    def repo(self) -> str:
        return str(self.script.get("repo", "octo/widgets"))

    def _fill_pr(self, pr: dict[str, Any]) -> dict[str, Any]:
        number = int(pr.get("number", 1))
        pr.setdefault("url", f"https://github.com/{self.repo}/pull/{number}")
        pr.setdefault("title", f"PR {number}")
        pr.setdefault("body", "")
        pr.setdefault("state", "OPEN")
        pr.setdefault("baseRefName", "main")
        pr.setdefault("isDraft", False)
        return pr

    def _next(self, state: dict[str, Any], key: str, sequence: Sequence[Any]) -> tuple[Any, int]:
        count = int(state["counters"].get(key, 0))
        state["counters"][key] = count + 1
        return sequence[min(count, len(sequence) - 1)], count + 1

    # --- the runner ---

    def run(self, args: Sequence[str], *, cwd: Path) -> GhResult:
        state = self.state()
        call: dict[str, Any] = {"args": list(args), "cwd": str(cwd)}
        if self.env is not None:
            call["prompt_disabled"] = self.env.get("GH_PROMPT_DISABLED") == "1"
        state["calls"].append(call)
        self._cwd = cwd
        words, flags = _parse(args)
        key = " ".join(words[:2])
        replies = self.script.get("replies", {}).get(key)
        reply = self._next(state, f"reply {key}", replies)[0] if replies else None
        if reply is not None:
            result = GhResult(int(reply.get("exit", 0)), reply.get("stdout", ""), reply.get("stderr", ""))
        else:
            handler = {
                "auth status": self._auth_status,
                "pr list": self._pr_list,
                "pr create": self._pr_create,
                "pr edit": self._pr_edit,
                "pr view": self._pr_view,
                "run list": self._run_list,
                "run view": self._run_view,
            }.get(key)
            if handler is None:
                result = GhResult(1, "", f'unknown command "{key}" for "gh"\n')
            else:
                result = handler(state, words, flags)
        self._save(state)
        return result

    def _auth_status(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        auth = self.script.get("auth", "ok")
        if auth == "logged_out":
            return GhResult(1, "", NOT_LOGGED_IN)
        if auth == "bad_token":
            return GhResult(1, "", BAD_TOKEN)
        return GhResult(0, LOGGED_IN, "")

    def _find(self, state: dict[str, Any], ref: str) -> dict[str, Any] | None:
        for pr in state["prs"]:
            if ref in (str(pr["number"]), pr["url"]) or (ref == pr["headRefName"] and pr["state"] == "OPEN"):
                return pr
        return None

    def _pr_list(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        wanted = flags.get("state", "open").upper()
        found = [
            _pick(pr, flags.get("json"))
            for pr in state["prs"]
            if ("head" not in flags or pr["headRefName"] == flags["head"]) and wanted in ("ALL", pr["state"])
        ]
        return GhResult(0, json.dumps(found) + "\n", "")

    def _pr_create(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        head, base = flags.get("head", ""), flags.get("base", "main")
        if not head or "title" not in flags or "body" not in flags:
            return GhResult(
                1, "", "must provide `--title` and `--body` (and `--head`) when not running interactively\n"
            )
        existing = self._find(state, head)
        if existing is not None:
            message = f'a pull request for branch "{head}" into branch "{base}" already exists:'
            return GhResult(1, "", f"{message}\n{existing['url']}\n")
        number = max([0, *(int(pr["number"]) for pr in state["prs"])]) + 1
        pr = self._fill_pr(
            {
                "number": number,
                "headRefName": head,
                "baseRefName": base,
                "title": flags["title"],
                "body": flags["body"],
            }
        )
        state["prs"].append(pr)
        return GhResult(0, pr["url"] + "\n", "")

    def _pr_edit(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        pr = self._find(state, words[2] if len(words) > 2 else "")
        if pr is None:
            number = " ".join(words[2:3])
            said = f"GraphQL: Could not resolve to a PullRequest with the number of {number}."
            return GhResult(1, "", f"{said} (repository.pullRequest)\n")
        for field in ("body", "title"):
            if field in flags:
                pr[field] = flags[field]
        return GhResult(0, pr["url"] + "\n", "")

    def _pr_view(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        pr = self._find(state, words[2] if len(words) > 2 else "")
        if pr is None:
            return GhResult(1, "", f'no pull requests found for branch "{" ".join(words[2:3])}"\n')
        return GhResult(0, json.dumps(_pick(pr, flags.get("json"))) + "\n", "")

    def _run_list(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        sha = flags.get("commit", "")
        runs = self.script.get("runs", {})
        sequence = runs.get(sha) or self._by_subject(runs, sha) or runs.get("*") or [[]]
        snapshot, n = self._next(state, f"run list {sha}", sequence)
        if isinstance(snapshot, dict):
            return GhResult(
                int(snapshot.get("exit", 0)), snapshot.get("stdout", ""), snapshot.get("stderr", "")
            )
        listed = [_pick(self._fill_run(run, i, sha, n), flags.get("json")) for i, run in enumerate(snapshot)]
        return GhResult(0, json.dumps(listed) + "\n", "")

    def _by_subject(self, runs: Mapping[str, Any], sha: str) -> Any:
        keys = [key for key in runs if key.startswith("subject:")]
        if not keys or not sha:
            return None
        subject = gitops.git("log", "-1", "--format=%s", sha, cwd=self._cwd, check=False).strip()
        return next((runs[key] for key in keys if subject and key[len("subject:") :] in subject), None)

    def _run_view(self, state: dict[str, Any], words: list[str], flags: dict[str, str]) -> GhResult:
        run_id = words[2] if len(words) > 2 else ""
        if "log-failed" not in flags:
            return GhResult(1, "", "the fake gh only serves `run view ID --log-failed`\n")
        logs = self.script.get("logs", {})
        text = logs.get(run_id, logs.get("*"))
        if text is None:
            url = f"https://api.github.com/repos/{self.repo}/actions/runs/{run_id}?exclude_pull_requests=true"
            return GhResult(1, "", f"failed to get run: HTTP 404: Not Found ({url})\n")
        return GhResult(0, str(text), "")

    def _fill_run(self, run: Mapping[str, Any], index: int, sha: str, n: int) -> dict[str, Any]:
        filled = {k: (v.replace("{n}", str(n)) if isinstance(v, str) else v) for k, v in run.items()}
        run_id = int(filled.setdefault("databaseId", 1000 + index))
        filled.setdefault("attempt", 1)
        filled.setdefault("status", "completed")
        filled.setdefault("conclusion", "success" if filled["status"] == "completed" else "")
        filled.setdefault("updatedAt", "2026-01-01T00:00:00Z")
        filled.setdefault("url", f"https://github.com/{self.repo}/actions/runs/{run_id}")
        filled.setdefault("name", "CI")
        filled.setdefault("workflowName", filled["name"])
        filled.setdefault("headSha", sha)
        filled.setdefault("event", "push")
        return filled
