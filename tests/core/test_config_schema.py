"""The bundled config schema: one file in two places, every documented config passes, the code's defaults
are the schema's, and each kind of problem is one clear line."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from stellafleet.core import configschema, configsections
from stellafleet.core.config import Config, ConfigError, load_config
from stellafleet.pipelines.aider import AiderPipeline
from stellafleet.pipelines.claude_code import ClaudeCodePipeline
from stellafleet.pipelines.codex import CodexPipeline

REPO = Path(__file__).resolve().parents[2]
CANONICAL = REPO / "stellafleet" / "core" / "config.schema.json"
COPY = REPO / "schemas" / "config.schema.json"
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.MULTILINE | re.DOTALL)
NOT_CONFIG = re.compile(r"^\s*\[\[tasks\]\]|^\s*\[(defaults|tool\.|project)", re.MULTILINE)


def problems(data: dict[str, Any], installed: list[str] | None = None) -> list[str]:
    found = configschema.problems(data, installed=(lambda: installed) if installed is not None else None)
    return [problem.text for problem in found]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the file ---


def test_repository_copy_is_byte_identical_to_the_shipped_schema() -> None:
    assert COPY.read_bytes() == CANONICAL.read_bytes(), (
        "schemas/config.schema.json must be a byte-for-byte copy of stellafleet/core/config.schema.json: "
        "cp stellafleet/core/config.schema.json schemas/config.schema.json"
    )


def test_schema_is_draft_2020_12_with_an_id() -> None:
    schema = json.loads(CANONICAL.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("https://")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert configschema.BUNDLED.text == CANONICAL.read_text(encoding="utf-8")


def config_examples() -> list[tuple[str, str]]:
    """Every ```toml block of the docs that is a config (not a plan, not a pyproject), and the examples."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, block in enumerate(TOML_BLOCK.findall(doc.read_text(encoding="utf-8")), 1):
            if not NOT_CONFIG.search(block):
                found.append((f"{doc.relative_to(REPO)} block {number}", block))
    for example in sorted((REPO / "examples").rglob("config.toml")):
        found.append((str(example.relative_to(REPO)), example.read_text(encoding="utf-8")))
    return found


def test_the_docs_show_configs_of_every_section() -> None:
    sections = {key for _, block in config_examples() for key in tomllib.loads(block)}
    assert sections >= {"engine", "prices", "fleet", "governor", "pipelines", "watch"}


@pytest.mark.parametrize(("where", "text"), config_examples(), ids=[where for where, _ in config_examples()])
def test_every_documented_config_passes(where: str, text: str) -> None:
    data = tomllib.loads(text)
    assert problems(data, installed=[]) == []
    jsonschema.Draft202012Validator(configschema.BUNDLED.data).validate(data)


def test_config_md_documents_every_key() -> None:
    text = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    schema = configschema.BUNDLED.data
    for section, table in schema["properties"].items():
        assert f"### [{section}" in text, section
        keys = schema["$defs"]["price"]["properties"] if section == "prices" else table.get("properties", {})
        if section != "pipelines":
            for key in keys:
                assert f"| `{key}` |" in text, f"{section}.{key}"
    tables = schema["properties"]["pipelines"]["properties"]
    for name in configsections.BUILTIN_PIPELINES:
        assert f"[pipelines.{name}]" in text, name
        for key in tables[name].get("properties", {}):
            assert f"| `{key}" in text, f"pipelines.{name}.{key}"


# --- the code agrees with it ---


def schema_default(section: str, key: str) -> Any:
    return configschema.BUNDLED.data["properties"][section]["properties"][key].get("default")


@pytest.mark.parametrize(
    ("section", "kind"),
    [
        ("engine", configsections.EngineConfig),
        ("fleet", configsections.FleetConfig),
        ("governor", configsections.GovernorConfig),
        ("watch", configsections.WatchConfig),
        ("merge", configsections.MergeConfig),
        ("worktree", configsections.WorktreeConfig),
        ("resources", configsections.ResourcesConfig),
    ],
)
def test_typed_sections_have_the_schemas_keys_and_defaults(section: str, kind: type) -> None:
    keys = list(configschema.BUNDLED.data["properties"][section]["properties"])
    assert [spec.name for spec in dataclasses.fields(kind)] == keys
    for spec in dataclasses.fields(kind):
        default = None if spec.default is dataclasses.MISSING else spec.default
        assert schema_default(section, spec.name) == default, f"{section}.{spec.name}"


SECTIONS: dict[str, type] = {
    "engine": configsections.EngineConfig,
    "fleet": configsections.FleetConfig,
    "executor": configsections.ExecutorConfig,
    "governor": configsections.GovernorConfig,
    "watch": configsections.WatchConfig,
    "notify": configsections.NotifyConfig,
    "commit": configsections.CommitConfig,
    "merge": configsections.MergeConfig,
    "worktree": configsections.WorktreeConfig,
    "resources": configsections.ResourcesConfig,
}


def _schema_defaults(node: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    found: dict[tuple[str, ...], Any] = {path: node["default"]} if "default" in node else {}
    for key, child in node.get("properties", {}).items():
        found.update(_schema_defaults(child, (*path, key)))
    return found


def test_the_code_is_the_one_source_of_defaults_and_the_schema_shows_each() -> None:
    # `stella config schema` prints the schema's defaults: every one is the code's, and every default of
    # the code (but None: unset) is shown there, so neither can change alone
    code: dict[tuple[str, ...], Any] = {
        (section, spec.name): spec.default
        for section, kind in SECTIONS.items()
        for spec in dataclasses.fields(kind)
        if spec.default is not dataclasses.MISSING and spec.default is not None
    }
    for pipeline in (ClaudeCodePipeline, CodexPipeline, AiderPipeline):
        code["pipelines", pipeline.name, "binary"] = pipeline.default_binary
    shown = _schema_defaults(configschema.BUNDLED.data)
    assert shown == code
    assert all(type(shown[key]) is type(value) or isinstance(value, float) for key, value in code.items())
    assert set(configschema.BUNDLED.data["properties"]) == {*SECTIONS, "prices", "pipelines"}


def test_the_builtin_pipelines_are_the_schemas_and_their_default_binaries_match() -> None:
    tables = configschema.BUNDLED.data["properties"]["pipelines"]["properties"]
    assert list(tables) == list(configsections.BUILTIN_PIPELINES)
    for pipeline in (ClaudeCodePipeline, CodexPipeline, AiderPipeline):
        assert tables[pipeline.name]["properties"]["binary"]["default"] == pipeline.default_binary


# --- each kind of problem, in words ---


def test_an_unknown_key_gets_the_closest_known_one() -> None:
    assert problems({"fleet": {"max_concurency": 4}}) == [
        'fleet.max_concurency is not a known key (did you mean "max_concurrency"?)'
    ]
    assert problems({"prices": {"m": {"input_per_mtok": 1, "output_per_mtok": 1, "input": 2}}}) == [
        'prices.m.input is not a known key (did you mean "input_per_mtok"?)'
    ]
    (listing,) = problems({"governor": {"zzz": 1}})
    keys = "workers_per_core, memory_per_worker_gib, max, min_guard_usd"
    assert listing == f"governor.zzz is not a known key (keys: {keys})"
    assert problems({"pipelines": {"plain": {"model": "x"}}}) == [
        "pipelines.plain.model is not a known key ([pipelines.plain] takes no keys)"
    ]


def test_a_removed_setting_is_an_unknown_key_that_says_it_is_gone() -> None:
    assert problems({"fleet": {"fork_workers": False}, "pipelines": {"command": {"direct": True}}}) == [
        "fleet.fork_workers is not a known key "
        "(this setting was removed: every task is one plain worker process now; delete it)",
        "pipelines.command.direct is not a known key "
        "(this setting was removed: every command task runs under its own worker process now; delete it)",
    ]


def test_an_unknown_section_gets_the_closest_known_one() -> None:
    assert problems({"flet": {}}) == ["[flet] is not a known section (did you mean [fleet]?)"]
    (listing,) = problems({"zzz": 1})
    assert listing.startswith("[zzz] is not a known section (sections: [engine], [prices], [fleet],")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"watch": {"force_push": "yes"}}, 'watch.force_push must be true or false, not a string ("yes")'),
        ({"fleet": {"max_concurrency": 0}}, "fleet.max_concurrency must be a whole number >= 1, not 0"),
        ({"fleet": {"max_concurrency": 2.5}}, "fleet.max_concurrency must be a whole number >= 1, not 2.5"),
        (
            {"governor": {"workers_per_core": True}},
            "governor.workers_per_core must be a positive number, not a boolean (true)",
        ),
        ({"watch": {"remote": " "}}, 'watch.remote must be a non-empty string, not a string (" ")'),
        (
            {"engine": {"provider": "gemini"}},
            'engine.provider must be one of openai, anthropic, not a string ("gemini")',
        ),
        ({"engine": "x"}, '[engine] must be a table, not a string ("x")'),
        ({"prices": {"qwen2.5:14b": 3}}, 'prices."qwen2.5:14b" must be a table, not 3'),
        (
            {"pipelines": {"codex": {"extra_args": [1]}}},
            "pipelines.codex.extra_args[0] must be a string, not 1",
        ),
        (
            {"fleet": {"pipeline": "two words"}},
            "fleet.pipeline must be a name of letters, digits, '.', '_' and '-', "
            'not a string ("two words")',
        ),
    ],
)
def test_a_wrong_value_says_what_it_must_be(data: dict[str, Any], problem: str) -> None:
    assert problems(data) == [problem]


def test_a_missing_price_is_named_with_what_it_means() -> None:
    assert problems({"prices": {"m": {"input_per_mtok": 1}}}) == [
        "prices.m.output_per_mtok is missing: dollars per million output tokens"
    ]


def test_every_problem_at_once_in_document_order() -> None:
    data = tomllib.loads(
        '[watch]\npoll_interval = 0\n[flet]\n[fleet]\nstop_grace = "soon"\nmax_concurency = 2\n'
    )
    assert problems(data) == [
        "watch.poll_interval must be a positive number, not 0",
        "[flet] is not a known section (did you mean [fleet]?)",
        'fleet.stop_grace must be a number >= 0, not a string ("soon")',
        'fleet.max_concurency is not a known key (did you mean "max_concurrency"?)',
    ]


def test_a_pipeline_table_must_be_built_in_or_installed() -> None:
    data = {"pipelines": {"notes": {"folder": 3}, "codx": {}}}
    assert problems(data, installed=["notes"]) == [
        '[pipelines.codx] is not a built-in or installed pipeline (did you mean "codex"?)'
    ]
    assert problems(data) == []  # without the installed names, tables are taken as written
    (listing,) = problems({"pipelines": {"zzz": {}}}, installed=[])
    assert listing.endswith("(pipelines: aider, claude-code, codex, command, plain)")


# --- layers, and configs built in code ---


def test_a_price_table_may_be_split_across_layers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / ".config/stella/config.toml", '[prices."m"]\ninput_per_mtok = 1\n')
    write(tmp_path / ".stella/config.toml", '[prices."m"]\noutput_per_mtok = 2\n')
    config = load_config(tmp_path, env={"HOME": str(home)})
    assert config.prices["m"] == configsections.PriceConfig(1.0, 2.0)
    write(tmp_path / ".stella/config.toml", '[prices."n"]\noutput_per_mtok = 2\n')
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path, env={"HOME": str(home)})
    assert raised.value.problems == [
        f"{home}/.config/stella/config.toml: prices.m.output_per_mtok is missing: "
        "dollars per million output tokens",
        f"{tmp_path}/.stella/config.toml: prices.n.input_per_mtok is missing: "
        "dollars per million input tokens",
    ]


def test_an_environment_variable_is_checked_and_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path, env={"HOME": str(tmp_path), "STELLA_PROVIDER": "gemini"})
    assert raised.value.problems == [
        '$STELLA_PROVIDER: engine.provider must be one of openai, anthropic, not a string ("gemini")'
    ]
    assert raised.value.exit_code == 2


def test_typed_sections_are_built_once_from_checked_data(tmp_path: Path) -> None:
    write(
        tmp_path / ".stella/config.toml",
        '[engine]\nmodel = "m"\nmax_steps = 7\nmax_wall_seconds = 60\n'
        "[pipelines.claude-code]\nextra_args = \"--add-dir 'a b'\"\n"
        '[pipelines.command.tasks."docs.v2"]\nrun = "make docs"\n'
        "[fleet]\nmax_concurrency = 3\n",
    )
    config = load_config(tmp_path, env={"HOME": str(tmp_path)})
    assert config.engine.max_steps == 7 and isinstance(config.engine.max_steps, int)
    assert config.engine.max_wall_seconds == 60.0 and isinstance(config.engine.max_wall_seconds, float)
    assert config.fleet == configsections.FleetConfig(max_concurrency=3)
    assert config.governor == configsections.GovernorConfig()
    assert config.agent_cli("claude-code").extra_args == ("--add-dir", "a b")
    assert config.agent_cli("codex") == configsections.AgentCliConfig()
    assert config.pipelines.command.command_for("docs.v2") == "make docs"
    assert config.pipelines.command.command_for("other") is None
    assert config.engine is config.engine  # built once


def test_a_config_built_in_code_is_checked_section_by_section() -> None:
    config = Config({"watch": {"poll_interval": 0}, "fleet": {"max_concurrency": 2}})
    assert config.fleet.max_concurrency == 2  # a bad [watch] does not stop [fleet] being read
    with pytest.raises(ConfigError) as raised:
        config.watch  # noqa: B018
    assert raised.value.problems == ["config: watch.poll_interval must be a positive number, not 0"]
    engine, found = Config({"engine": {"model": "m", "shell": "yes"}}).checked("engine")
    assert engine == configsections.EngineConfig(model="m")  # built from the keys that are right
    assert found == ['config: engine.shell must be true or false, not a string ("yes")']


def test_a_third_party_wrappers_table_is_checked_when_read_as_an_agent_cli() -> None:
    config = Config({"pipelines": {"house-agent": {"binary": "ha", "max_turns": 0}}})
    assert config.pipelines.plugins["house-agent"] == {"binary": "ha", "max_turns": 0}
    with pytest.raises(
        ConfigError, match=r"config: pipelines.house-agent.max_turns must be a whole number >= 1"
    ):
        config.agent_cli("house-agent")
    assert Config({"pipelines": {"house-agent": {"binary": "ha"}}}).agent_cli("house-agent").binary == "ha"
