"""The `command` pipeline: each task runs a shell command from the config.

    [pipelines.command]
    run = "make -C $STELLA_WORKSPACE fix PROMPT=\"$STELLA_PROMPT\""

    [pipelines.command.tasks.docs]      # optional per-task command
    run = "./scripts/rewrite-docs.sh"

The command runs through /bin/sh in the task's workspace with the task in its environment (STELLA_PROMPT,
STELLA_TASK_ID, STELLA_RUN_ID, STELLA_WORKSPACE, STELLA_SPEND_GUARD, ...). It may write a JSON object to
the file named by STELLA_COMMAND_RESULT: {"spend_usd": 0.12, "summary": "...", "input_tokens": 10,
"output_tokens": 20, "steps": 3}; the dollars are reported as the task's spend. Exit status 0 is success;
the summary is the result file's, else the last non-empty line of output.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendReporter
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult

RESULT_ENV = "STELLA_COMMAND_RESULT"
SHELL = "/bin/sh"


def command_for(config: Config, task_id: str) -> str | None:
    """The task's own command when configured, else the pipeline's."""
    return config.pipelines.command.command_for(task_id)


def _signal_text(returncode: int) -> str:
    from stellafleet.proc.tree import signal_description

    return signal_description(returncode)


def _read_report(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{RESULT_ENV} file is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{RESULT_ENV} file must hold a JSON object, not {type(data).__name__}")
    return data


def _number(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key, 0) or 0
    # json reads NaN and Infinity too; neither is an amount the ledger can add up
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{RESULT_ENV}: {key} must be a non-negative number, not {value!r}")
    return kind(value)


class CommandPipeline:
    name: ClassVar[str] = "command"
    description: ClassVar[str] = "runs a shell command per task ([pipelines.command] run in the config)"

    def preflight(self, config: Config) -> str | None:
        if command_for(config, "") is None and not config.pipelines.command.tasks:
            return (
                "the command pipeline has no command: set it in .stella/config.toml as\n"
                '  [pipelines.command]\n  run = "your-command --prompt \\"$STELLA_PROMPT\\""'
            )
        return None

    def version(self) -> str | None:
        return None

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        command = command_for(config, ctx.task_id)
        if command is None:
            text = f'no command for task "{ctx.task_id}": set [pipelines.command] run in the config'
            return PipelineResult(success=False, summary=text, error=text)
        report_path = report_path_for(ctx)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.unlink(missing_ok=True)
        env = {**os.environ, **ctx.to_env(), RESULT_ENV: str(report_path)}
        last_line = ""
        with subprocess.Popen(
            [SHELL, "-c", command],
            cwd=str(ctx.workspace),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ) as proc:
            assert proc.stdout is not None
            for raw in proc.stdout:  # copied to the worker's log as it comes
                text = raw.decode(errors="replace")
                sys.stdout.write(text)
                sys.stdout.flush()
                line = text.strip()
                if line:
                    last_line = line
            returncode = proc.wait()
        return conclude(returncode, report_path, last_line, spend)


def report_path_for(ctx: WorkerContext) -> Path:
    """Where the command may leave its report (STELLA_COMMAND_RESULT)."""
    return ctx.result_path.with_name(ctx.result_path.stem + ".command.json")


def conclude(returncode: int, report_path: Path, last_line: str, spend: SpendReporter) -> PipelineResult:
    """The result of a command that exited with returncode, from its report (whose spend is reported)
    and the last non-empty line of its output."""
    try:
        report = _read_report(report_path)
        usd = _number(report, "spend_usd", float)
        tokens_in = _number(report, "input_tokens", int)
        tokens_out = _number(report, "output_tokens", int)
        steps = _number(report, "steps", int)
    except ValueError as exc:
        return PipelineResult(success=False, summary=str(exc), error=str(exc))
    if usd or tokens_in or tokens_out or steps:
        spend.add(usd, input_tokens=tokens_in, output_tokens=tokens_out, steps=steps)
    summary = str(report.get("summary") or last_line or "")
    if returncode == 0:
        return PipelineResult(True, summary or "command succeeded", None, usd, tokens_in, tokens_out, steps)
    error = f"command failed: {_signal_text(returncode)}"
    return PipelineResult(False, summary or error, error, usd, tokens_in, tokens_out, steps)
