"""The `claude-code` pipeline: Claude Code headless (`claude -p`), its guard as `--max-budget-usd`."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.config import Config
from stellafleet.core.limits import from_http, limits_of
from stellafleet.core.spend import SpendReporter, SpendTally, money
from stellafleet.core.terminal import one_line
from stellafleet.core.workercontext import WorkerContext
from stellafleet.engine.anthropic import usage_of
from stellafleet.engine.transport import token_count
from stellafleet.pipelines import permit
from stellafleet.pipelines.agentcli import (
    AgentCliPipeline,
    CliSettings,
    agent_prompt,
    prompt_file,
    scratch_dir,
)
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.claude_hook import HookContext, edited_path, hook_settings
from stellafleet.pipelines.clirun import CliRun, run_agent
from stellafleet.pipelines.sessions import (
    ALLOWED,
    PARKED,
    Resume,
    fresh_after_failed_resume,
    session_fact,
    task_facts,
)
from stellafleet.pipelines.support import EventLines, crash_text, failed, parse_failure, timeout_text
from stellafleet.state.claims import ClaimStore, Holder

CLI = "claude"
CLI_NAME = "claude-code"  # the source of its limit events
# Print mode refuses shell commands that need approval: the commit instructions' are allowed up front.
SHARED_COMMANDS = ("Bash(stella commit:*)",)
ISOLATED_COMMANDS = ("Bash(stella commit:*)", "Bash(git add:*)", "Bash(git commit:*)", "Bash(git status:*)")


def permission_servers(state: Path) -> str:
    """The only MCP server Claude Code starts: stella's, which decides its permission requests."""
    argv = ["-m", "stellafleet.pipelines.permit", str(state)]
    return json.dumps(
        {"mcpServers": {permit.SERVER: {"type": "stdio", "command": sys.executable, "args": argv}}}
    )


def build_argv(
    ctx: WorkerContext, settings: CliSettings, budget: str | None, session: tuple[str, str] | None = None
) -> list[str]:
    """The command line; in a shared tree, with the settings that install the file-claiming hook;
    session: ("--session-id", a new id) or ("--resume", the id a follow-up continues). A tool request
    outside its allow-list goes to stella's permission server (pipelines/permit.py), which parks it."""
    allowed = SHARED_COMMANDS if ctx.shared else ISOLATED_COMMANDS
    # No prompt argument: with none, `claude -p` reads the prompt from stdin, which has no size limit.
    argv = [
        settings.binary,
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",  # stream-json needs it in print mode
        "--permission-mode",
        "acceptEdits",
        "--strict-mcp-config",
        "--mcp-config",
        permission_servers(scratch_dir(ctx)),
        "--permission-prompt-tool",
        permit.PROMPT_TOOL,
        "--allowedTools",
        ",".join(allowed),
    ]
    if ctx.shared:
        argv += ["--settings", str(write_hook_settings(ctx))]
    if budget is not None:
        argv += ["--max-budget-usd", budget]
    if settings.max_turns is not None:
        argv += ["--max-turns", str(settings.max_turns)]
    if session is not None:
        argv += list(session)
    model = ctx.model or settings.model
    if model:
        argv += ["--model", model]
    return argv + list(settings.extra_args)


def denial_note(result: dict[str, Any]) -> str:
    denials = result.get("permission_denials")
    if not isinstance(denials, list) or not denials:
        return ""
    shown = [denial for denial in denials[:3] if isinstance(denial, dict)]
    names = [f"{denial.get('tool_name', '?')} {edited_path(denial) or ''}".strip() for denial in shown]
    more = f" and {len(denials) - 3} more" if len(denials) > 3 else ""
    return f" ({len(denials)} tool call(s) refused: {', '.join(names)}{more})"


def interpret(result: dict[str, Any], tally: SpendTally, *, max_turns: int | None) -> PipelineResult:
    """Claude Code's final `result` message as a PipelineResult, its spend reported into tally."""
    cost = result.get("total_cost_usd")
    usd = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else 0.0
    usage = usage_of(result.get("usage"))
    turns = token_count(result.get("num_turns"))
    tally.add(usd, steps=turns, **usage.to_json())
    totals = tally.totals()
    subtype = str(result.get("subtype") or "")
    raw_text = result.get("result")
    text = raw_text if isinstance(raw_text, str) else ""
    raw_errors = result.get("errors")
    errors = [str(e) for e in raw_errors if str(e).strip()] if isinstance(raw_errors, list) else []
    detail = one_line("; ".join(errors) or text or "", 300) or "no details"
    note = denial_note(result)
    spent = f"{money(usd)} spent in {turns} turn(s)"
    if subtype == "success" and not result.get("is_error"):
        summary = one_line(text, 2000) or f"Claude Code finished ({spent})"
        return PipelineResult(success=True, summary=summary + note, **totals)
    if subtype == "success":
        return failed(f"Claude Code reported an error: {detail} ({spent})", **totals)
    if subtype == "error_max_budget_usd":
        of_guard = f" of {tally.guard_text()}" if tally.guarded else ""
        return failed(f"Claude Code stopped at its spend guard{of_guard}: {spent}{note}", **totals)
    if subtype == "error_max_turns":
        limit = f" ({max_turns})" if max_turns is not None else ""
        return failed(
            f"Claude Code stopped at its turn limit{limit} before finishing: {spent}{note}", **totals
        )
    if subtype == "error_during_execution":
        return failed(f"Claude Code failed during execution: {detail} ({spent})", **totals)
    return failed(f"Claude Code ended with {subtype or 'no subtype'}: {detail} ({spent})", **totals)


class _ResultWatcher(EventLines):
    """Keeps the last `result` message of the stream, and tells the fleet of each limit Claude Code met."""

    result: dict[str, Any] | None = None
    context_tokens = 0  # the session's size after its last model call: what a resume would send again
    last_words = ""  # the text of its last message

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "result":
            self.result = event
        if kind == "assistant" and isinstance(event.get("message"), dict):
            blocks = event["message"].get("content")
            said = [b.get("text") for b in blocks or () if isinstance(b, dict) and b.get("type") == "text"]
            self.last_words = " ".join(str(text) for text in said if text) or self.last_words
            usage = event["message"].get("usage")
            if isinstance(usage, dict):
                counted = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
                self.context_tokens = sum(token_count(usage.get(key)) for key in (*counted, "output_tokens"))
        if self.limits is None:
            return
        found = None
        if kind == "system" and event.get("subtype") == "api_retry":
            delay = event.get("retry_delay_ms")
            wait = delay / 1000 if isinstance(delay, int | float) else None
            found = from_http(
                _status(event.get("error_status")), wait, str(event.get("error") or ""), source=CLI_NAME
            )
        elif kind == "result" and event.get("api_error_status") is not None:
            text = f"{event.get('api_error_type') or ''} {event.get('result') or ''}"
            found = from_http(_status(event.get("api_error_status")), None, text, source=CLI_NAME)
        if found is not None:
            self.limits.limit(found)


def _status(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ClaudeCodePipeline(AgentCliPipeline):
    name: ClassVar[str] = "claude-code"
    description: ClassVar[str] = "Claude Code, headless (claude -p, stream-json, --max-budget-usd)"
    default_binary: ClassVar[str] = "claude"
    display_name: ClassVar[str] = "Claude Code"
    install_hint: ClassVar[str] = "npm install -g @anthropic-ai/claude-code"

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """The CLI, and the MCP SDK its permission server is built on (pipelines/permit.py)."""
        if importlib.util.find_spec("mcp") is None:
            why = "its permission server needs it"
            return f"pipeline {self.name}: the mcp package is missing ({why}): pip install mcp"
        return super().preflight(config, spend_limited=spend_limited, model=model)

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        settings = self.settings(config)
        tally = SpendTally.for_attempt(ctx, spend)
        hand_allowed(ctx)
        resume = Resume.of(ctx.prompt)
        if resume is None:
            return self._fresh(ctx, settings, tally, spend)
        why = "its file is gone"
        if carry_session(resume, ctx.workspace):
            watcher = _ResultWatcher(limits_of(spend))
            argv = build_argv(ctx, settings, tally.cli_budget(), ("--resume", resume.id))
            run = run_agent(ctx, argv, on_line=watcher, stdin_path=prompt_file(ctx, resume.prompt))
            if watcher.result is not None or not gone(run):
                result = self.outcome(run, watcher, ctx, settings.max_turns, tally)
                return parked_result(ctx, watcher, result, resume.id)
            why = "Claude Code did not find it"
        fresh = self._fresh(ctx, settings, tally, spend)
        fresh.facts.update(fresh_after_failed_resume(resume, why))
        return fresh

    def _fresh(
        self, ctx: WorkerContext, settings: CliSettings, tally: SpendTally, spend: SpendReporter
    ) -> PipelineResult:
        """A new session, given its id up front (a follow-up can resume it even if this one is killed)."""
        session = str(uuid.uuid4())
        argv = build_argv(ctx, settings, tally.cli_budget(), ("--session-id", session))
        watcher = _ResultWatcher(limits_of(spend))
        prompt = prompt_file(ctx, agent_prompt(ctx))
        run = run_agent(ctx, argv, on_line=watcher, stdin_path=prompt)
        result = self.outcome(run, watcher, ctx, settings.max_turns, tally)
        result.facts.setdefault("session", session_fact(session, ctx.workspace, watcher.context_tokens))
        return parked_result(ctx, watcher, result, session)

    @staticmethod
    def outcome(
        run: CliRun, watcher: _ResultWatcher, ctx: WorkerContext, max_turns: int | None, tally: SpendTally
    ) -> PipelineResult:
        if watcher.result is not None:
            result = interpret(watcher.result, tally, max_turns=max_turns)
            if isinstance(watcher.result.get("session_id"), str):  # a follow-up may go on in it
                session_id = watcher.result["session_id"]
                result.facts["session"] = session_fact(session_id, ctx.workspace, watcher.context_tokens)
            if run.timed_out:  # it reported, then hung on the way out
                text = f"{timeout_text(CLI, ctx.timeout_s)} after reporting: {result.summary}"
                return failed(text, **tally.totals())
            return result
        if run.timed_out:
            return failed(
                timeout_text(CLI, ctx.timeout_s) + "; no result was reported, so its spend is unknown"
            )
        if run.start_error or (run.returncode or 0) != 0:
            return failed(crash_text(CLI, run))
        if watcher.bad_line is not None:
            return failed(parse_failure(CLI, f"not a JSON line: {one_line(watcher.bad_line, 120)!r}", run))
        return failed(parse_failure(CLI, f"no result message among {watcher.events} message(s)", run))


def write_hook_settings(ctx: WorkerContext) -> Path:
    """Write the hook's context and the settings file that installs it; returns the settings path. From
    here on the attempt's hooks report its write spans."""
    holder = Holder.current(ctx.run_id, ctx.task_id, ctx.task_title, ctx.attempt_id)
    with ClaimStore.open(ctx.paths.store_db) as store:
        store.report_spans(ctx.run_id, ctx.attempt_id)
    scratch = scratch_dir(ctx)
    context_file = scratch / "claude-hook.json"
    HookContext(str(ctx.workspace), str(ctx.paths.store_db), holder).write(context_file)
    settings_file = scratch / "claude-settings.json"
    settings_file.write_text(json.dumps(hook_settings(context_file), indent=2))
    return settings_file


def gone(run: CliRun) -> bool:
    """Whether `claude --resume` ended because it found no such session."""
    return "No conversation found" in run.stderr_text(4000) + " ".join(run.stdout_lines[-5:])


def project_dir(config_dir: Path, cwd: str) -> Path:
    """Where Claude Code keeps the sessions made in cwd: its projects folder, the path's every character
    other than a letter or digit a dash."""
    return config_dir / "projects" / re.sub(r"[^A-Za-z0-9]", "-", cwd)


def claude_config_dir(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else Path(env.get("HOME") or Path.home()) / ".claude"


def carry_session(resume: Resume, workspace: Path, env: Mapping[str, str] | None = None) -> bool:
    """Claude Code finds a session only in the folder of the directory it was made in: one made in another
    directory (an earlier run's worktree) is copied to this one's. False when its file is nowhere."""
    config_dir = claude_config_dir(os.environ if env is None else env)
    here = project_dir(config_dir, str(workspace)) / f"{resume.id}.jsonl"
    if here.exists():
        return True
    made = project_dir(config_dir, resume.cwd) / f"{resume.id}.jsonl" if resume.cwd else None
    found = made if made is not None and made.exists() else None
    if found is None:
        found = next(iter(sorted((config_dir / "projects").glob(f"*/{resume.id}.jsonl"))), None)
    if found is None:
        return False
    here.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(found, here)
    return True


def hand_allowed(ctx: WorkerContext) -> None:
    """What a person allowed the task, for the permission server to allow (pipelines/permit.py)."""
    allowed = task_facts().get(ALLOWED)
    (scratch_dir(ctx) / permit.ALLOWED_FILE).write_text(
        json.dumps(allowed if isinstance(allowed, list) else [])
    )


def parked_result(
    ctx: WorkerContext, watcher: _ResultWatcher, result: PipelineResult, session: str
) -> PipelineResult:
    """The attempt's result, parked (the fleet's Park step ends it so) when it asked for a permission: the
    permission server refused it for now and interrupted Claude Code's turn, which ended with its cost."""
    try:
        asked = json.loads((scratch_dir(ctx) / permit.PARK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return result
    result.success = False
    result.summary = result.error = f"parked: it wants to use {asked.get('tool')}"
    parked = {
        "kind": "tool",
        "tool": asked.get("tool"),
        "input": asked.get("input"),
        "last_words": watcher.last_words,
    }
    result.facts[PARKED] = parked
    result.facts.setdefault("session", session_fact(session, ctx.workspace, watcher.context_tokens))
    return result
