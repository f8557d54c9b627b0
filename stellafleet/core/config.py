"""Layered configuration: user file < project file < environment."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stellafleet.core.errors import StellaError

# Environment variables that override config keys; API keys are deliberately absent.
ENV_KEYS = {
    "STELLA_MODEL": "engine.model",
    "STELLA_BASE_URL": "engine.base_url",
    "STELLA_PROVIDER": "engine.provider",
}


class Config:
    def __init__(self, data: Mapping[str, Any] | None = None, sources: tuple[str, ...] = ()) -> None:
        self._data: dict[str, Any] = dict(data or {})
        self.sources = sources

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self._data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def section(self, dotted: str) -> dict[str, Any]:
        value = self.get(dotted, {})
        if not isinstance(value, Mapping):
            raise StellaError(f"config: [{dotted}] must be a table, not {type(value).__name__}")
        return dict(value)

    def as_dict(self) -> dict[str, Any]:
        return _merge({}, self._data)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge(dict(base[key]), value)
        elif isinstance(value, Mapping):
            base[key] = _merge({}, value)
        else:
            base[key] = value
    return base


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise StellaError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise StellaError(f"{path}: cannot read config: {exc.strerror}") from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def user_config_file(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".config")
    return Path(base) / "stella" / "config.toml"


def load_config(
    root: Path | None,
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    sources: list[str] = []
    if config_file is None and env.get("STELLA_CONFIG"):
        config_file = Path(env["STELLA_CONFIG"])
    if config_file is not None and not config_file.is_file():
        raise StellaError(f"config file not found: {config_file}")
    layers = [user_config_file(env)]
    if config_file is not None:
        layers.append(config_file)
    elif root is not None:
        layers.append(root / ".stella" / "config.toml")
    for path in layers:
        if path.is_file():
            _merge(data, _read(path))
            sources.append(str(path))
    for var, dotted in ENV_KEYS.items():
        if env.get(var):
            _set_dotted(data, dotted, env[var])
            sources.append(f"${var}")
    return Config(data, tuple(sources))
