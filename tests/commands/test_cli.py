"""The global command line: spend-limit placement, version, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.repo import stella_here

from stellafleet import __version__
from stellafleet.cli import main, misplaced_spend_limit


def stella(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return stella_here(*args, cwd=cwd, env=env, timeout=60)


@pytest.mark.parametrize(
    ("argv", "corrected"),
    [
        (
            ["fleet", "--plan", "p.toml", "--spend-limit", "8"],
            "stella --spend-limit 8 fleet --plan p.toml",
        ),
        (
            ["fleet", "--plan", "release-prep.toml", "--max-concurrency", "3", "--spend-limit=8", "--watch"],
            "stella --spend-limit 8 fleet --plan release-prep.toml --max-concurrency 3 --watch",
        ),
        (["-C", "repo", "fleet", "A", "--spend-limit", "2"], "stella -C repo --spend-limit 2 fleet A"),
    ],
)
def test_misplaced_spend_limit_is_corrected(argv: list[str], corrected: str) -> None:
    assert misplaced_spend_limit(argv) == corrected


@pytest.mark.parametrize(
    "argv",
    [
        ["--spend-limit", "8", "fleet", "--plan", "p.toml"],
        ["fleet", "A", "--", "--spend-limit"],
        ["plan", "check", "p.toml"],
        [],
    ],
)
def test_well_placed_spend_limit_is_left_alone(argv: list[str]) -> None:
    assert misplaced_spend_limit(argv) is None


def test_misplaced_spend_limit_exits_2_with_the_corrected_line(tmp_path: Path) -> None:
    result = stella("fleet", "--plan", "feature-buildout.toml", "--spend-limit", "8", cwd=tmp_path)
    assert result.returncode == 2
    assert "stella --spend-limit 8 fleet --plan feature-buildout.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_version() -> None:
    result = stella("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"stella {__version__}"


def test_help_documents_exit_codes() -> None:
    result = stella("--help")
    assert result.returncode == 0
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "130"):
        assert f"  {code}" in result.stdout


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf"])
def test_bad_spend_limit_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"--spend-limit={value}", "plan", "schema"]) == 2
    err = capsys.readouterr().err
    assert "--spend-limit" in err
    assert "Traceback" not in err


def test_bad_spend_limit_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STELLA_SPEND_LIMIT", "lots")
    assert main(["plan", "schema"]) == 2
    assert "STELLA_SPEND_LIMIT" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error() -> None:
    result = stella("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_directory_for_dash_c(tmp_path: Path) -> None:
    result = stella("-C", str(tmp_path / "nope"), "runs")
    assert result.returncode == 2
    assert "No such file or directory" in result.stderr


def test_a_command_imports_only_what_it_needs(tmp_path: Path) -> None:
    # Workers run `stella commit` often: it must not pay for doit, the dashboard or the engine.
    code = (
        "import sys\n"
        "from stellafleet.cli import main\n"
        "main(['commit', '-m', 'x', 'a'])\n"
        "heavy = sorted(m for m in ('doit', 'stellafleet.run.waves', 'stellafleet.observatory.server',"
        " 'stellafleet.engine.loop', 'rich.console') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
