"""The pipeline protocol: how a worker process turns a task into work."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendReporter
from stellafleet.core.workercontext import WorkerContext


@dataclass
class PipelineResult:
    success: bool
    summary: str
    error: str | None = None
    spend_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PipelineResult:
        return cls(
            success=bool(data.get("success")),
            summary=str(data.get("summary") or ""),
            error=data.get("error"),
            spend_usd=float(data.get("spend_usd") or 0.0),
            input_tokens=int(data.get("input_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
            steps=int(data.get("steps") or 0),
        )


class Pipeline(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """None when ready; otherwise one line saying what to install or configure.

        spend_limited: the run has a spend limit, so what the pipeline spends must be known (a pipeline
        that prices tokens itself refuses a model it has no price for). model: a task's own model (None:
        the pipeline's configured default); the fleet asks once per model its tasks use. Plugins written
        to the older `preflight(self, config)` still work: they are called without the keywords.
        """
        ...

    def version(self) -> str | None: ...

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult: ...
