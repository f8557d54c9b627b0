"""Choosing the Ray executor: without Ray one line says how to get it (exit 2), nothing is run or written."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import write_config
from helpers.repo import StellaRunner

from stellafleet.core.configsections import ExecutorConfig
from stellafleet.core.paths import StatePaths


def no_ray(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import ray` fails, as on a machine without the extra."""
    shadow = tmp_path / "no-ray" / "ray"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    return {"PYTHONPATH": str(shadow.parent)}


def test_without_ray_the_ray_executor_is_one_line_and_exit_2(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    write_config(git_repo, run="true")
    for args in (("--executor", "ray"), ()):
        if not args:  # the config asks for it instead
            write_config(git_repo, run="true", extra='[executor]\nkind = "ray"\n')
        done = stella("fleet", "--pipeline", "command", *args, "do it", cwd=git_repo, env=no_ray(tmp_path))
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'stellafleet[ray]'" in lines[0], done.stderr
        assert "Traceback" not in done.stderr
    assert not StatePaths(git_repo).fleet_db.exists()


def test_ray_address_without_the_ray_executor_is_a_usage_error(git_repo: Path, stella: StellaRunner) -> None:
    write_config(git_repo, run="true")
    done = stella("fleet", "--pipeline", "command", "--ray-address", "127.0.0.1:1", "x", cwd=git_repo)
    assert done.returncode == 2 and "--executor ray" in done.stderr


def test_each_remote_task_asks_for_a_slot_and_its_own_resources() -> None:
    config = ExecutorConfig(resources={"agents": 1}, tasks={"t2": {"node_b": 1, "agents": 0}})
    assert config.resources_for("t1") == {"stella_slot": 1.0, "agents": 1.0}
    assert config.resources_for("t2") == {"stella_slot": 1.0, "node_b": 1.0}  # 0 takes one away
