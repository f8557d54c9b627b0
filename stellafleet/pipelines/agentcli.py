"""An agent CLI as a pipeline: its `[pipelines.<name>]` settings, its preflight and its version."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
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
        except StellaError:
            return None
        try:
            done = runner.run([path, "--version"], timeout=VERSION_TIMEOUT_S) if path else None
        except OSError:
            return None
        if done is None or done.timed_out:
            return None
        lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        return lines[0] if lines else None


def model_for(ctx: WorkerContext, settings: CliSettings) -> str | None:
    """The task's own model wins over the wrapper's configured one; None lets the CLI choose."""
    return ctx.model or settings.model
