"""The `aider` pipeline: `aider --message-file` once, priced from its analytics log (docs/pipelines.md)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.core.limits import LimitKind, LimitReporter, from_http, from_text, limits_of
from stellafleet.core.spend import RunningTotal, SpendReporter, SpendTally, money
from stellafleet.core.terminal import one_line
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import indexlock
from stellafleet.git.lane import commit_paths
from stellafleet.pipelines.agentcli import AgentCliPipeline, CliSettings, prompt_file, scratch_dir
from stellafleet.pipelines.base import PipelineResult
from stellafleet.pipelines.clirun import CliRun, run_agent
from stellafleet.pipelines.sessions import Resume, fresh_after_failed_resume, session_fact
from stellafleet.pipelines.support import EventLines, FileTail, crash_text, failed, timeout_text

CLI = "aider"
APPLIED = re.compile(r"^Applied edit to (?P<path>.+?)\s*$")
RETRYING = re.compile(r".*Retrying in (\d+(?:\.\d+)?) seconds")


def build_argv(
    settings: CliSettings,
    prompt_path: Path,
    scratch: Path,
    model: str | None,
    history: Path | None = None,
    *,
    restore: bool = False,
) -> list[str]:
    """aider's command line; history: the task's chat history file, restored for a follow-up."""
    history = history or scratch / "aider-chat.md"
    argv = [
        settings.binary,
        "--message-file",  # not --message: one argument holds at most 128 KiB
        str(prompt_path),
        "--yes-always",
        "--no-auto-commits",
        "--no-dirty-commits",  # never commit what other workers left uncommitted
        "--no-gitignore",  # do not touch .gitignore in the user's tree
        "--no-suggest-shell-commands",  # with --yes-always they would run unasked
        "--no-pretty",
        "--no-stream",
        "--no-check-update",
        "--no-analytics",  # nothing leaves the machine; the local log below is still written
        "--analytics-log",
        str(scratch / "aider-analytics.jsonl"),
        "--chat-history-file",
        str(history),
        *(["--restore-chat-history"] if restore else []),
        "--input-history-file",
        str(scratch / "aider-input.txt"),
    ]
    if model:
        argv += ["--model", model]
    return argv + list(settings.extra_args)


class AnalyticsFollower(EventLines):
    """Reads new complete lines of aider's analytics log on each poll; reports each model call's cost."""

    kind = "event"

    def __init__(self, path: Path, spent: SpendTally) -> None:
        super().__init__()
        self.log = FileTail(path)
        self.spent = spent
        self.session = RunningTotal()  # aider's running total_cost
        self.context_tokens = 0  # the chat's size at its last model call

    def poll(self) -> str | None:
        lines = self.log.new_lines()
        if not lines:
            return None  # nothing complete yet: aider may be half-way through a line
        for raw in lines:
            self(raw)
        return self.spent.guard_reached("by its own cost report")

    def event(self, event: dict[str, Any]) -> None:
        if event["event"] != "message_send":
            return
        props = event.get("properties")
        props = props if isinstance(props, dict) else {}
        usd = self.session.step(_number(props.get("total_cost")), _number(props.get("cost")))
        prompt_tokens = _count(props.get("prompt_tokens"))
        completion_tokens = _count(props.get("completion_tokens"))
        self.spent.add(usd, input_tokens=prompt_tokens, output_tokens=completion_tokens, steps=1)
        self.context_tokens = prompt_tokens + completion_tokens


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)  # aider's analytics stringify anything that is not a number
    except ValueError:
        return None


class LimitLines:
    """aider's stdout, read for the limits litellm reports; a usage limit stops aider, the fleet decides."""

    def __init__(self, limits: LimitReporter | None) -> None:
        self.limits = limits
        self.collecting: list[str] | None = None
        self.told: set[str] = set()

    def __call__(self, line: str) -> str | None:
        if self.limits is None:
            return None
        if "RateLimitError" in line:
            self.collecting = []
        if self.collecting is None:
            return None
        self.collecting.append(line.strip())
        if not RETRYING.match(line.strip()) and len(self.collecting) < 8:
            return None
        text, self.collecting = " ".join(self.collecting), None
        retry = RETRYING.search(text)
        found = from_text(text.split("Retrying in")[0], source=CLI)
        if found is None or text in self.told:
            return None
        self.told.add(text)
        if found.kind is LimitKind.RATE and retry and found.reset_at_ms is None:
            found = from_http(None, float(retry.group(1)), text, source=CLI)
        if found is None:
            return None
        self.limits.limit(found)
        return f"usage limit reached ({found.reset_text()})" if found.kind is LimitKind.USAGE else None


def _count(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None and number >= 0 else 0


def edited_paths(run: CliRun) -> list[str]:
    """The files aider reports it edited, in order, once each."""
    matches = (APPLIED.match(line.strip()) for line in run.stdout_lines)
    return list(dict.fromkeys(match.group("path") for match in matches if match))


class AiderPipeline(AgentCliPipeline):
    name: ClassVar[str] = "aider"
    description: ClassVar[str] = "aider, one --message-file per task (cost from its analytics log)"
    default_binary: ClassVar[str] = "aider"
    display_name: ClassVar[str] = "aider"
    install_hint: ClassVar[str] = "pip install aider-chat"

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        settings = self.settings(config)
        scratch = scratch_dir(ctx)
        follower = AnalyticsFollower(scratch / "aider-analytics.jsonl", SpendTally.for_attempt(ctx, spend))
        resume = Resume.of(ctx.prompt)
        history = chat_history(ctx, resume)
        resumed = resume is not None and Path(resume.id) == history
        prompt = prompt_file(ctx, resume.prompt if resume is not None and resumed else ctx.prompt)
        argv = build_argv(settings, prompt, scratch, ctx.model or settings.model, history, restore=resumed)
        own = {"GIT_INDEX_FILE": str(private_index(ctx, scratch))} if ctx.shared else {}
        run = run_agent(ctx, argv, on_line=LimitLines(limits_of(spend)), poll=follower.poll, env=own)
        result = outcome(run, follower, ctx)
        if history.exists():  # the task's chat so far: a follow-up restores it
            result.facts["session"] = session_fact(str(history), ctx.workspace, follower.context_tokens)
        if resume is not None and not resumed:
            result.facts.update(fresh_after_failed_resume(resume, "its chat history file is gone"))
        return commit_edits(ctx, edited_paths(run), result) if result.success else result


def chat_history(ctx: WorkerContext, resume: Resume | None) -> Path:
    """The task's chat history file: the one a follow-up continues (an earlier run's too), else one per
    task of this run."""
    if resume is not None and Path(resume.id).is_file():
        return Path(resume.id)
    return ctx.paths.private / "pipelines" / ctx.run_id / f"{ctx.task_id}-aider-chat.md"


def private_index(ctx: WorkerContext, scratch: Path) -> Path:
    """A copy of the shared tree's index for aider's own git. aider `git add`s each file it creates: in the
    user's index it would ride along in the user's next commit; in a copy it stages nothing of theirs (and
    the git guard lets it through)."""
    copy = scratch / "index"
    real = indexlock.index_file(ctx.workspace)
    if real.exists():
        shutil.copyfile(real, copy)
    return copy


def outcome(run: CliRun, f: AnalyticsFollower, ctx: WorkerContext) -> PipelineResult:
    totals = f.spent.totals()
    edited = edited_paths(run)
    if run.stopped is not None:
        return failed(f"aider was stopped: {run.stopped}; its edits were left uncommitted", **totals)
    if run.timed_out:
        return failed(timeout_text(CLI, ctx.timeout_s, f.spent.usd), **totals)
    if run.start_error or (run.returncode or 0) != 0:
        return failed(crash_text(CLI, run), **totals)
    if f.bad_line is not None:
        sys.stderr.write(f"stella: aider's analytics log has a line that is not a JSON event: {f.bad_line}\n")
        return failed(
            f"could not parse aider output: its analytics log has a line that is not a JSON event: "
            f"{one_line(f.bad_line, 120)!r}",
            **totals,
        )
    calls = f.spent.steps  # one per model call
    if not calls:
        said = one_line(" ".join(run.stdout_lines[-8:]) or run.stderr_text(), 400)
        return failed(f"aider made no model call: {said or 'it printed nothing'}", **totals)
    cost = money(f.spent.usd)
    if edited:
        summary = f"aider edited {', '.join(edited)} in {calls} model call(s) ({cost})"
    else:
        summary = f"aider answered without editing files in {calls} model call(s) ({cost})"
    return PipelineResult(success=True, summary=summary, **totals)


def commit_edits(ctx: WorkerContext, paths: list[str], result: PipelineResult) -> PipelineResult:
    """Commit the files aider edited through the commit lane; a refusal fails the task, edits kept."""
    if not paths:
        return result
    try:
        sha = commit_paths(ctx, paths, f"{ctx.task_title or ctx.task_id} (aider)")
    except StellaError as exc:
        result.success = False
        said = str(exc).splitlines()[0].removeprefix("stella: error: ")  # a refusing hook's own words
        result.summary = f"{result.summary}; not committed: {said}"
        result.error = str(exc)
        return result
    result.summary = f"{result.summary}; committed {sha[:12]}"
    return result
