"""An agent CLI as a pipeline: its `[pipelines.<name>]` settings, its preflight and its version."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import ClassVar

from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.workercontext import WorkerContext

VERSION_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class CliSettings:
    """`[pipelines.<name>]` for a CLI wrapper."""

    binary: str
    extra_args: tuple[str, ...] = ()
    model: str | None = None
    max_turns: int | None = None


def cli_settings(config: Config, pipeline: str, default_binary: str) -> CliSettings:
    """Read and check `[pipelines.<pipeline>]`: binary, extra_args (list or shell words), model, max_turns."""
    where = f"[pipelines.{pipeline}] in the config"
    table = config.section(f"pipelines.{pipeline}")
    binary = table.get("binary", default_binary)
    if not isinstance(binary, str) or not binary.strip():
        raise StellaError(f"{where}: binary must be a command name or path", exit_code=EXIT_USAGE)
    extra = table.get("extra_args", [])
    if isinstance(extra, str):
        extra = shlex.split(extra)
    if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
        raise StellaError(f"{where}: extra_args must be a list of strings", exit_code=EXIT_USAGE)
    model = table.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise StellaError(f"{where}: model must be a model name", exit_code=EXIT_USAGE)
    max_turns = table.get("max_turns")
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise StellaError(f"{where}: max_turns must be a whole number >= 1", exit_code=EXIT_USAGE)
    return CliSettings(binary=binary.strip(), extra_args=tuple(extra), model=model, max_turns=max_turns)


def find_cli(binary: str) -> str | None:
    """The full path of binary (a name looked up on PATH, or a path), or None when it is not there."""
    return shutil.which(binary)


def cli_version(binary: str) -> str | None:
    """The first line `binary --version` prints, or None when it cannot be run."""
    path = find_cli(binary)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


class AgentCliPipeline:
    """Base of the wrappers: config, preflight and version for one agent CLI. Subclasses add `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_binary: ClassVar[str]
    display_name: ClassVar[str]
    install_hint: ClassVar[str]

    def settings(self, config: Config) -> CliSettings:
        return cli_settings(config, self.name, self.default_binary)

    def cli_path(self, config: Config) -> str | None:
        return find_cli(self.settings(config).binary)

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """The CLI is configured and installed; subclasses that price tokens also check the model's price."""
        try:
            binary = self.settings(config).binary
        except StellaError as exc:
            return str(exc)
        if find_cli(binary) is None:
            return (
                f"pipeline {self.name}: {self.display_name} CLI {binary!r} not found on PATH: "
                f"install it with `{self.install_hint}` "
                f'(or set [pipelines.{self.name}] binary = "/path/to/{self.default_binary}")'
            )
        return None

    def version(self, config: Config | None = None) -> str | None:
        binary = self.default_binary
        if config is not None:
            try:
                binary = self.settings(config).binary
            except StellaError:
                return None
        return cli_version(binary)


def model_for(ctx: WorkerContext, settings: CliSettings) -> str | None:
    """The task's own model wins over the wrapper's configured one; None lets the CLI choose."""
    return ctx.model or settings.model
