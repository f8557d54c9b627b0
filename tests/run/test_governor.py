"""The governor's default concurrency, from the machine's cores, free memory and load."""

from __future__ import annotations

import pytest

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.run.governor import GIB, Decision, MachineState, decide, governed


def machine(cores: int = 4, free_gib: float = 32.0, load: float = 0.0) -> MachineState:
    return MachineState(cores=cores, available_bytes=int(free_gib * GIB), load_1m=load)


def test_one_worker_per_idle_core_with_the_reason_shown() -> None:
    decision = governed(Config(), machine(cores=2, free_gib=21.3, load=0.4))
    assert decision == Decision(2, "governor: 2 cores, 21.3 GiB free, load 0.4")
    assert decision.describe() == "max concurrency 2 (governor: 2 cores, 21.3 GiB free, load 0.4)"


def test_busy_cores_are_not_handed_out_but_one_worker_always_runs() -> None:
    assert governed(Config(), machine(cores=4, load=2.0)).value == 2
    assert governed(Config(), machine(cores=2, load=9.0)).value == 1


def test_free_memory_limits_the_width_and_says_so() -> None:
    decision = governed(Config(), machine(cores=16, free_gib=3.5))
    assert decision.value == 3
    assert decision.reason.endswith("3.5 GiB free, load 0.0, 1 GiB per worker")
    roomy = Config({"governor": {"memory_per_worker_gib": 0.5}})
    assert governed(roomy, machine(cores=16, free_gib=3.5)).value == 7


def test_the_ceiling_and_workers_per_core_are_configurable() -> None:
    assert governed(Config(), machine(cores=64)).value == 8
    assert "capped at governor.max 8" in governed(Config(), machine(cores=64)).reason
    assert governed(Config({"governor": {"max": 32}}), machine(cores=64)).value == 32
    assert governed(Config({"governor": {"workers_per_core": 2}}), machine(cores=2)).value == 4


def test_flag_beats_config_beats_governor() -> None:
    config = Config({"fleet": {"max_concurrency": 5}})
    assert decide(config, 3, machine=machine()) == Decision(3, "--max-concurrency")
    assert decide(config, None, machine=machine()) == Decision(5, "config fleet.max_concurrency")
    assert decide(Config(), None, machine=machine(cores=3)).value == 3


def test_the_real_machine_gives_a_sane_number() -> None:
    decision = decide(Config())
    assert 1 <= decision.value <= 8 and decision.reason.startswith("governor: ")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"fleet": {"max_concurrency": 0}}, "fleet.max_concurrency must be a whole number"),
        ({"fleet": {"max_concurrency": "4"}}, "fleet.max_concurrency must be a whole number"),
        ({"governor": {"workers_per_core": -1}}, "governor.workers_per_core must be a positive number"),
        ({"governor": {"memory_per_worker_gib": True}}, "memory_per_worker_gib must be a positive number"),
        ({"governor": {"max": 2.5}}, "governor.max must be a whole number"),
    ],
)
def test_bad_settings_are_clear_errors(config: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(StellaError, match=message):
        decide(Config(config), None, machine=machine())
