"""What a worker process is told about its task, carried in its environment."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths

_PREFIX = "STELLA_"
# Linux refuses one environment string over 128 KiB (and an exec whose whole environment is too big).
ENV_PROMPT_MAX_BYTES = 100_000

# Each field's variable is STELLA_ and the field's name in capitals, but for these; none may share a name
# with a config variable (env_names).
_RENAMED = {
    "prompt_path": "PROMPT_FILE",
    "spend_guard_usd": "SPEND_GUARD",
    "model": "TASK_MODEL",
    "timeout_s": "TIMEOUT",
    "result_path": "RESULT_FILE",
    "log_path": "LOG_FILE",
    "transcript_path": "TRANSCRIPT_FILE",
    "token": "ATTEMPT_PROOF",
}


@dataclass(frozen=True)
class WorkerContext:
    root: Path
    workspace: Path
    run_id: str
    task_id: str
    task_title: str
    attempt_id: int
    prompt: str
    isolation: str
    branch: str | None
    base_commit: str
    spend_guard_usd: float | None
    pipeline: str
    model: str | None
    timeout_s: float | None
    result_path: Path
    log_path: Path
    transcript_path: Path
    prompt_path: Path | None = None  # the prompt in a file (written by the fleet before the worker starts)
    # The attempt's secret: the ledger keeps its SHA-256, so `stella commit` can prove its attempt.
    token: str | None = None
    # An expanding task's (plan field `expands`): where its worker may write the tasks it adds to the run.
    plan_out: Path | None = None
    commit_hooks: str = "run"  # [commit] hooks: whether `stella commit` runs the repository's hooks
    # --allow-detached / [fleet] allow_detached: a shared commit may go onto a detached HEAD
    allow_detached: bool = False
    # where an isolated worktree starts when not at base_commit: its parents' work, or a salvage commit
    start_commit: str | None = None
    # [commit] serialize_hooks, decided for the run: the commit hooks run under the repository's hook lock
    serialize_hooks: bool = False

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)

    @property
    def shared(self) -> bool:
        return self.isolation == "shared"

    @staticmethod
    def env_names() -> tuple[str, ...]:
        """Every variable a WorkerContext is carried in."""
        return tuple(_PREFIX + key for key in _KEYS.values())

    def to_env(self) -> dict[str, str]:
        values = {name: getattr(self, name) for name in _KEYS}
        if self.prompt_path is not None and len(self.prompt.encode()) > ENV_PROMPT_MAX_BYTES:
            values["prompt"] = None  # its file holds it
        if self.spend_guard_usd is not None:
            values["spend_guard_usd"] = f"{self.spend_guard_usd:.6f}"
        values["allow_detached"] = "1" if self.allow_detached else None
        values["serialize_hooks"] = "1" if self.serialize_hooks else None
        return {_PREFIX + _KEYS[name]: str(value) for name, value in values.items() if value is not None}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerContext:
        env = os.environ if env is None else env

        def get(name: str, default: str = "") -> str:
            return env.get(_PREFIX + _KEYS[name], default)

        def need(name: str) -> str:
            value = get(name)
            if not value:
                raise StellaError(
                    "not inside a fleet worker: this command only works in a process started by "
                    f"`stella fleet` ({_PREFIX}{_KEYS[name]} is not set)"
                )
            return value

        def maybe_float(name: str) -> float | None:
            value = get(name)
            if not value:
                return None
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or number < 0:
                raise StellaError(f"{_PREFIX}{_KEYS[name]} is not a number of 0 or more: {value!r}")
            return number

        try:
            attempt_id = int(need("attempt_id"))
        except ValueError as exc:
            raise StellaError(f"{_PREFIX}ATTEMPT_ID is not a number: {exc}") from None
        return cls(
            root=Path(need("root")),
            workspace=Path(need("workspace")),
            run_id=need("run_id"),
            task_id=need("task_id"),
            task_title=get("task_title"),
            attempt_id=attempt_id,
            prompt=_prompt(get("prompt"), get("prompt_path")),
            isolation=get("isolation", "shared"),
            branch=get("branch") or None,
            base_commit=get("base_commit"),
            spend_guard_usd=maybe_float("spend_guard_usd"),
            pipeline=get("pipeline", "plain"),
            model=get("model") or None,
            timeout_s=maybe_float("timeout_s"),
            result_path=Path(need("result_path")),
            log_path=Path(get("log_path", os.devnull)),
            transcript_path=Path(get("transcript_path", os.devnull)),
            prompt_path=Path(get("prompt_path")) if get("prompt_path") else None,
            token=get("token") or None,
            plan_out=Path(get("plan_out")) if get("plan_out") else None,
            commit_hooks="skip" if get("commit_hooks") == "skip" else "run",
            allow_detached=get("allow_detached") == "1",
            start_commit=get("start_commit") or None,
            serialize_hooks=get("serialize_hooks") == "1",
        )


_KEYS = {spec.name: _RENAMED.get(spec.name, spec.name.upper()) for spec in fields(WorkerContext)}


def _prompt(inline: str, path: str) -> str:
    """The prompt: from its file when there is one (it always holds the whole prompt), else inline."""
    if not path:
        return inline
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if inline:  # a small prompt is in the environment too
            return inline
        raise StellaError(f"cannot read the task's prompt from {_PREFIX}PROMPT_FILE {path}: {exc}") from None
