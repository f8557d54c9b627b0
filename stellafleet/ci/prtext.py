"""What stella writes about a branch's work: each task's section of its PR body (with the runs of its
check), and the end of a red CI run's log for the fix-up that reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stellafleet.ci.gh import CiRun, GhError, GitHub
from stellafleet.core.spend import money


@dataclass(frozen=True)
class TaskWork:
    id: str
    title: str
    summary: str
    spend_usd: float
    commits: tuple[tuple[str, str], ...]  # (sha, message), oldest first
    checks: tuple[dict[str, Any], ...] = ()  # its check's runs (the ledger's rows), oldest first


def trim_log(text: str, limit_bytes: int) -> str:
    """The last limit_bytes of text (the end of a failing log is where the error is), cut at a line."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text.strip("\n")
    tail = data[-limit_bytes:].decode("utf-8", "ignore")
    cut = tail.find("\n")
    tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail
    return f"[... {len(data) - len(tail.encode())} earlier bytes left out ...]\n{tail.strip(chr(10))}"


def failure_excerpt(github: GitHub, runs: Sequence[CiRun], limit_bytes: int) -> str:
    """The failing runs' `--log-failed` output, each under its run's label, trimmed to limit_bytes."""
    parts: list[str] = []
    for run in (r for r in runs if r.red):
        try:
            log = github.failed_log(run.id)
        except GhError as exc:
            log = f"(could not fetch the log: {exc.message})"
        parts.append(f"== {run.label} ({run.conclusion}) {run.url}\n{log.strip()}")
    return trim_log("\n\n".join(parts), limit_bytes) if parts else "(no failing job log was available)"


def task_section(task: TaskWork, run_id: str) -> str:
    """One task's part of a PR body: title, summary, spend, commits and the runs of its check."""
    listed = "\n".join(f"- `{sha[:12]}` {message}" for sha, message in task.commits) or "- (none)"
    return (
        f"## {task.title}\n\nTask `{task.id}` of stella fleet run `{run_id}`.\n\n"
        f"### Summary\n\n{task.summary or '(no summary recorded)'}\n\n"
        f"### Spend\n\n{money(task.spend_usd)}\n\n### Commits\n\n{listed}" + _checks_part(task.checks)
    )


def _checks_part(checks: tuple[dict[str, Any], ...]) -> str:
    """Each run of the task's check as stella ran it, and the end of the last one's output."""
    if not checks:
        return ""
    lines = []
    for c in checks:
        how = (
            "passed" if c["passed"] else f"exit {c['exit_code']}" if c["exit_code"] is not None else "no exit"
        )
        on = f" on `{c['commit_sha'][:12]}`" if c.get("commit_sha") else ""
        lines.append(f"- {c['phase']}{on}: `{c['command']}` {how} in {c['duration_ms'] / 1000:.1f} s")
    tail = (checks[-1].get("output_tail") or "").strip()[-2000:] or "(no output)"
    return (
        "\n\n### Check (run by stella)\n\n"
        + "\n".join(lines)
        + f"\n\n<details><summary>its last output</summary>\n\n```\n{tail}\n```\n</details>"
    )
