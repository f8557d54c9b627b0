"""The pipeline protocol: how a worker process turns a task into work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendReporter, check_count, check_usd
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
        """The result a worker wrote; each amount is read on its own, so one malformed field never
        costs the others (a bad token count next to a good spend still yields the spend)."""

        def amount(key: str, check: Callable[[object, str], float]) -> Any:
            try:
                return check(data.get(key) or 0, key)
            except ValueError:
                return 0

        error = data.get("error")
        return cls(
            success=data.get("success") is True,
            summary=str(data.get("summary") or ""),
            error=None if error is None else str(error),
            spend_usd=float(amount("spend_usd", check_usd)),
            input_tokens=int(amount("input_tokens", check_count)),
            output_tokens=int(amount("output_tokens", check_count)),
            steps=int(amount("steps", check_count)),
        )


class Pipeline(Protocol):
    """How a worker does a task. `stella pipelines` also shows a plugin's `description` and, when it wraps a
    CLI, the optional class attribute `wraps` (the CLI's name: its path and version are shown too); a
    plugin without them is shown without them."""

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
