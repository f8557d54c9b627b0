"""A bad config stops every command with exit 2 before anything runs, naming file, key and hint;
`stella config show` reports each setting's source, `stella config schema` prints the bundled schema."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def refused(result: subprocess.CompletedProcess[str], *problems: str) -> None:
    """Exit 2 with exactly these problems on stderr (one is an error line), nothing else, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    expected = [f"stella: error: {problems[0]}"] if len(problems) == 1 else list(problems)
    assert result.stderr.splitlines() == expected
    assert result.stdout == ""


def test_an_unknown_key_stops_the_fleet_before_anything_runs(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    config = write(git_repo / ".stella/config.toml", "[fleet]\nmax_concurency = 4\n")
    result = stella_main("fleet", "--pipeline", "command", "Fix the tests", cwd=git_repo)
    refused(result, f'{config}: fleet.max_concurency is not a known key (did you mean "max_concurrency"?)')
    assert not StatePaths(git_repo).fleet_db.exists()


def test_a_removed_setting_stops_the_fleet_and_says_it_is_gone(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    config = write(git_repo / ".stella/config.toml", "[fleet]\nfork_workers = false\n")
    gone = "this setting was removed: every task is one plain worker process now; delete it"
    refused(
        stella_main("config", "show", cwd=git_repo),
        f"{config}: fleet.fork_workers is not a known key ({gone})",
    )
    write(config, '[pipelines.command]\nrun = "true"\ndirect = true\n')
    refused(
        stella_main("fleet", "--dry-run", "--pipeline", "command", "Fix the tests", cwd=git_repo),
        f"{config}: pipelines.command.direct is not a known key (this setting was removed: "
        "every command task runs under its own worker process now; delete it)",
    )
    assert not StatePaths(git_repo).fleet_db.exists()


def test_a_wrong_type_names_the_expected_type(git_repo: Path, stella_main: StellaRunner) -> None:
    config = write(git_repo / ".stella/config.toml", '[watch]\npoll_interval = "30s"\n')
    refused(
        stella_main("config", "show", cwd=git_repo),
        f'{config}: watch.poll_interval must be a positive number, not a string ("30s")',
    )


def test_an_unknown_section_gets_the_closest_one(git_repo: Path, stella_main: StellaRunner) -> None:
    config = write(git_repo / ".stella/config.toml", "[governer]\nmax = 4\n")
    refused(
        stella_main("run", "Fix the tests", cwd=git_repo),
        f"{config}: [governer] is not a known section (did you mean [governor]?)",
    )


def test_every_problem_of_every_file_at_once(
    git_repo: Path, isolated_home: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    user = write(isolated_home / ".config/stella/config.toml", "[engine]\nshell = 1\n")
    given = write(tmp_path / "ci.toml", '[watch]\nforce_push = "no"\n[prices."m"]\ninput_per_mtok = 1\n')
    refused(
        stella_main("--config", str(given), "pipelines", cwd=git_repo, env={"STELLA_PROVIDER": "gemini"}),
        f"{user}: engine.shell must be true or false, not 1",
        f'{given}: watch.force_push must be true or false, not a string ("no")',
        '$STELLA_PROVIDER: engine.provider must be one of openai, anthropic, not a string ("gemini")',
        f"{given}: prices.m.output_per_mtok is missing: dollars per million output tokens",
    )


def test_a_pipeline_table_needs_a_built_in_or_installed_pipeline(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    site = tmp_path / "site"  # an installed plugin, as an installer lays it out (it need not import)
    write(
        site / "notes_plugin-1.0.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: notes-plugin\nVersion: 1.0\n",
    )
    write(
        site / "notes_plugin-1.0.dist-info/entry_points.txt", "[stella.pipelines]\nnotes = notes:Pipeline\n"
    )
    config = write(
        git_repo / ".stella/config.toml", '[pipelines.notes]\nfolder = "notes"\nanything = [1, 2]\n'
    )
    shown = stella("config", "show", "--json", cwd=git_repo, env={"PYTHONPATH": str(site)})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["config"]["pipelines"]["notes"] == {"folder": "notes", "anything": [1, 2]}
    refused(
        stella("config", "show", cwd=git_repo),
        f"{config}: [pipelines.notes] is not a built-in or installed pipeline "
        "(pipelines: aider, claude-code, codex, command, plain)",
    )
    write(config, "[pipelines.codx]\n")
    refused(
        stella("config", "show", cwd=git_repo),
        f'{config}: [pipelines.codx] is not a built-in or installed pipeline (did you mean "codex"?)',
    )


def test_show_says_where_each_value_came_from(
    git_repo: Path, isolated_home: Path, stella_main: StellaRunner
) -> None:
    user = write(isolated_home / ".config/stella/config.toml", '[engine]\nmodel = "user-model"\n')
    project = write(
        git_repo / ".stella/config.toml",
        '[engine]\nmax_steps = 7\n[pipelines.command]\nrun = "make fix"\n[prices."qwen2.5:14b"]\n'
        "input_per_mtok = 0\noutput_per_mtok = 0\n",
    )
    result = stella_main("config", "show", "--json", cwd=git_repo, env={"STELLA_MODEL": "env-model"})
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["files"] == [
        {"kind": "user", "path": str(user), "exists": True},
        {"kind": "project", "path": str(project), "exists": True},
    ]
    assert shown["config"]["engine"]["model"] == "env-model"
    assert shown["config"]["engine"]["max_steps"] == 7
    assert shown["config"]["watch"]["poll_interval"] == 30.0
    sources = shown["sources"]
    assert sources["engine.model"] == "$STELLA_MODEL"
    assert sources["engine.max_steps"] == str(project)
    assert sources["pipelines.command.run"] == str(project)
    assert sources['prices."qwen2.5:14b".input_per_mtok'] == str(project)
    assert sources["watch.poll_interval"] == "default"
    assert "engine.provider" not in sources  # unset, and no default of its own

    text = stella_main("config", "show", cwd=git_repo, env={"STELLA_MODEL": "env-model"})
    assert text.returncode == 0, text.stderr
    for line in ('model = "env-model" +# \\$STELLA_MODEL', f"max_steps = 7 +# {re.escape(str(project))}"):
        assert re.search(f"^{line}$", text.stdout, re.MULTILINE), text.stdout
    assert re.search("^poll_interval = 30.0 +# default$", text.stdout, re.MULTILINE)
    assert '[prices."qwen2.5:14b"]' in text.stdout.splitlines()


def test_show_shows_every_section_of_the_schema_and_each_sections_own_settings(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    project = write(
        git_repo / ".stella/config.toml",
        '[notify]\ncommand = "notify-send"\n[executor]\nresources = {gpu = 1}\n'
        '[executor.tasks.train]\nresources = {gpu_box = 1}\n[commit]\nhooks = "skip"\n'
        '[merge]\nwindow = 4\n[worktree]\nsetup = "npm ci"\n[resources]\nports = 2\n'
        '[pipelines.command]\nrun = "make"\n',
    )
    result = stella_main("config", "show", "--json", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    schema = json.loads((REPO / "stellafleet" / "core" / "config.schema.json").read_text(encoding="utf-8"))
    assert list(shown["config"]) == [name for name in schema["properties"] if name != "prices"]  # none set
    config, sources = shown["config"], shown["sources"]
    assert config["executor"]["tasks"] == {"train": {"resources": {"gpu_box": 1}}}  # as its file says it
    for key in (
        "notify.command", "executor.resources.gpu", "executor.tasks.train.resources.gpu_box", "commit.hooks",
        "merge.window", "worktree.setup", "resources.ports",
    ):  # fmt: skip
        assert sources[key] == str(project), key
    assert (config["merge"]["strategy"], sources["merge.strategy"]) == ("rebase", "default")

    text = stella_main("config", "show", cwd=git_repo).stdout
    for table in ("[notify]", "[executor]", "[executor.tasks.train.resources]", "[commit]", "[merge]"):
        assert table in text.splitlines(), table


def test_show_reads_the_file_given_with_config_instead_of_the_projects(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    write(git_repo / ".stella/config.toml", "[fleet]\nmax_concurrency = 2\n")
    given = write(tmp_path / "other.toml", "[fleet]\nmax_concurrency = 5\n")
    result = stella_main("--config", str(given), "config", "show", "--json", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["files"][1] == {"kind": "--config", "path": str(given), "exists": True}
    assert shown["config"]["fleet"]["max_concurrency"] == 5
    assert shown["sources"]["fleet.max_concurrency"] == str(given)


def test_schema_prints_the_bundled_file(stella_main: StellaRunner, tmp_path: Path) -> None:
    result = stella_main("config", "schema", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    bundled = (REPO / "stellafleet" / "core" / "config.schema.json").read_text(encoding="utf-8")
    assert result.stdout == bundled
    assert json.loads(result.stdout)["title"] == "stella configuration"


def test_config_without_a_subcommand_is_a_usage_error(stella_main: StellaRunner, tmp_path: Path) -> None:
    result = stella_main("config", cwd=tmp_path)
    assert result.returncode == 2
    assert "show" in result.stderr and "schema" in result.stderr


def test_show_names_stella_base_url_as_the_origin_of_engine_base_url(
    git_repo: Path, stella_main: StellaRunner
) -> None:
    url = "http://127.0.0.1:9/v1"
    result = stella_main("config", "show", "--json", cwd=git_repo, env={"STELLA_BASE_URL": url})
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["config"]["engine"]["base_url"] == url
    assert shown["sources"]["engine.base_url"] == "$STELLA_BASE_URL"
    text = stella_main("config", "show", cwd=git_repo, env={"STELLA_BASE_URL": url})
    assert re.search(rf'^base_url = "{re.escape(url)}" +# \$STELLA_BASE_URL$', text.stdout, re.MULTILINE)
