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
    assert config.origins[("engine", "model")] == "$STELLA_MODEL"


def test_explicit_config_file_replaces_the_project_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / ".stella/config.toml", '[pipelines.command]\nrun = "project"\n')
    other = write(tmp_path / "other.toml", '[pipelines.command]\nrun = "other"\n')
    config = load_config(repo, config_file=other, env={"HOME": str(tmp_path)})
    assert config.get("pipelines.command.run") == "other"
    assert config.get("pipelines.command") == {"run": "other"}


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
        _ = config.engine


def _number_keys(node: dict, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every (dotted path, type) of the config schema whose value is a number or a whole number."""
    from stellafleet.core import configschema

    if "$ref" in node:
        node = configschema.BUNDLED.data["$defs"][node["$ref"].removeprefix("#/$defs/")]
    if node.get("type") in ("number", "integer"):
        return [(path, node["type"])]
    found = []
    for key, child in node.get("properties", {}).items():
        found += _number_keys(child, (*path, key))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        found += _number_keys(extra, (*path, "some-name"))
    return found


def test_nan_and_infinity_are_refused_for_every_number_and_a_float_for_every_count(tmp_path: Path) -> None:
    from stellafleet.core import configschema

    keys = _number_keys(configschema.BUNDLED.data)
    assert len(keys) > 20 and (("notify", "timeout"), "number") in keys
    assert (("engine", "max_steps"), "integer") in keys
    for path, kind in keys:
        values = ["nan", "inf", "-inf"] + (["1e9", "2.0"] if kind == "integer" else [])
        for value in values:
            table, key = ".".join(f'"{part}"' for part in path[:-1]), path[-1]
            config_file = write(tmp_path / "c.toml", f"[{table}]\n{key} = {value}\n")
            with pytest.raises(StellaError) as caught:
                load_config(None, config_file=config_file, env={"HOME": str(tmp_path)})
            shown = {"nan": "nan", "inf": "inf", "-inf": "-inf", "1e9": "1000000000.0", "2.0": "2.0"}[value]
            assert f"{'.'.join(path)} must be a " in str(caught.value), (path, value)
            assert f", not {shown}" in str(caught.value), (path, value)


def test_base_url_must_be_http_or_https_from_a_file_or_the_environment(tmp_path: Path) -> None:
    for url in ("file:///etc/passwd", "ftp://host", "localhost:8080", "http://"):
        config_file = write(tmp_path / "c.toml", f'[engine]\nbase_url = "{url}"\n')
        with pytest.raises(StellaError, match=r"engine\.base_url must be an http:// or https:// URL"):
            load_config(None, config_file=config_file, env={"HOME": str(tmp_path)})
        with pytest.raises(StellaError, match=r"\$STELLA_BASE_URL: engine\.base_url must be an http"):
            load_config(None, env={"HOME": str(tmp_path), "STELLA_BASE_URL": url})
    for url in ("http://127.0.0.1:8080/v1", "https://api.example.com"):
        assert (
            load_config(None, env={"HOME": str(tmp_path), "STELLA_BASE_URL": url}).get("engine.base_url")
            == url
        )
