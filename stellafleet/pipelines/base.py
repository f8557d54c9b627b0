"""The pipeline protocol: how a worker process turns a task into work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

from stellafleet.core.config import Config
from stellafleet.core.spend import SpendReporter, check_count, check_usd
from stellafleet.core.terminal import without_colour
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
    # what the attempt learned (its agent's session id, ...): the ledger's attempt_facts, and STELLA_FACTS
    # of the task's next attempt
    facts: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PipelineResult:
        """The result a worker wrote, each amount read on its own (one bad field never costs the others)."""
        error = None if data.get("error") is None else without_colour(str(data["error"]))
        summary = without_colour(str(data.get("summary") or ""))
        facts = data.get("facts")
        known = {str(key): value for key, value in facts.items()} if isinstance(facts, dict) else {}
        return cls(data.get("success") is True, summary, error, *read_amounts(data), facts=known)


def read_amounts(
    data: dict[str, Any], problems: list[str] | None = None, prefix: str = ""
) -> tuple[float, int, int, int]:
    """Dollars, tokens in and out, and steps, each read on its own: a bad one counts 0, its problem noted."""

    def amount(key: str, check: Callable[[object, str], float]) -> float:
        try:
            return check(data.get(key) or 0, key)
        except ValueError as exc:
            if problems is not None:
                problems.append(f"{prefix}{exc}")
            return 0

    usd = float(amount("spend_usd", check_usd))  # first: problems are said in this order
    counts = [int(amount(key, check_count)) for key in ("input_tokens", "output_tokens", "steps")]
    return usd, counts[0], counts[1], counts[2]


class Pipeline(Protocol):
    """How a worker does a task; `stella pipelines` also shows optional `description` and `wraps`."""

    name: ClassVar[str]
    description: ClassVar[str]

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """None when ready; otherwise one line saying what to install or configure."""
        ...

    def version(self) -> str | None: ...

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult: ...
