"""An agent CLI as a pipeline: its `[pipelines.<name>]` settings, its preflight and its version; what the
wrapped agent gets: its environment, its prompt with the commit rules, a scratch directory."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.core.workercontext import WorkerContext
from stellafleet.proc import runner

VERSION_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class CliSettings:
    binary: str
    extra_args: tuple[str, ...] = ()
    model: str | None = None
    max_turns: int | None = None


class AgentCliPipeline:
    """Base of the wrappers: config, preflight and version for one agent CLI. Subclasses add `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_binary: ClassVar[str]
    display_name: ClassVar[str]
    install_hint: ClassVar[str]

    def settings(self, config: Config) -> CliSettings:
        """`[pipelines.<name>]` (checked by the config's schema), with this wrapper's default binary."""
        table = config.agent_cli(self.name)
        binary = (table.binary or self.default_binary).strip()
        return CliSettings(binary, table.extra_args, table.model, table.max_turns)

    def cli_path(self, config: Config) -> str | None:
        return shutil.which(self.settings(config).binary)

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """The CLI is configured and installed; subclasses that price tokens also check the model's price."""
        try:
            binary = self.settings(config).binary
        except StellaError as exc:
            return str(exc)
        if shutil.which(binary) is None:
            return (
                f"pipeline {self.name}: {self.display_name} CLI {binary!r} not found on PATH: "
                f"install it with `{self.install_hint}` "
                f'(or set [pipelines.{self.name}] binary = "/path/to/{self.default_binary}")'
            )
        return None

    def version(self, config: Config | None = None) -> str | None:
        """The first line `binary --version` prints, or None when it cannot be run."""
        try:
            path = shutil.which(self.default_binary if config is None else self.settings(config).binary)
            done = runner.run([path, "--version"], timeout=VERSION_TIMEOUT_S) if path else None
        except (StellaError, OSError):  # not configured, or it cannot be run
            return None
        if done is None or done.timed_out:
            return None
        lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        return lines[0] if lines else None


def scratch_dir(ctx: WorkerContext) -> Path:
    """A private directory for this attempt's wrapper files (settings, logs), outside the work tree."""
    path = ctx.paths.private / "pipelines" / ctx.run_id / f"{ctx.task_id}-{ctx.attempt_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def agent_env(ctx: WorkerContext) -> dict[str, str]:
    """The CLI's environment: ours, the worker context and this installation's `stella` first on PATH."""
    env = {**os.environ, **ctx.to_env()}
    bin_dir = str(Path(sys.executable).parent)
    if (Path(bin_dir) / "stella").exists():
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
        env["PATH"] = os.pathsep.join([bin_dir, *parts])
    return env


def agent_prompt(ctx: WorkerContext) -> str:
    """The task's prompt, then the rules for committing in its tree."""
    if ctx.shared:
        rules = (
            "You are one of several agents working in the same git working tree at the same time.\n"
            "- Change only the files this task needs. If an edit is refused because another task holds the "
            "file, do not retry it: work around it or say so in your final answer.\n"
            "- Do not run `git add`, `git rm`, `git mv`, `git commit`, `git stash`, `git reset`, "
            "`git clean`, `git checkout` or `git restore`: they would sweep in or discard other agents' "
            "work. A plain `rm` or `mv`, then `stella commit` of the paths, records a deletion or a move.\n"
            '- To commit, run `stella commit -m "<message>" <path> [<path> ...]`, naming exactly the files '
            "you changed. It commits only those paths and records the commit for this task.\n"
            "- End with a short summary of what you did."
        )
    else:
        branch = f" on branch {ctx.branch}" if ctx.branch else ""
        rules = (
            f"You are working in your own git worktree{branch}; no one else writes here.\n"
            "- Commit your finished work before you stop (`git add <paths>` then `git commit -m "
            '"<message>"`, or `stella commit -m "<message>" <path> ...`). Every commit on this branch is '
            "recorded for this task; uncommitted changes are not part of the result.\n"
            "- End with a short summary of what you did."
        )
    return f"{ctx.prompt.rstrip()}\n\n---\n{rules}\n"


def prompt_file(ctx: WorkerContext, prompt: str) -> Path:
    """prompt in a file of the attempt's scratch directory (one argument holds at most 128 KiB)."""
    path = scratch_dir(ctx) / "prompt.md"
    path.write_text(prompt, encoding="utf-8")
    return path
