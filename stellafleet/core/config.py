"""Layered configuration: user file < project file (or --config) < environment, each file checked
against config.schema.json as it loads (every problem at once, exit 2) unless already found valid."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from stellafleet.core import configschema
from stellafleet.core.configsections import (
    AgentCliConfig,
    CommitConfig,
    EngineConfig,
    FleetConfig,
    GovernorConfig,
    MergeConfig,
    NotifyConfig,
    ResourcesConfig,
    WatchConfig,
    WorktreeConfig,
    build,
    build_executor,
    build_pipelines,
    build_prices,
)
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.paths import StatePaths

# Environment variables that override config keys; API keys are deliberately absent.
ENV_KEYS = {
    "STELLA_MODEL": "engine.model",
    "STELLA_BASE_URL": "engine.base_url",
    "STELLA_PROVIDER": "engine.provider",
}
# Every variable a user sets to configure stella: a fleet hands each of them on to its workers untouched.
CONFIG_VARIABLES = (*ENV_KEYS, "STELLA_CONFIG", "STELLA_SPEND_LIMIT")
DEFAULT_SOURCE = "default"
Origins = Mapping[tuple[str, ...], str]  # a key's path -> where its value came from
T = TypeVar("T")


class ConfigError(StellaError):
    """A config that cannot be used; carries every problem, each a full line naming its file."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems), exit_code=EXIT_USAGE)


PROJECT_CONFIG = ".stella/config.toml"  # as messages name it


class Section(Generic[T]):
    """A typed section of Config (`config.fleet`): built once, when first read, from its checked table."""

    def __init__(self, kind: Callable[[Mapping[str, Any]], T] | type[T]) -> None:
        self.kind = kind

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def make(self, table: Mapping[str, Any]) -> T:
        return build(self.kind, table) if isinstance(self.kind, type) else self.kind(table)

    def __get__(self, config: Config, owner: type) -> T:
        value, problems = config.checked(self.name)
        if problems:
            raise ConfigError(problems)
        config.__dict__[self.name] = value  # read once: the attribute now hides this descriptor
        return value


class Config:
    """The merged config. `Config(data)` built in code is checked section by section when first read."""

    def __init__(
        self,
        data: Mapping[str, Any] | None = None,
        *,
        origins: Origins | None = None,
        checked: bool = False,
        settings_file: str = PROJECT_CONFIG,
        fingerprint: str | None = None,
    ) -> None:
        self._data: dict[str, Any] = dict(data or {})
        # where a missing setting is to be set: the --config (or $STELLA_CONFIG) file, else the project's
        self.settings_file = settings_file
        self.origins: Origins = dict(origins or {})
        self._checked = checked
        self._fingerprint = fingerprint  # of the layers load_config found valid

    def remember_checked(self, root: Path) -> None:
        """Once the private directory exists: later processes with these layers skip the check."""
        if self._checked and self._fingerprint:
            _remember(StatePaths(root).config_checked, self._fingerprint)

    # --- typed sections ---

    engine = Section(EngineConfig)
    fleet = Section(FleetConfig)
    executor = Section(build_executor)
    governor = Section(GovernorConfig)
    watch = Section(WatchConfig)
    notify = Section(NotifyConfig)
    commit = Section(CommitConfig)
    merge = Section(MergeConfig)
    worktree = Section(WorktreeConfig)
    resources = Section(ResourcesConfig)
    prices = Section(build_prices)
    pipelines = Section(build_pipelines)

    def agent_cli(self, name: str) -> AgentCliConfig:
        """[pipelines.NAME] of an agent-CLI wrapper: a built-in one, or a third-party pipeline built on it."""
        if name not in self.pipelines.plugins:
            return self.pipelines.agents.get(name) or AgentCliConfig()
        table = self.pipelines.plugins[name]
        problems = configschema.subtable_problems(table, "agentCli", ("pipelines", name))
        if problems:
            raise ConfigError([f"config: {problem.text}" for problem in problems])
        return build(AgentCliConfig, table)

    def checked(self, section: str) -> tuple[Any, list[str]]:
        """A section built from its valid keys, and the problems of the others (none once loaded)."""
        table = self._data.get(section, {})
        found = [] if self._checked else configschema.problems({section: table})
        if not isinstance(table, Mapping):
            table = {}
        elif found:
            bad = {problem.path[1] for problem in found if len(problem.path) > 1}
            table = {key: value for key, value in table.items() if key not in bad}
        built = vars(Config)[section].make(table)
        return built, [f"config: {problem.text}" for problem in found]

    # --- the raw data ---

    def get(self, dotted: str, default: Any = None) -> Any:
        """The low-level lookup by dotted key (`pipelines.notes.folder`): for third-party pipelines'
        own tables. stella's own sections are read through the typed sections above."""
        return _lookup(self._data, dotted.split("."), default)


# ---------------------------------------------------------------------------------------------
# loading


@dataclass(frozen=True)
class ConfigFile:
    """One file of the layers: `kind` says why it is read (user, project, --config, $STELLA_CONFIG)."""

    kind: str
    path: Path


def config_files(
    root: Path | None, *, config_file: Path | None = None, env: Mapping[str, str] | None = None
) -> list[ConfigFile]:
    """The files load_config reads, lowest first (each only when it exists)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".config")
    files = [ConfigFile("user", Path(base) / "stella" / "config.toml")]
    if config_file is not None:
        files.append(ConfigFile("--config", config_file))
    elif env.get("STELLA_CONFIG"):
        files.append(ConfigFile("$STELLA_CONFIG", Path(env["STELLA_CONFIG"])))
    elif root is not None:
        files.append(ConfigFile("project", root / ".stella" / "config.toml"))
    return files


def load_config(
    root: Path | None,
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """The merged, checked config; ConfigError (exit 2) naming every problem of every layer."""
    env = os.environ if env is None else env
    layers: list[tuple[str, dict[str, Any]]] = []
    files = config_files(root, config_file=config_file, env=env)
    chosen = [file.path for file in files if file.kind in ("--config", "$STELLA_CONFIG")]
    for file in files:
        if file.path in chosen and not file.path.is_file():
            raise StellaError(f"config file not found: {file.path}")
        if file.path.is_file():
            layers.append((str(file.path), _read(file.path)))
    for var, dotted in ENV_KEYS.items():
        if env.get(var):
            section, key = dotted.split(".")
            layers.append((f"${var}", {section: {key: env[var]}}))
    data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for source, layer in layers:
        _merge(data, layer, origins, source)
    known = StatePaths(root).config_checked if root is not None else None
    fingerprint = _fingerprint(layers)
    try:
        valid = known is not None and known.read_text() == fingerprint
    except OSError:
        valid = False
    if not valid:
        problems = _problems(layers, data)
        if problems:
            raise ConfigError(problems)
        _remember(known, fingerprint)
    return Config(
        data,
        origins=origins,
        checked=True,
        settings_file=str(chosen[0]) if chosen else PROJECT_CONFIG,
        fingerprint=fingerprint,
    )


def _problems(layers: list[tuple[str, dict[str, Any]]], merged: dict[str, Any]) -> list[str]:
    """Each layer's problems, naming its source; a key a table needs may come from any layer."""
    found = [
        f"{source}: {problem.text}"
        for source, layer in layers
        for problem in configschema.problems(layer, installed=_installed_pipelines)
        if problem.keyword != "required"
    ]
    for problem in configschema.problems(merged):
        if problem.keyword == "required":
            table = problem.path[:-1]  # TOML has no null: a table found is not None
            source = next(s for s, layer in reversed(layers) if _lookup(layer, table) is not None)
            found.append(f"{source}: {problem.text}")
    return found


def _fingerprint(layers: list[tuple[str, dict[str, Any]]]) -> str:
    """The layers as read, and which schema checked them (its file's path, size and time)."""
    schema = configschema.BUNDLED.path
    found = schema.stat()
    return json.dumps([str(schema), found.st_size, found.st_mtime_ns, layers], sort_keys=True, default=str)


def _remember(path: Path | None, fingerprint: str) -> None:
    """Note layers found valid, so the next process (each worker) with the same files and schema skips the
    check and never loads jsonschema; only where the fleet made its private directory."""
    if path is None or not path.parent.is_dir():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(fingerprint)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _installed_pipelines() -> list[str]:
    # Only asked for a [pipelines.NAME] the schema does not know: importlib.metadata is slow to load.
    from importlib.metadata import entry_points

    return [entry.name for entry in entry_points(group=configschema.PIPELINE_GROUP)]


def _lookup(data: Any, path: Iterable[Any], default: Any = None) -> Any:
    """The value at path in nested tables; default when a part of it is missing."""
    for part in path:
        if not isinstance(data, Mapping) or part not in data:
            return default
        data = data[part]
    return data


def _merge(
    base: dict[str, Any],
    extra: Mapping[str, Any],
    origins: dict[tuple[str, ...], str],
    source: str,
    prefix: tuple[str, ...] = (),
) -> dict[str, Any]:
    """extra merged into base, table by table; origins records where each key's value came from."""
    for key, value in extra.items():
        path = (*prefix, key)
        if not (isinstance(value, Mapping) and isinstance(base.get(key), dict)):
            for stale in [known for known in origins if known[: len(path)] == path]:
                del origins[stale]
        if isinstance(value, Mapping):
            inner = dict(base[key]) if isinstance(base.get(key), dict) else {}
            base[key] = _merge(inner, value, origins, source, path)
        else:
            base[key] = value
            origins[path] = source
    return base


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise StellaError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise StellaError(f"{path}: cannot read config: {exc.strerror}") from None
