"""Plain `doit list` / `doit info` in a repository configured as docs/plans.md says; `doit run` refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def doit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def leftovers(root: Path) -> list[str]:
    return sorted(path.name for path in root.rglob(".doit*"))


@pytest.fixture
def configured(git_repo: Path) -> Path:
    """The repository with the example plan and the documented [tool.doit] snippet in pyproject.toml."""
    shutil.copy(EXAMPLES / "feature-buildout.toml", git_repo / "plan.toml")
    snippet = (EXAMPLES / "doit-pyproject-snippet.toml").read_text(encoding="utf-8")
    (git_repo / "pyproject.toml").write_text('[project]\nname = "demo"\n\n' + snippet, encoding="utf-8")
    return git_repo


def test_doit_list_shows_the_plan(configured: Path) -> None:
    result = doit("list", cwd=configured)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["schema", "reader", "writer", "docs"]
    assert lines[0].split(None, 1)[1].strip() == "Add the migration"
    assert leftovers(configured) == []


def test_doit_info_shows_one_task(configured: Path) -> None:
    result = doit("info", "docs", cwd=configured)
    assert result.returncode == 0, result.stderr
    assert "Rewrite the receipts page" in result.stdout
    assert "task_dep" in result.stdout and " - reader\n - writer" in result.stdout
    assert "'isolation': 'isolated'" in result.stdout
    typo = doit("info", "doc", cwd=configured)
    assert typo.returncode != 0 and 'did you mean "docs"' in typo.stderr
    assert "Traceback" not in typo.stderr
    assert leftovers(configured) == []


@pytest.mark.parametrize("args", [("run",), (), ("docs",), ("run", "schema"), ("strace", "schema")])
def test_doit_run_is_refused_with_a_pointer(configured: Path, args: tuple[str, ...]) -> None:
    result = doit(*args, cwd=configured)
    assert result.returncode != 0
    assert "stella fleet --plan plan.toml" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert leftovers(configured) == []


def test_plan_option_on_the_command_line(git_repo: Path) -> None:
    shutil.copy(EXAMPLES / "feature-buildout.yaml", git_repo / "other.yaml")
    (git_repo / "pyproject.toml").write_text('[tool.doit]\nloader = "stella"\n', encoding="utf-8")
    missing = doit("list", cwd=git_repo)
    assert missing.returncode != 0 and 'set plan = "plan.toml" under [tool.doit]' in missing.stderr
    result = doit("list", "--plan", "other.yaml", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    assert "writer" in result.stdout
    assert leftovers(git_repo) == []


def test_an_invalid_plan_reports_its_problems_without_a_traceback(git_repo: Path) -> None:
    shutil.copy(EXAMPLES / "invalid" / "cycle.toml", git_repo / "plan.toml")
    (git_repo / "pyproject.toml").write_text('[tool.doit]\nloader = "stella"\nplan = "plan.toml"\n')
    result = doit("list", cwd=git_repo)
    assert result.returncode != 0
    assert "plan.toml: dependency cycle: reader -> writer -> reader" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["forget", "ignore", "reset-dep"])
def test_state_commands_say_there_is_no_state(configured: Path, command: str) -> None:
    result = doit(command, cwd=configured)
    assert result.returncode != 0
    assert "doit keeps no state for it" in result.stderr and "Traceback" not in result.stderr
    assert leftovers(configured) == []


def test_a_repository_without_pyproject_uses_the_documented_doit_cfg(git_repo: Path) -> None:
    """A JavaScript project has no pyproject.toml: doit reads [GLOBAL] of doit.cfg (docs/plans.md)."""
    shutil.copy(EXAMPLES / "feature-buildout.toml", git_repo / "plan.toml")
    shutil.copy(EXAMPLES / "doit.cfg", git_repo / "doit.cfg")
    assert "doit.cfg" in (EXAMPLES.parent / "docs" / "plans.md").read_text()
    result = doit("list", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["schema", "reader", "writer", "docs"]
    refused = doit("run", cwd=git_repo)
    assert refused.returncode != 0 and "stella fleet --plan plan.toml" in refused.stderr
    assert leftovers(git_repo) == []
