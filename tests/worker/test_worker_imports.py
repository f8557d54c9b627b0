"""A worker starts light: a `command` worker, and the `stella commit` it runs, import only what they use."""

from __future__ import annotations

import json
import shlex
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from helpers.fleet import by_id, run_record, write_config
from helpers.repo import run_stella

from stellafleet import pipelines
from stellafleet.core.config import ConfigError, load_config
from stellafleet.core.paths import StatePaths

HEAVY = ("stellafleet.engine", "stellafleet.plan", "stellafleet.run", "jsonschema", "rich", "httpx", "doit")
# Imported by every Python the fleet starts (site imports sitecustomize from PYTHONPATH): at exit, each
# process writes its command line and the modules it loaded.
SITECUSTOMIZE = """\
import atexit, json, os, sys
def _write():
    path = os.path.join(os.environ["MODULES_DIR"], f"{os.getpid()}.json")
    with open(path, "w") as out:
        json.dump({"argv": sys.orig_argv, "modules": sorted(sys.modules)}, out)
atexit.register(_write)
"""


def _loaded(directory: Path) -> dict[str, list[str]]:
    """Each process's modules, by what it was: the fleet, the worker, the commit."""
    found: dict[str, list[str]] = {}
    for path in directory.glob("*.json"):
        record = json.loads(path.read_text())
        argv = " ".join(record["argv"])
        kind = "worker" if "stellafleet.worker.main" in argv else "commit" if " commit " in argv else "fleet"
        found[kind] = record["modules"]
    return found


# the commit tree is readied by the one readying function (run/bootstrap.py, and the check's environment
# from run/checking.py): light modules of run/, none of its engine, schema or display
READYING = ("stellafleet.run", "stellafleet.run.bootstrap", "stellafleet.run.checking")


def _heavy(modules: list[str]) -> list[str]:
    heavy = {m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY)}
    return sorted(heavy - set(READYING))


def test_a_command_worker_and_its_stella_commit_load_no_engine_schema_or_display(
    git_repo: Path, isolated_home: Path, tmp_path: Path
) -> None:
    site, written = tmp_path / "site", tmp_path / "modules"
    site.mkdir()
    written.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    stella = shlex.quote(str(Path(sys.executable).parent / "stella"))
    write_config(git_repo, run=f"echo x > f.txt && {stella} commit -m 'add f' f.txt")
    env = {"PYTHONPATH": str(site), "MODULES_DIR": str(written)}
    proc = run_stella("fleet", "--pipeline", "command", "t1", cwd=git_repo, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert by_id(run_record(git_repo)["tasks"])["t1"]["status"] == "succeeded"
    loaded = _loaded(written)
    assert set(loaded) == {"fleet", "worker", "commit"}
    assert "jsonschema" in loaded["fleet"] and "doit" in loaded["fleet"]  # the fleet checks, and drives doit
    assert "stellafleet.pipelines.command" in loaded["worker"]
    assert _heavy(loaded["worker"]) == []
    assert "stellafleet.commands.commit" in loaded["commit"]
    assert _heavy(loaded["commit"]) == []


def test_a_config_changed_after_its_check_is_checked_again(git_repo: Path, isolated_home: Path) -> None:
    StatePaths(git_repo).private.mkdir(parents=True)
    write_config(git_repo, run="true")
    assert load_config(git_repo).pipelines.command.run == "true"
    assert StatePaths(git_repo).config_checked.is_file()
    write_config(git_repo, run="true", extra="[fleet]\nmax_concurency = 2\n")
    with pytest.raises(ConfigError, match='did you mean "max_concurrency"'):
        load_config(git_repo)


def test_the_builtin_pipelines_are_stellas_entry_points() -> None:
    own = {
        ep.name: ep.value
        for ep in entry_points(group="stella.pipelines")
        if ep.value.startswith("stellafleet.")
    }
    assert own == pipelines.BUILTIN
