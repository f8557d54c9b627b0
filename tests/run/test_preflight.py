"""Before a run: prepare asks every step's preflight (run/steps/), in the steps' order, and says what they
found as they would: problems (exit 2, listed by --dry-run), a refusal, warnings and notes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fleet import write_config

from stellafleet.core.errors import StellaError
from stellafleet.run.prepare import FleetOptions, prepare

EXPANDING = '[[tasks]]\nid = "grow"\nprompt = "plan more"\nexpands = true\nisolation = "isolated"\n'


def test_an_isolated_expanding_task_is_a_problem_on_the_ray_executor_only(
    git_repo: Path, tmp_path: Path
) -> None:
    write_config(git_repo, run="true")
    plan = tmp_path / "plan.toml"
    plan.write_text(EXPANDING)

    def problems(executor: str) -> list[str]:
        options = FleetOptions(
            plan_path=str(plan), pipeline="command", executor=executor, dry_run=True, cwd=git_repo
        )
        return prepare(options).problems

    assert problems("ray") == [
        "task 'grow': expands = true needs the task to run on this machine, and isolated tasks run on the "
        'Ray cluster: make it shared, or run without [executor] kind = "ray"'
    ]
    assert problems("local") == []


def test_from_salvage_without_resume_is_refused_before_anything_else(git_repo: Path) -> None:
    with pytest.raises(StellaError, match=r"^--from-salvage only goes with --resume RUN$"):
        prepare(FleetOptions(prompts=["Do a"], from_salvage=True, cwd=git_repo))
