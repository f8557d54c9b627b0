"""What a worker process is told about its task, carried in its environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths

_PREFIX = "STELLA_"


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

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.root)

    @property
    def shared(self) -> bool:
        return self.isolation == "shared"

    def to_env(self) -> dict[str, str]:
        values: dict[str, str | None] = {
            "ROOT": str(self.root),
            "WORKSPACE": str(self.workspace),
            "RUN_ID": self.run_id,
            "TASK_ID": self.task_id,
            "TASK_TITLE": self.task_title,
            "ATTEMPT_ID": str(self.attempt_id),
            "PROMPT": self.prompt,
            "ISOLATION": self.isolation,
            "BRANCH": self.branch,
            "BASE_COMMIT": self.base_commit,
            "SPEND_GUARD": None if self.spend_guard_usd is None else f"{self.spend_guard_usd:.6f}",
            "PIPELINE": self.pipeline,
            "MODEL": self.model,
            "TIMEOUT": None if self.timeout_s is None else str(self.timeout_s),
            "RESULT_FILE": str(self.result_path),
            "LOG_FILE": str(self.log_path),
            "TRANSCRIPT_FILE": str(self.transcript_path),
        }
        return {_PREFIX + key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerContext:
        env = os.environ if env is None else env

        def need(key: str) -> str:
            value = env.get(_PREFIX + key)
            if not value:
                raise StellaError(
                    "not inside a fleet worker: this command only works in a process started by "
                    f"`stella fleet` ({_PREFIX}{key} is not set)"
                )
            return value

        def maybe_float(key: str) -> float | None:
            value = env.get(_PREFIX + key)
            return float(value) if value else None

        try:
            attempt_id = int(need("ATTEMPT_ID"))
        except ValueError as exc:
            raise StellaError(f"{_PREFIX}ATTEMPT_ID is not a number: {exc}") from None
        return cls(
            root=Path(need("ROOT")),
            workspace=Path(need("WORKSPACE")),
            run_id=need("RUN_ID"),
            task_id=need("TASK_ID"),
            task_title=env.get(_PREFIX + "TASK_TITLE", ""),
            attempt_id=attempt_id,
            prompt=env.get(_PREFIX + "PROMPT", ""),
            isolation=env.get(_PREFIX + "ISOLATION", "shared"),
            branch=env.get(_PREFIX + "BRANCH") or None,
            base_commit=env.get(_PREFIX + "BASE_COMMIT", ""),
            spend_guard_usd=maybe_float("SPEND_GUARD"),
            pipeline=env.get(_PREFIX + "PIPELINE", "plain"),
            model=env.get(_PREFIX + "MODEL") or None,
            timeout_s=maybe_float("TIMEOUT"),
            result_path=Path(need("RESULT_FILE")),
            log_path=Path(env.get(_PREFIX + "LOG_FILE", os.devnull)),
            transcript_path=Path(env.get(_PREFIX + "TRANSCRIPT_FILE", os.devnull)),
        )
