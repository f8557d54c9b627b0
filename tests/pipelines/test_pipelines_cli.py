"""`stella pipelines`, pipeline preflight, and a third-party pipeline plugin installed from examples/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers.fleet import run_record
from helpers.repo import StellaRunner, git

from stellafleet import pipelines
from stellafleet.core.config import Config
from stellafleet.testing.fake_agent import write_shims

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stella-pipeline-example"


def fake_path(tmp_path: Path) -> str:
    bin_dir = write_shims(tmp_path / "fake-bin")
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def bare_path(tmp_path: Path) -> str:
    """A PATH with git and sh but surely no agent CLI."""
    bin_dir = tmp_path / "bare-bin"
    bin_dir.mkdir()
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_lists_every_wrapper_with_its_cli_and_version(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    proc = stella_main("pipelines", "--json", cwd=git_repo, env={"PATH": fake_path(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)["pipelines"]}
    assert {"plain", "command", "claude-code", "codex", "aider"} <= set(rows)
    claude = rows["claude-code"]
    assert (claude["wraps"], claude["version"], claude["ready"]) == ("claude", "2.0.14 (Claude Code)", True)
    assert claude["cli_path"] == str(tmp_path / "fake-bin" / "claude")
    assert claude["package"].startswith("stellafleet ")
    assert rows["codex"]["version"] == "codex-cli 0.46.0" and rows["codex"]["ready"]
    assert rows["aider"]["version"] == "aider 0.86.1" and rows["aider"]["ready"]
    assert rows["command"]["wraps"] is None

    table = stella_main("pipelines", cwd=git_repo, env={"PATH": fake_path(tmp_path)})
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "WRAPS", "ON", "PATH"]
    claude_line = next(line for line in lines if line.startswith("claude-code "))
    assert claude_line.split()[:5] == ["claude-code", "claude", "yes", "2.0.14", "(Claude"]


def test_missing_clis_are_listed_with_their_install_command(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    proc = stella_main("pipelines", cwd=git_repo, env={"PATH": bare_path(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    claude_line = next(line for line in out.splitlines() if line.startswith("claude-code "))
    assert claude_line.split()[:5] == ["claude-code", "claude", "no", "-", "not"]
    assert "claude-code: Claude Code CLI 'claude' not found on PATH: install it with " in out
    assert "`npm install -g @anthropic-ai/claude-code`" in out
    assert "`npm install -g @openai/codex`" in out
    assert "`pip install aider-chat`" in out


def test_configured_binary_is_what_is_looked_for(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    custom = tmp_path / "tools" / "claude-nightly"
    custom.parent.mkdir()
    shutil.copy(write_shims(tmp_path / "fake-bin", ["claude"]) / "claude", custom)
    (git_repo / ".stella").mkdir()
    (git_repo / ".stella/config.toml").write_text(f'[pipelines.claude-code]\nbinary = "{custom}"\n')
    proc = stella_main("pipelines", "--json", cwd=git_repo, env={"PATH": bare_path(tmp_path)})
    row = next(r for r in json.loads(proc.stdout)["pipelines"] if r["name"] == "claude-code")
    assert (row["wraps"], row["cli_path"], row["ready"]) == (str(custom), str(custom), True)


def test_preflight_names_every_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", bare_path(tmp_path))
    problems = pipelines.preflight(["codex", "claude-code", "codex", "nope"], Config({}))
    assert len(problems) == 3
    assert problems[0].startswith("pipeline codex: Codex CLI 'codex' not found on PATH")
    assert problems[1].startswith("pipeline claude-code: Claude Code CLI 'claude' not found on PATH")
    assert problems[2].startswith("unknown pipeline 'nope': installed pipelines are ")
    assert "claude-code" in problems[2] and "aider" in problems[2]
    bad = Config({"pipelines": {"aider": {"extra_args": 3}}})
    (problem,) = pipelines.preflight(["aider"], bad)
    assert (
        problem
        == "pipeline aider: config: pipelines.aider.extra_args must be a list of strings or a string, not 3"
    )
    monkeypatch.setenv("PATH", fake_path(tmp_path))
    assert pipelines.preflight(["claude-code", "codex", "aider"], Config({})) == []


# --- a third-party plugin ---


def install_example(target: Path) -> str:
    """Install the example plugin into target (for PYTHONPATH) the way pip would; returns how."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(EXAMPLE)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode == 0:
        return "pip"
    # pip needs a wheel-capable setuptools to build offline; without one, lay the distribution out by
    # hand exactly as an installer does: the package plus a .dist-info with METADATA and entry_points.txt.
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    shutil.copytree(EXAMPLE / "src" / "stella_pipeline_example", target / "stella_pipeline_example")
    info = target / f"stella_pipeline_example-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()) + "\n"
            for group, entries in groups.items()
        )
    )
    (info / "top_level.txt").write_text("stella_pipeline_example\n")
    (info / "INSTALLER").write_text("stella-tests\n")
    return "dist-info"


def test_third_party_plugin_is_listed_and_runs_a_task(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    target = tmp_path / "site"
    how = install_example(target)
    print(f"example plugin installed by {how}")
    env = {"PYTHONPATH": str(target)}
    listing = stella("pipelines", "--json", cwd=git_repo, env=env)
    assert listing.returncode == 0, listing.stderr
    rows = {row["name"]: row for row in json.loads(listing.stdout)["pipelines"]}
    notes = rows["notes"]
    assert notes["package"] == "stella-pipeline-example 0.1.0"
    assert notes["entry_point"] == "stella_pipeline_example:NotesPipeline"
    assert notes["ready"] and notes["version"] == "0.1.0"
    assert "claude-code" in rows  # the built-in variants are still there

    proc = stella("fleet", "--pipeline", "notes", "Remember to rotate the keys", cwd=git_repo, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        git_repo / "notes/t1.md"
    ).read_text() == "# Remember to rotate the keys\n\nRemember to rotate the keys\n"
    record = run_record(git_repo)
    (attempt,) = record["attempts"]
    assert attempt["pipeline"] == "notes" and attempt["outcome"] == "succeeded"
    (commit,) = record["commits"]
    assert commit["task_id"] == "t1"
    assert git("show", "--name-only", "--format=", commit["sha"], cwd=git_repo).split() == ["notes/t1.md"]


def test_a_broken_plugin_is_listed_as_broken_without_hiding_the_others(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    site = tmp_path / "site"
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stella.pipelines]\nbroken = no_such_module:Pipeline\n")
    proc = stella("pipelines", cwd=git_repo, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert (
        "broken: pipeline 'broken' failed to load from no_such_module:Pipeline: No module named"
        in proc.stdout
    )
    assert any(line.startswith("claude-code ") for line in proc.stdout.splitlines())


# --- the preflight protocol: the run's facts, and plugins written to the older one-argument form ---


class LegacyPipeline:
    """A plugin written before preflight took keywords."""

    name = "legacy"
    description = "old-style preflight"

    def __init__(self) -> None:
        self.calls: list[Config] = []

    def preflight(self, config: Config) -> str | None:
        self.calls.append(config)
        return None if config.get("pipelines.legacy.ok") else "set [pipelines.legacy] ok = true"


class ModelAwarePipeline:
    name = "aware"
    description = "new-style preflight"

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        self.calls.append({"spend_limited": spend_limited, "model": model})
        return f"no price for {model}" if spend_limited and model == "unpriced" else None


class KwargsPipeline:
    name = "kwargs"
    description = "takes any keywords"

    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def preflight(self, config: Config, **facts: object) -> str | None:
        self.seen = facts
        return None


def test_preflight_passes_the_run_facts_only_to_a_preflight_that_takes_them() -> None:
    legacy = LegacyPipeline()
    assert pipelines.ask_preflight(legacy, Config({}), spend_limited=True, model="m") == (
        "set [pipelines.legacy] ok = true"
    )
    ok = Config({"pipelines": {"legacy": {"ok": True}}})
    assert pipelines.ask_preflight(legacy, ok, spend_limited=True, model="m") is None
    assert len(legacy.calls) == 2

    aware = ModelAwarePipeline()
    assert (
        pipelines.ask_preflight(aware, Config({}), spend_limited=True, model="unpriced")
        == "no price for unpriced"
    )
    assert pipelines.ask_preflight(aware, Config({}), spend_limited=False, model="unpriced") is None
    assert aware.calls == [
        {"spend_limited": True, "model": "unpriced"},
        {"spend_limited": False, "model": "unpriced"},
    ]

    anything = KwargsPipeline()
    assert pipelines.ask_preflight(anything, Config({}), spend_limited=True, model=None) is None
    assert anything.seen == {"spend_limited": True, "model": None}


def test_an_old_style_plugin_preflight_still_gates_the_fleet(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    site = tmp_path / "site"
    (site / "legacy_plugin").mkdir(parents=True)
    (site / "legacy_plugin" / "__init__.py").write_text(
        "class Legacy:\n"
        "    name = 'legacy'\n    description = 'preflight(config) only'\n"
        "    def preflight(self, config):\n"
        "        return None if config.get('pipelines.legacy.ok') else 'set [pipelines.legacy] ok = true'\n"
        "    def version(self): return None\n"
        "    def run(self, ctx, config, spend): raise RuntimeError('not in a dry run')\n"
    )
    info = site / "legacy_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: legacy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stella.pipelines]\nlegacy = legacy_plugin:Legacy\n")
    env = {"PYTHONPATH": str(site)}
    args = ("--spend-limit", "1", "fleet", "--pipeline", "legacy", "Tidy up")
    refused = stella(*args, cwd=git_repo, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "pipeline legacy: set [pipelines.legacy] ok = true" in refused.stderr
    assert "preflight failed" not in refused.stderr  # called without the keywords it does not take
    assert not (git_repo / ".stella" / "private" / "fleet.db").exists()
    (git_repo / ".stella").mkdir()
    (git_repo / ".stella" / "config.toml").write_text("[pipelines.legacy]\nok = true\n")
    ready = stella(*args[:3], "--dry-run", *args[3:], cwd=git_repo, env=env)
    assert ready.returncode == 0, ready.stdout + ready.stderr
