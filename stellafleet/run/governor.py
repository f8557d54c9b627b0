"""The default fleet width: about one worker per idle core and per free memory budget, at most a ceiling."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stellafleet.core.config import Config
from stellafleet.core.words import plural

GIB = 1024**3


@dataclass(frozen=True)
class Decision:
    value: int
    reason: str

    def describe(self) -> str:
        return f"max concurrency {self.value} ({self.reason})"


@dataclass(frozen=True)
class MachineState:
    cores: int
    available_bytes: int
    load_1m: float

    @classmethod
    def sample(cls) -> MachineState:
        import psutil

        return cls(
            cores=psutil.cpu_count(logical=True) or 1,
            available_bytes=int(psutil.virtual_memory().available),
            load_1m=float(psutil.getloadavg()[0]),  # emulated where the platform has none
        )


def governed(config: Config, machine: MachineState) -> Decision:
    per_core = config.governor.workers_per_core
    per_worker_gib = config.governor.memory_per_worker_gib
    ceiling = config.governor.max
    # Cores already busy (the load average) are not ours to hand out; keep at least one worker.
    by_cpu = max(1, math.floor(machine.cores * per_core - machine.load_1m + 0.5))
    by_memory = max(1, math.floor(machine.available_bytes / (per_worker_gib * GIB)))
    value = max(1, min(by_cpu, by_memory, ceiling))
    free_gib = machine.available_bytes / GIB
    reason = f"governor: {plural(machine.cores, 'core')}, {free_gib:.1f} GiB free, load {machine.load_1m:.1f}"
    if value == ceiling and min(by_cpu, by_memory) > ceiling:
        reason += f", capped at governor.max {ceiling}"
    elif value == by_memory and by_memory < by_cpu:
        reason += f", {per_worker_gib:g} GiB per worker"
    return Decision(value, reason)


def decide(config: Config, requested: int | None = None, *, machine: MachineState | None = None) -> Decision:
    """--max-concurrency wins, then `[fleet] max_concurrency`, then the governor."""
    if requested is not None:
        return Decision(requested, "--max-concurrency")  # the parser took only a whole number >= 1
    fixed = config.fleet.max_concurrency
    if fixed is not None:
        return Decision(fixed, "config fleet.max_concurrency")
    return governed(config, machine or MachineState.sample())
