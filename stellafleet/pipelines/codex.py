"""The `codex` pipeline: `codex exec --json`, priced as its token totals arrive (docs/pipelines.md), with
what it needs beyond that: writable git roots and its session log."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.config import Config
from stellafleet.core.errors import GitError
from stellafleet.core.limits import LimitReporter, from_text, limits_of
from stellafleet.core.pricing import Pricer, TokenUsage, price_for, unknown_price_message
from stellafleet.core.spend import SpendReporter, SpendTally, money
from stellafleet.core.terminal import one_line
from stellafleet.core.workercontext import WorkerContext
from stellafleet.engine.transport import token_count
from stellafleet.git import gitops
from stellafleet.pipelines.agentcli import AgentCliPipeline, CliSettings, agent_env, agent_prompt, prompt_file
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.clirun import CliRun, run_agent
from stellafleet.pipelines.sessions import Resume, fresh_after_failed_resume, session_fact
from stellafleet.pipelines.support import (
    EventLines,
    FileTail,
    crash_text,
    failed,
    json_line,
    parse_failure,
    timeout_text,
)
from stellafleet.state.claims import ClaimStore


def writable_roots_arg(workspace: Path) -> list[str]:
    """`-c sandbox_workspace_write.writable_roots=[...]` for the git dirs a commit in workspace writes to."""
    try:  # the common dir first; [] outside git
        flags = ("--git-common-dir", "--git-dir")
        dirs = dict.fromkeys(str(gitops.git_path(workspace, "--path-format=absolute", f)) for f in flags)
    except GitError:
        return []
    # A JSON string is a TOML basic string, which is how `-c` parses the value.
    return ["-c", f"sandbox_workspace_write.writable_roots=[{', '.join(json.dumps(d) for d in dirs)}]"]


def codex_home(env: Mapping[str, str]) -> Path:
    """Where Codex keeps its sessions: $CODEX_HOME, else ~/.codex."""
    home = env.get("CODEX_HOME")
    return Path(home) if home else Path(env.get("HOME") or os.path.expanduser("~")) / ".codex"


def token_total(raw: str, key: str = "total_token_usage") -> dict[str, Any] | None:
    """The thread's running usage from one session-log line, when it is a `token_count` event (key
    `last_token_usage`: its last model call's, whose input is the thread's context then)."""
    record = json_line(raw)
    payload = record.get("payload") if record is not None else None
    if not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get(key) if isinstance(info, dict) else None
    return total if isinstance(total, dict) else None


CLI = "codex"
# Items that are the agent doing something (as opposed to talking or thinking): each counts as a step.
ACTION_ITEMS = {"command_execution", "file_change", "mcp_tool_call", "web_search"}
MESSAGE_ITEMS = {"agent_message", "assistant_message"}  # the latter is the older name
# Items that can write the tree: a command, a patch Codex applies, an MCP server's tool (it may edit files).
WRITING_ITEMS = {"command_execution", "file_change", "mcp_tool_call"}


# Web search and sub-agents off (not priced or counted); no login shell, which would reset PATH.
HEADLESS = ["-c", 'web_search="disabled"', "--disable", "multi_agent", "-c", "allow_login_shell=false"]


def build_argv(
    settings: CliSettings, workspace: Path, model: str | None, resume: str | None = None
) -> list[str]:
    """`codex exec`, or with resume `codex exec ... resume <thread id>` (a follow-up in the same thread)."""
    argv = [settings.binary, "exec", "--json", "--sandbox", "workspace-write", "-C", str(workspace)]
    if model:
        argv += ["--model", model]
    thread = ["resume", resume] if resume is not None else []
    # "-": the prompt is read from stdin (one argument holds at most 128 KiB)
    return [*argv, *writable_roots_arg(workspace), *HEADLESS, *settings.extra_args, *thread, "-"]


# A running total of Codex's usage, as it counts tokens: its input_tokens include the cached ones.
USAGE_COUNTS = ("input_tokens", "cached_input_tokens", "output_tokens")
Usage = tuple[int, ...]  # its USAGE_COUNTS


def usage_total(value: Any) -> Usage:
    """A usage object's counts; ValueError when it is not one."""
    if not isinstance(value, dict):
        raise ValueError(f"turn.completed without a usage object: {value!r}")
    counts = tuple(value.get(key, 0) for key in USAGE_COUNTS)
    for key, number in zip(USAGE_COUNTS, counts, strict=True):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(f"usage.{key} is not a token count: {number!r}")
    return counts


def item_of(event: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """An `item.*` event's item and its type (older Codex said `item_type`); ({}, None) for other events."""
    item = event.get("item")
    if not isinstance(item, dict):
        return {}, None
    kind = item.get("type") or item.get("item_type")
    return item, kind if isinstance(kind, str) else None


class WriteSpans:
    """A shared Codex worker's write spans (state/claims.py), from its item events as they are read.

    A writing item's span closes when its `item.completed` is read. It opens not at its own first event but
    at the last line read before it that no writing item sent: Codex announces a command after starting it
    (0.169 printed `item.started` of `printf x > c.txt` 40 ms after c.txt was written), and it may run the
    calls of one model answer together or back to back, each announced late. The other lines
    (`turn.started`, a message, a reasoning summary) come before the answer's calls run, so calls with no
    such line between them share one start. An item never completed (a command still running when the
    worker ended) keeps its span open, which covers it to the attempt's end."""

    def __init__(self, store_db: Path, run_id: str, attempt_id: int, clock: Callable[[], int] = time.time_ns):
        self.store_db, self.run_id, self.attempt_id = store_db, run_id, attempt_id
        self.clock = clock
        self.since_ns = clock()  # until Codex prints a line: from its start
        self.opened: set[str] = set()
        with ClaimStore.open(store_db) as store:
            store.report_spans(run_id, attempt_id)

    def seen(self, event: dict[str, Any]) -> None:
        """One event, as it is read."""
        now = self.clock()
        item, kind = item_of(event)
        if kind not in WRITING_ITEMS:
            self.since_ns = now
            return
        name = f"codex-{item.get('id') or f'unnamed-{now}'}"  # no id: its span is its own, never matched
        completed = event.get("type") == "item.completed"
        if name in self.opened and not completed:
            return  # an update of a running item
        with ClaimStore.open(self.store_db) as store:
            if name not in self.opened:
                self.opened.add(name)
                store.open_span(self.run_id, self.attempt_id, name, self.since_ns)
            if completed:
                store.close_span(self.run_id, self.attempt_id, name, now)


class CodexFollower(EventLines):
    """Reads `codex exec --json` events as they arrive, reports spend, and says when to stop."""

    kind = "type"

    def __init__(
        self,
        pricer: Pricer | None,
        spent: SpendTally,
        limits: LimitReporter | None,
        home: Path,
        spans: WriteSpans | None = None,
    ) -> None:
        super().__init__(limits)
        self.home = home  # where Codex keeps its session logs
        self.spans = spans  # in the shared tree: when it could write
        self.pricer = pricer
        self.spent = spent
        self.total: Usage = (0, 0, 0)
        self.steps = 0  # actions seen, reported once at the end (they cost nothing by themselves)
        self.turns_completed = 0
        self.turn_failed: str | None = None
        self.errors: list[str] = []
        self.last_message = ""
        self.thread_id: str | None = None
        self.context_tokens = 0  # the thread's size after its last model call (its session log's)
        self.session = FileTail()  # the thread's session log, once Codex has said the thread's id
        self.from_log = False  # the session log is being followed: turn totals only top it up
        self._limits_told: set[str] = set()
        self._lock = threading.Lock()

    def event(self, event: dict[str, Any]) -> str | None:
        with self._lock:
            if self.spans is not None:
                self.spans.seen(event)
            kind = event["type"]
            if kind == "thread.started" and isinstance(event.get("thread_id"), str):
                self.thread_id = event["thread_id"]
            elif kind == "item.completed":
                item, item_type = item_of(event)
                if item_type in MESSAGE_ITEMS and isinstance(item.get("text"), str):
                    self.last_message = item["text"]
                elif item_type in ACTION_ITEMS:
                    self.steps += 1
            elif kind == "turn.completed":
                self.turns_completed += 1
                return self._usage(usage_total(event.get("usage")))
            elif kind == "turn.failed":
                error = event.get("error")
                message = error.get("message") if isinstance(error, dict) else error
                self.turn_failed = str(message or "no details")
                self._limit(self.turn_failed)
            elif kind == "error":
                self.errors.append(str(event.get("message") or "no details"))
                self._limit(self.errors[-1])
            return None

    def _limit(self, message: str) -> None:
        """Tell the fleet of a rate or usage limit Codex reports (`last status: 429`, `usage limit`), once."""
        if self.limits is None or message in self._limits_told:
            return
        found = from_text(message, source=CLI)
        if found is not None:
            self._limits_told.add(message)
            self.limits.limit(found)

    def poll(self) -> str | None:
        """Follow the thread's session log: every `token_count` total in it goes to log_total."""
        if self.session.path is None and self.thread_id:
            self.session.path = thread_log(self.home, self.thread_id)
        reason = None
        for raw in self.session.new_lines():  # none while Codex is half-way through a line
            total, last = token_total(raw), token_total(raw, "last_token_usage")
            if total is not None:
                reason = self.log_total(total) or reason
            if last is not None:
                self.context_tokens = sum(token_count(last.get(k)) for k in ("input_tokens", "output_tokens"))
        return reason

    def log_total(self, value: dict[str, Any]) -> str | None:
        """A running total from Codex's session log (after each model call)."""
        with self._lock:
            self.from_log = True
            try:
                return self._usage(usage_total(value))
            except ValueError:
                return None

    def _usage(self, total: Usage) -> str | None:
        grew = all(now >= then for now, then in zip(total, self.total, strict=True))
        if self.from_log and not grew:
            return None  # already counted from the session log
        # what this running total adds to the last one (all of it when the counts went down)
        added = tuple(now - then for now, then in zip(total, self.total, strict=True)) if grew else total
        self.total = total
        input_tokens, cached, output_tokens = added
        tokens = TokenUsage(input_tokens, output_tokens, min(cached, input_tokens))  # the price table's way
        usd = self.pricer.cost(tokens) if self.pricer is not None else 0.0
        self.spent.add(usd, **tokens.to_json())
        return self.spent.guard_reached("priced from its token usage")


class CodexPipeline(AgentCliPipeline):
    name: ClassVar[str] = "codex"
    description: ClassVar[str] = "OpenAI Codex CLI (codex exec --json), priced from its token usage"
    default_binary: ClassVar[str] = "codex"
    display_name: ClassVar[str] = "Codex"
    install_hint: ClassVar[str] = "npm install -g @openai/codex"

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        problem = super().preflight(config)
        if problem is not None:
            return problem
        model = model or self.settings(config).model
        try:
            pricer = price_for(model, config) if model else None
        except Exception as exc:  # a malformed [prices] table is a config problem to report, not a crash
            return f"pipeline {self.name}: {exc}"
        if spend_limited and pricer is None:
            return f"pipeline {self.name}: {self.no_price(model, config.settings_file)}"
        return None

    def no_price(self, model: str | None, settings_file: str = ".stella/config.toml") -> str:
        """Why Codex cannot run under a spend limit without a price, and how to set one."""
        why = (
            unknown_price_message(model, settings_file)
            if model
            else f"no model is set to price its token usage with: set [pipelines.{self.name}] model"
        )
        return f"it has no budget flag of its own and {why}"

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        settings = self.settings(config)
        model = ctx.model or settings.model  # the task's own model first; None lets Codex choose
        pricer = price_for(model, config) if model else None
        tally = SpendTally.for_attempt(ctx, spend)
        if tally.guarded and pricer is None:
            return failed(f"codex was not started: {self.no_price(model)}")
        spans = WriteSpans(ctx.paths.store_db, ctx.run_id, ctx.attempt_id) if ctx.shared else None
        follower = CodexFollower(pricer, tally, limits_of(spend), codex_home(agent_env(ctx)), spans)
        resume, gone = Resume.of(ctx.prompt), {}
        log = thread_log(follower.home, resume.id) if resume is not None else None
        if resume is not None and log is None:  # a new thread, and the attempt says why
            gone, resume = fresh_after_failed_resume(resume, "its session log is gone"), None
        if log is not None:  # the thread's usage so far was the earlier attempts' spend
            follower.total = last_total(log)
        argv = build_argv(settings, ctx.workspace, model, resume.id if resume else None)
        prompt = prompt_file(ctx, resume.prompt if resume else agent_prompt(ctx))
        run = run_agent(ctx, argv, on_line=follower, poll=follower.poll, stdin_path=prompt)
        if follower.steps:
            tally.add(0.0, steps=follower.steps)
        # what it left uncommitted, the worker commits (worker/main.py commit_leftovers)
        result = outcome(run, follower, ctx, priced=pricer is not None, model=model)
        if follower.thread_id is not None:  # a follow-up may go on in it (`codex exec resume`)
            tokens = follower.context_tokens or follower.total[0]
            result.facts["session"] = session_fact(follower.thread_id, ctx.workspace, tokens)
        result.facts.update(gone)
        return result


def last_total(log: Path) -> Usage:
    """The thread's running usage as its session log last recorded it."""
    totals = (token_total(raw) for raw in log.read_text(encoding="utf-8", errors="replace").splitlines())
    found = [total for total in totals if total is not None]
    try:
        return usage_total(found[-1]) if found else (0, 0, 0)
    except ValueError:
        return (0, 0, 0)


def thread_log(home: Path, thread_id: str) -> Path | None:
    """The session log Codex keeps of a thread (None: it is gone, so it cannot be resumed)."""
    matches = sorted((home / "sessions").glob(f"*/*/*/rollout-*{thread_id}.jsonl"))
    return matches[-1] if matches else None


def outcome(
    run: CliRun, f: CodexFollower, ctx: WorkerContext, *, priced: bool, model: str | None
) -> PipelineResult:
    totals = f.spent.totals()
    if run.stopped is not None:
        what = f.last_message and f"; its last message: {one_line(f.last_message, 200)}"
        return failed(f"codex was stopped: {run.stopped}{what or ''}", **totals)
    if run.timed_out:
        return failed(timeout_text(CLI, ctx.timeout_s, f.spent.usd), **totals)
    if f.turn_failed is not None:
        return failed(f"codex turn failed: {one_line(f.turn_failed, 300)}", **totals)
    if f.turns_completed and (run.returncode or 0) == 0:
        summary = one_line(f.last_message, 2000) or f"codex finished ({money(f.spent.usd)} spent)"
        if not priced:
            summary += f" (spend not priced: no price known for {model or 'its model'})"
        return PipelineResult(success=True, summary=summary, **totals)
    if f.errors:
        return failed(f"codex reported an error: {one_line(f.errors[-1], 300)}", **totals)
    if run.start_error or (run.returncode or 0) != 0:
        return failed(crash_text(CLI, run), **totals)
    if f.bad_line is not None:
        return failed(parse_failure(CLI, f"not a JSON event: {one_line(f.bad_line, 120)!r}", run), **totals)
    return failed(parse_failure(CLI, f"no turn.completed among {f.events} event(s)", run), **totals)
