"""The `command` pipeline: each task runs a shell command from the config (docs/pipelines.md)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.config import Config
from stellafleet.core.paths import NotRegularFile, read_regular
from stellafleet.core.spend import SpendReporter, check_usd
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.pipelines.base import PipelineResult, read_amounts
from stellafleet.proc import runner

RESULT_ENV = "STELLA_COMMAND_RESULT"
SHELL = "/bin/sh"


def _read_report(path: Path) -> dict[str, Any]:
    try:
        text = read_regular(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    except NotRegularFile:
        raise ValueError(f"{RESULT_ENV} file is not a regular file (a FIFO, a device or a socket)") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{RESULT_ENV} file is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{RESULT_ENV} file must hold a JSON object, not {type(data).__name__}")
    return data


def command_report_path(ctx: WorkerContext) -> Path:
    """The file the task's command may write its result to (STELLA_COMMAND_RESULT)."""
    return ctx.result_path.with_name(ctx.result_path.stem + ".command.json")


def reported_usd(ctx: WorkerContext) -> float:
    """The dollars the command wrote to its result file (0: none); the fleet reads it too."""
    try:
        report = _read_report(command_report_path(ctx))
        return check_usd(report.get("spend_usd") or 0)
    except (OSError, ValueError):
        return 0.0


class CommandPipeline:
    name: ClassVar[str] = "command"
    description: ClassVar[str] = "runs a shell command per task ([pipelines.command] run in the config)"

    def preflight(self, config: Config) -> str | None:
        if config.pipelines.command.command_for("") is None and not config.pipelines.command.tasks:
            return (
                f"the command pipeline has no command: set it in {config.settings_file} as\n"
                '  [pipelines.command]\n  run = "your-command --prompt \\"$STELLA_PROMPT\\""'
            )
        return None

    def version(self) -> str | None:
        return None

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        command = config.pipelines.command.command_for(ctx.task_id)
        if command is None:
            text = f'no command for task "{ctx.task_id}": set [pipelines.command] run in the config'
            return PipelineResult(success=False, summary=text, error=text)
        report_path = command_report_path(ctx)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.unlink(missing_ok=True)
        env = {**os.environ, **ctx.to_env(), RESULT_ENV: str(report_path)}
        last_line = ""
        # The worker's own child, in its group: stopping the worker's tree stops the command with it.
        argv = [SHELL, "-c", command]
        with runner.start(argv, cwd=ctx.workspace, env=env, stderr=runner.STDOUT, session=False) as proc:
            assert proc.stdout is not None
            for raw in proc.stdout:  # copied to the worker's log as it comes
                text = raw.decode(errors="replace")
                sys.stdout.write(text)
                sys.stdout.flush()
                line = text.strip()
                if line:
                    last_line = line
            returncode = proc.wait()
        return conclude(returncode, report_path, committed_summary(ctx, last_line), spend)


FULL_SHA = re.compile(r"[0-9a-f]{40}")


def committed_summary(ctx: WorkerContext, line: str) -> str:
    """The summary a last output line makes: a SHA of a commit the task made says `committed ...`."""
    if not FULL_SHA.fullmatch(line) or line == ctx.base_commit:
        return line
    subject = gitops.commit_subject(ctx.workspace, line)
    if subject is None or gitops.is_ancestor(ctx.workspace, line, ctx.base_commit):
        return line
    return f"committed {line[:12]} {subject}"


def conclude(returncode: int, report_path: Path, last_line: str, spend: SpendReporter) -> PipelineResult:
    """The result of a command that exited with returncode, from its report and its last output line."""
    try:
        report = _read_report(report_path)
    except ValueError as exc:
        return PipelineResult(success=False, summary=str(exc), error=str(exc))
    problems: list[str] = []
    usd, tokens_in, tokens_out, steps = read_amounts(report, problems, f"{RESULT_ENV}: ")
    if usd or tokens_in or tokens_out or steps:
        spend.add(usd, input_tokens=tokens_in, output_tokens=tokens_out, steps=steps)
    if problems:
        text = "; ".join(problems)
        return PipelineResult(False, text, text, usd, tokens_in, tokens_out, steps)
    summary = str(report.get("summary") or last_line or "")
    if returncode == 0:
        return PipelineResult(True, summary or "command succeeded", None, usd, tokens_in, tokens_out, steps)
    error = f"command failed: {runner.signal_description(returncode)}"
    return PipelineResult(False, summary or error, error, usd, tokens_in, tokens_out, steps)
