"""The engine's `[engine]` settings; a key is never config, only the name of its variable (`api_key_env`)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from stellafleet.core.config import Config
from stellafleet.core.errors import EXIT_USAGE, StellaError

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
DEFAULT_BASE_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


@dataclass(frozen=True)
class EngineSettings:
    provider: str
    model: str
    base_url: str
    api_key_env: str
    # Limits: their defaults live in core.configsections.EngineConfig, the one place they are set.
    max_steps: int
    max_wall_seconds: float
    max_output_tokens: int
    request_timeout: float
    max_retries: int
    shell: bool
    shell_timeout: float

    def api_key(self, env: Mapping[str, str] | None = None) -> str | None:
        """The key from the environment, or None (fine for a local server)."""
        env = os.environ if env is None else env
        return (env.get(self.api_key_env) or None) if self.api_key_env else None

    def public(self) -> dict[str, Any]:
        """What a transcript records of them: the key's variable, never a key (and not the timeouts)."""
        left_out = ("request_timeout", "max_retries", "shell_timeout")
        return {key: value for key, value in asdict(self).items() if key not in left_out}


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _problems_and_values(
    config: Config, model: str | None, env: Mapping[str, str]
) -> tuple[list[str], dict[str, Any]]:
    """The settings' values, and every problem: the [engine] table's own, then what running needs."""
    engine, problems = config.checked("engine")
    model = model or engine.model
    if not model:
        problems.append(
            f'no model configured: set `model = "..."` under [engine] in {config.settings_file} '
            "(or the STELLA_MODEL environment variable)"
        )
        model = ""
    provider = engine.provider or ("anthropic" if model.lower().startswith("claude") else "openai")
    base_url = engine.base_url or DEFAULT_BASE_URL[provider]
    if urlsplit(base_url).scheme not in ("http", "https"):
        problems.append(f"engine.base_url must be an http(s) URL, not {base_url!r}")
        base_url = DEFAULT_BASE_URL[provider]
    key_env = DEFAULT_KEY_ENV[provider] if engine.api_key_env is None else engine.api_key_env
    if model and key_env and not env.get(key_env) and not is_loopback(base_url):
        problems.append(
            f"no API key for {provider}: set {key_env} in the environment "
            f'(or name another variable with `api_key_env = "..."` under [engine])'
        )
    resolved = {"provider": provider, "model": model, "base_url": base_url, "api_key_env": key_env}
    limits = {f.name: getattr(engine, f.name) for f in fields(EngineSettings) if f.name not in resolved}
    return problems, {**resolved, **limits}


def settings_problems(
    config: Config, *, model: str | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
    return _problems_and_values(config, model, os.environ if env is None else env)[0]


def load_settings(
    config: Config, *, model: str | None = None, env: Mapping[str, str] | None = None
) -> EngineSettings:
    """The engine settings; StellaError (exit 2) naming every problem when it cannot run."""
    problems, values = _problems_and_values(config, model, os.environ if env is None else env)
    if problems:
        raise StellaError("; ".join(problems), exit_code=EXIT_USAGE)
    return EngineSettings(**values)
