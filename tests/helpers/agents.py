"""Helpers for the agent-CLI pipeline tests: fake CLIs on PATH, a worker context, a recording reporter."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.fleet import RUN, worker_context
from stellafleet.core.config import Config
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops
from stellafleet.pipelines.base import Pipeline, PipelineResult
from stellafleet.testing.fake_agent import LOG_ENV, SCRIPT_ENV, read_log, write_shims

RUN_ID = RUN


@dataclass
class RecordingSpend:
    """A SpendReporter that keeps every report (reports may come from a reader thread)."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    cached: list[dict[str, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self, usd: float, *, input_tokens: int = 0, output_tokens: int = 0, steps: int = 0, **cached: int
    ) -> None:
        """cached: cache_read_tokens / cache_write_tokens, kept in `cached` (passed only when some)."""
        with self._lock:
            self.calls.append(
                {"usd": usd, "input_tokens": input_tokens, "output_tokens": output_tokens, "steps": steps}
            )
            self.cached.append(cached)

    @property
    def usd(self) -> float:
        return sum(call["usd"] for call in self.calls)

    def total(self, key: str) -> int:
        return sum(call[key] for call in self.calls)


class FakeAgents:
    """The fake CLIs on PATH, their script and their log, for one test."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin_dir = write_shims(tmp_path / "fake-bin")
        self.log_path = tmp_path / "fake-agents.jsonl"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv(LOG_ENV, str(self.log_path))
        monkeypatch.delenv(SCRIPT_ENV, raising=False)

    def script(self, script: dict[str, Any]) -> None:
        self.monkeypatch.setenv(SCRIPT_ENV, json.dumps(script))

    def log(self, event: str | None = None, cli: str | None = None) -> list[dict[str, Any]]:
        return [
            entry
            for entry in read_log(self.log_path)
            if (event is None or entry["event"] == event) and (cli is None or entry["cli"] == cli)
        ]

    def argv(self, cli: str) -> list[str]:
        starts = self.log("start", cli)
        assert starts, f"{cli} was never started"
        argv: list[str] = starts[-1]["argv"]
        return argv

    def prompt(self, cli: str) -> str:
        """The prompt the CLI's last start received (from its argv, stdin or message file)."""
        starts = self.log("start", cli)
        assert starts, f"{cli} was never started"
        prompt: str = starts[-1]["prompt"]
        return prompt


def make_context(
    root: Path,
    *,
    pipeline: str,
    task_id: str = "t1",
    title: str = "Write the notes",
    attempt_id: int = 1,
    prompt: str = "Write notes.txt",
    guard: float | None = None,
    timeout: float | None = 60.0,
    model: str | None = None,
    workspace: Path | None = None,
    isolation: str = "shared",
    branch: str | None = None,
) -> WorkerContext:
    return worker_context(
        root,
        run_id=RUN_ID,
        task_id=task_id,
        attempt_id=attempt_id,
        pipeline=pipeline,
        title=title,
        prompt=prompt,
        base_commit=gitops.head_commit(root),
        workspace=workspace,
        isolation=isolation,
        branch=branch,
        guard=guard,
        model=model,
        timeout=timeout,
    )


def prepare(ctx: WorkerContext) -> None:
    """What the fleet does before a worker starts: its state directories exist and are ignored by git."""
    from stellafleet.core.paths import EXCLUDED_DIRS

    gitops.ensure_excluded(ctx.root, list(EXCLUDED_DIRS))
    for path in (ctx.result_path, ctx.log_path, ctx.transcript_path):
        path.parent.mkdir(parents=True, exist_ok=True)


def config(data: dict[str, Any] | None = None) -> Config:
    return Config(data or {})


def run_pipeline(
    pipeline: Pipeline, root: Path, cfg: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[RecordingSpend, PipelineResult]:
    """Run pipeline once on a prepared context (make_context's arguments), recording what it reports."""
    ctx = make_context(root, pipeline=pipeline.name, **ctx_args)
    prepare(ctx)
    spend = RecordingSpend()
    return spend, pipeline.run(ctx, config(cfg), spend)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): ask psutil whether it is really running.
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
