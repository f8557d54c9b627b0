"""Layered configuration: user file < project file < environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import StellaError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_project_overrides_user_and_environment_overrides_both(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / ".config/stella/config.toml", '[engine]\nmodel = "user-model"\nmax_steps = 7\n')
    repo = tmp_path / "repo"
    write(repo / ".stella/config.toml", '[engine]\nmodel = "project-model"\n')
    config = load_config(repo, env={"HOME": str(home)})
    assert config.get("engine.model") == "project-model"
    assert config.get("engine.max_steps") == 7
    config = load_config(repo, env={"HOME": str(home), "STELLA_MODEL": "env-model"})
    assert config.get("engine.model") == "env-model"
    assert config.sources[-1] == "$STELLA_MODEL"


def test_explicit_config_file_replaces_the_project_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / ".stella/config.toml", '[pipelines.command]\nrun = "project"\n')
    other = write(tmp_path / "other.toml", '[pipelines.command]\nrun = "other"\n')
    config = load_config(repo, config_file=other, env={"HOME": str(tmp_path)})
    assert config.get("pipelines.command.run") == "other"
    assert config.section("pipelines.command") == {"run": "other"}


def test_missing_and_invalid_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(StellaError, match="config file not found"):
        load_config(tmp_path, config_file=tmp_path / "missing.toml", env={"HOME": str(tmp_path)})
    write(tmp_path / ".stella/config.toml", "[engine\nmodel=")
    with pytest.raises(StellaError, match="invalid TOML"):
        load_config(tmp_path, env={"HOME": str(tmp_path)})


def test_section_must_be_a_table(tmp_path: Path) -> None:
    write(tmp_path / ".stella/config.toml", 'engine = "x"\n')
    with pytest.raises(StellaError, match=r"\[engine\] must be a table"):
        load_config(tmp_path, env={"HOME": str(tmp_path)})  # a loaded config is checked as it loads
    config = Config({"engine": "x"})
    assert config.get("engine.model", "fallback") == "fallback"
    with pytest.raises(StellaError, match=r"\[engine\] must be a table"):
        config.section("engine")
