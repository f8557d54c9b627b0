"""`stella runs`: past fleet runs from the ledger, as a table or one run in detail (or JSON)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stellafleet.core import jsontext
from stellafleet.core.clock import wall_ms
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.spend import money
from stellafleet.core.status import CIState, FollowUpReason, RunStatus, TaskStatus
from stellafleet.core.terminal import aligned, single_line, styled
from stellafleet.core.words import duration_text
from stellafleet.git import gitops
from stellafleet.pipelines.sessions import short_id
from stellafleet.state import views

STATUS_STYLE: dict[str, str] = {
    TaskStatus.SUCCEEDED: "green",
    CIState.GREEN: "green",
    TaskStatus.FAILED: "red",
    CIState.RED: "red",
    TaskStatus.SKIPPED: "yellow",
    RunStatus.SPEND_LIMITED: "yellow",
    TaskStatus.INTERRUPTED: "yellow",
    TaskStatus.RUNNING: "cyan",
    TaskStatus.PENDING: "cyan",
    TaskStatus.PARKED: "blue",
}


# Task counts always shown (succeeded/failed/skipped), then those shown only when there are some.
SETTLED_STATUSES = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SKIPPED)
OTHER_STATUSES = (TaskStatus.PARKED, TaskStatus.RUNNING, TaskStatus.PENDING, TaskStatus.INTERRUPTED)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="list past fleet runs, or show one run in detail",
        description=(
            "Without RUN: a table of fleet runs, newest first. With RUN (an id, a unique prefix of one, "
            "or `latest`): its tasks, attempts with summaries, commits, spend, branches and CI."
        ),
    )
    parser.add_argument("run_ref", nargs="?", metavar="RUN", help="a run id, a unique prefix, or `latest`")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--limit", type=int, default=20, metavar="N", help="how many runs to list (default 20)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise StellaError(f"--limit must be at least 1, not {args.limit}")
    root = gitops.main_worktree_root(Path.cwd())
    ledger = StatePaths(root).fleet_db
    now_ms = wall_ms()
    show: Callable[..., None]
    if args.run_ref is None:
        document, show = views.runs_page(ledger, limit=args.limit, offset=0, now_ms=now_ms), print_runs
    elif not ledger.exists():
        raise StellaError(
            f"no fleet runs recorded yet (no ledger at {ledger}): start one with {views.START_HINT}"
        )
    else:
        document, show = views.load_run(ledger, args.run_ref, now_ms=now_ms), print_run
    if args.json:
        print(jsontext.dumps(document, indent=2))
    else:
        show(document, console=_console())
    return 0


def _console() -> Console:
    # rich on a terminal; plain text (no colour, no wrapping to a guessed width) when piped.
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, no_color=True, width=10_000, soft_wrap=True, force_terminal=False)


def _leases_text(facts: dict[str, Any]) -> str:
    """An attempt's locks and leased ports, as its line says them."""
    locks, ports = facts.get("locks") or [], facts.get("ports") or []
    return (f"  locks {', '.join(map(str, locks))}" if locks else "") + (
        f"  ports {' '.join(map(str, ports))}" if ports else ""
    )


def fmt_time(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def fmt_duration(ms: int | None) -> str:
    return "-" if ms is None else duration_text(ms / 1000, spaced=True)


def fmt_spend(run: dict[str, Any]) -> str:
    limit = run.get("spend_limit_usd")
    spent = money(run.get("spend_usd"))
    return f"{spent} (no limit)" if limit is None else f"{spent} / {money(limit)}"


def fmt_base(run: dict[str, Any]) -> str:
    parts = [run.get("base_ref") or "", f"@ {run['base_commit'][:10]}" if run.get("base_commit") else ""]
    return " ".join(p for p in parts if p) or "-"


def fmt_tasks(tasks: dict[str, int]) -> str:
    succeeded, failed, skipped = (tasks[status] for status in SETTLED_STATUSES)
    extra = [f"{tasks[k]} {k}" for k in OTHER_STATUSES if tasks.get(k)]
    return ", ".join([f"{succeeded} ok, {failed} failed, {skipped} skipped", *extra])


def fmt_task_counts(tasks: dict[str, int], no_commits: int = 0) -> str:
    """Compact: succeeded/failed/skipped, then what is still open, then the tasks that committed nothing."""
    text = "/".join(str(tasks[status]) for status in SETTLED_STATUSES)
    extra = [f"{tasks[k]} {k}" for k in OTHER_STATUSES if tasks.get(k)]
    if no_commits:
        extra.append(f"{no_commits} ok with 0 commits")
    return text + (f" ({', '.join(extra)})" if extra else "")


def fmt_needs_you(rows: Sequence[dict[str, Any]]) -> str:
    """`writer (retry), fleet/store-1b2c (ci-fix), painter (answer: stella answer 7)`: the run's requests
    that wait on a person."""
    return ", ".join(
        f"{row['task_id'] or row['branch']} ({row['reason']}"
        + (f": stella answer {row['id']})" if row["reason"] == FollowUpReason.ANSWER else ")")
        for row in rows
    )


def fmt_status(run: dict[str, Any]) -> str:
    if run.get("stale"):
        return f"{run['status']} (fleet gone)"
    return str(run["status"])


def in_colour(text: str, status: str | None = None) -> tuple[str, str]:
    """A piece of a line (core/terminal.styled) in the colour of a status."""
    return (text, STATUS_STYLE.get(status or "", ""))


def print_runs(page: dict[str, Any], *, console: Console) -> None:
    if not page["runs"]:
        where = "" if page["ledger_exists"] else f" (no ledger at {page['ledger']})"
        console.print(styled(f"No fleet runs recorded yet{where}. Start one with: {page['start_hint']}"))
        return
    headers = ("RUN", "STARTED", "DURATION", "STATUS", "OK/FAILED/SKIPPED", "SPEND", "PIPELINE", "BASE")
    rows = [
        (
            r["id"],
            fmt_time(r["created_at_ms"]),
            fmt_duration(r["duration_ms"]),
            fmt_status(r) + (f" (resumes {r['resumed_from']})" if r.get("resumed_from") else ""),
            fmt_task_counts(r["tasks"], len(r.get("no_commits") or ())),
            fmt_spend(r),
            r.get("pipeline") or "-",
            fmt_base(r),
        )
        for r in page["runs"]
    ]
    if console.is_terminal:
        table = Table(show_edge=False, pad_edge=False)
        for i, header in enumerate(headers):
            table.add_column(header, no_wrap=i in (0, 1, 2))
        for row, r in zip(rows, page["runs"], strict=True):
            table.add_row(
                *(styled(in_colour(cell, r["status"] if i == 3 else None)) for i, cell in enumerate(row))
            )
        console.print(table)
    else:
        for line in aligned([headers, *rows]):
            console.print(styled(line))
    shown = len(page["runs"])
    if page["total"] > shown:
        console.print(styled(f"({shown} of {page['total']} runs; --limit N shows more)"))


def print_run(detail: dict[str, Any], *, console: Console) -> None:
    run = detail["run"]
    out = console.print
    exit_code = f"  (exit {run['exit_code']})" if run.get("exit_code") is not None else ""
    out(styled((f"run {run['id']}", "bold"), "  ", in_colour(fmt_status(run), run["status"]), exit_code))
    facts = [
        ("started", fmt_time(run["created_at_ms"])),
        ("finished", fmt_time(run["finished_at_ms"]) if run["finished_at_ms"] else "still running"),
        ("duration", fmt_duration(run["duration_ms"])),
        ("tasks", fmt_tasks(run["tasks"])),
        ("spend", fmt_spend(run)),
        ("pipeline", run.get("pipeline") or "-"),
        ("base", fmt_base(run)),
        ("plan", run.get("plan_path") or "(inline prompts)"),
        ("concurrency", str(run.get("max_concurrency") or "-")),
        ("schedule", run.get("schedule") or ""),
        ("resumes", run.get("resumed_from") or ""),
        ("resumed by", ", ".join(run.get("resumed_by") or ())),
        ("command", run.get("command") or ""),
        ("reason", run.get("reason") or ""),
        ("needs you", fmt_needs_you(detail.get("needs_you") or ())),
    ]
    for key, value in facts:
        if value:
            out(styled(f"  {key:<12}{single_line(value)}"))
    for wave in detail["waves"]:
        _heading(console, "not scheduled" if wave["wave"] is None else f"wave {wave['wave']}")
        for task in wave["tasks"]:
            _print_task(console, task)
    if detail["branches"]:
        _heading(console, "branches")
        for b in detail["branches"]:
            worktree = f"  worktree {b['worktree']}" if b.get("worktree") else ""
            tasks = f"  tasks {', '.join(t for t in b['tasks'] if t) or '-'}  commits {b['commits']}"
            ci = f"  CI {_ci_text(b['ci'])}" if b.get("ci") else "  CI not watched"
            out(styled(f"  {b['branch']}{worktree}{tasks}{ci}"))
    _print_merges(console, detail.get("merges") or [])
    _print_train(console, detail.get("merge_batches") or [])
    _print_limits(console, detail.get("limits") or [])
    if detail["cleanups"]:
        _heading(console, "clean-up")
        for c in detail["cleanups"]:
            said = single_line(c.get("reason") or "")
            out(styled(f"  {fmt_time(c['at_ms'])}  {c['action']} {c['kind']} {c['target']}: {said}"))


def _heading(console: Console, title: str) -> None:
    """A blank line, then a section's title in bold."""
    console.print(styled(""))
    console.print(styled((title, "bold")))


def cached_text(attempt: dict[str, Any]) -> str:
    """` (cache: 1200 read, 300 written)` for an attempt with cached input tokens, else nothing."""
    read, written = attempt.get("cache_read_tokens") or 0, attempt.get("cache_write_tokens") or 0
    return f" (cache: {read} read, {written} written)" if read or written else ""


def _print_limits(console: Console, limits: list[dict[str, Any]]) -> None:
    """The provider limits the run's workers met, and the fleet's width as it changed."""
    if not limits:
        return
    _heading(console, "provider limits")
    for row in limits:
        if row["kind"] == "concurrency":
            text = f"  {fmt_time(row['at_ms'])}  fleet width {row['concurrency']}: {row.get('message') or ''}"
        else:
            where = f"task {row.get('task_id') or '-'} ({row['source']})"
            reset = f", resets {fmt_time(row['reset_at_ms'])}" if row.get("reset_at_ms") else ""
            said = row.get("message") or ""
            text = f"  {fmt_time(row['at_ms'])}  {row['kind']} limit in {where}{reset}: {said}"
        console.print(styled(text[:200]))


def _print_merges(console: Console, merges: list[dict[str, Any]]) -> None:
    """`stella merge`'s steps: each branch's outcome, its conflicted files or the check's last lines."""
    if not merges:
        return
    _heading(console, "merges")
    for m in merges:
        onto = f"  {m.get('strategy') or '-'} onto {m.get('onto_ref') or '-'}"
        reason = f": {single_line(m['reason'])}" if m.get("reason") else ""
        head = f"  {fmt_time(m['started_at_ms'])}  {m['branch']}  "
        console.print(styled(head, in_colour(str(m["status"]), str(m["status"])), onto, reason))
        if m.get("files"):
            console.print(styled(f"    files: {', '.join(m['files'])}"))
        if m.get("status") == "check_failed" and m.get("check_tail"):
            for tail in str(m["check_tail"]).splitlines()[-5:]:
                console.print(styled(f"    | {tail}"))


def _train_step(step: dict[str, Any]) -> str:
    kind = step.get("step")
    if kind == "check":
        return f"check {step['upto']} {'passed' if step['passed'] else 'failed'}"
    if kind == "bisect":
        return f"bisect {step['lo']}..{step['hi']} at {', '.join(map(str, step['points']))}"
    if kind == "land":
        return f"landed {len(step['branches'])} at {str(step['tip'])[:12]}"
    if kind == "evict":
        return f"evicted {step['branch']}"
    return f"retry {step.get('upto')}"


def _print_train(console: Console, batches: list[dict[str, Any]]) -> None:
    """The merge train: each batch, its window and members, what it did (checks, bisection, landings)."""
    if not batches:
        return
    _heading(console, "merge train")
    for b in batches:
        head = f"  batch {b['number']}  window {b['window']}  {len(b['members'])} branch(es)  "
        console.print(styled(head, in_colour(str(b.get("outcome") or "running"), str(b.get("outcome")))))
        console.print(styled(f"    {single_line(', '.join(b['members']))}"))
        steps = "; ".join(_train_step(step) for step in b.get("steps") or [])
        if steps:
            console.print(styled(f"    {single_line(steps)}"))


def _ci_text(ci: dict[str, Any]) -> str:
    reason = f"({ci['reason']})" if ci.get("reason") else None
    return " ".join(
        str(part) for part in (ci.get("state") or "?", ci.get("conclusion"), ci.get("pr_url"), reason) if part
    )


def _check_line(check: dict[str, Any]) -> Any:
    """`check after on 1a2b3c4d5e6f: exit 1 in 0.3 s: `make test`  failed  | its output's last line`."""
    passed = check["passed"]
    code = f"exit {check['exit_code']}" if check["exit_code"] is not None else "no exit"
    on = f" on {check['commit'][:12]}" if check.get("commit") else ""
    lines = (check.get("output_tail") or "").splitlines()
    last = next((line for line in reversed(lines) if line.strip()), "")
    text = f"      check {check['phase']}{on}: {code} in {check['duration_ms'] / 1000:.1f} s"
    said = f"  | {single_line(last)[:100]}" if last and not passed else ""
    shown = in_colour("passed" if passed else "failed", "succeeded" if passed else "failed")
    return styled(f"{text}: `{check['command']}`  ", shown, said)


def _print_task(console: Console, task: dict[str, Any]) -> None:
    pad = 2 * (task.get("depth") or 0)  # an emitted task is shown under the task that emitted it

    def out(line: Any) -> None:
        line.pad_left(pad)
        console.print(line)

    rest = f"  {task.get('isolation') or 'shared'}  {single_line(task.get('title') or '')}"
    if task.get("expands"):
        rest += "  (expands at run time)"
    if task.get("parent"):
        rest += f"  (emitted by {task['parent']})"
    out(styled(f"  {task['id']}  ", in_colour(task["status"], task["status"]), rest))
    if task.get("reason"):
        out(styled((f"    reason: {single_line(task['reason'])}", "yellow")))
    if task.get("stale"):
        out(styled((f"    stale: {single_line(task['stale'])}", "yellow")))
    if task.get("no_commits"):
        out(styled(("    no commits: it succeeded, but it committed nothing", "yellow")))
    if task.get("branch"):
        out(styled(f"    branch {task['branch']}  worktree {task.get('worktree') or '-'}"))
    if task.get("depends_on"):
        out(styled(f"    depends on {', '.join(task['depends_on'])}"))
    for a in task["attempts"]:
        said = {task.get("reason"), a.get("error")}  # a reason is shown once: the task's, else the error
        facts = (
            f"  {fmt_duration(a['duration_ms'])}  {money(a['spend_usd'])}  "
            f"{a['input_tokens']}/{a['output_tokens']} tokens{cached_text(a)}  {a['steps']} steps"
            + (f"  guard {money(a['guard_usd'])}" if a.get("guard_usd") is not None else "")
            + (f"  exit {a['exit_code']}" if a.get("exit_code") is not None else "")
            + (f"  ({single_line(a['reason'])})" if a.get("reason") not in {None, "", *said} else "")
            + (f"  setup {a['setup_ms'] / 1000:.1f} s" if a.get("setup_ms") is not None else "")
            + _leases_text(a.get("facts") or {})
        )
        out(styled(f"    attempt {a['number']} ", in_colour(str(a["outcome"]), str(a["outcome"])), facts))
        if a.get("start_commit"):
            parents = ", ".join(parent["task"] for parent in a.get("start_parents") or ()) or "-"
            out(styled(f"      start {a['start_commit'][:12]} (parents: {parents})"))
        if a.get("session"):
            out(styled(f"      session: {session_text(a['session'])}"))
        if a.get("summary"):
            out(styled(f"      summary: {single_line(a['summary'])}"))
        if a.get("error") and a["error"] != task.get("reason"):
            out(styled((f"      error: {single_line(a['error'])}", "red")))
        if a.get("salvage_sha"):
            saved = f"      salvaged: {a['salvage_ref']} ({a['salvage_sha'][:12]}); restore: "
            out(styled((saved, "yellow"), (a["salvage_restore"], "bold")))
        for check in a.get("checks") or ():
            out(_check_line(check))
    for c in task["commits"]:
        out(styled(f"    commit {c['sha'][:10]} {single_line(c.get('message') or '')}"))
    if task.get("ci"):
        out(styled(f"    CI {_ci_text(task['ci'])}"))


def session_text(session: dict[str, Any]) -> str:
    """An attempt's agent session: how it started (a follow-up's `resumed session ...`), else its id."""
    started = session.get("start")
    if started:
        return str(started)
    return f"{short_id(str(session.get('id') or '-'))} ({session.get('tokens') or 0:,} tokens at the end)"
