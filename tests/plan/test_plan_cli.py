"""`stella plan ...` as a real process: check, show, list, info, schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.repo import StellaRunner

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID = sorted((EXAMPLES / "invalid").iterdir())


def expected_message(path: Path) -> str | None:
    """The `# expected: ...` line an invalid TOML or YAML example carries (message, file name relative)."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    found = re.match(r"# expected: (.*)", first)
    return found.group(1) if found else None


def test_invalid_examples_cover_every_error_kind() -> None:
    names = {path.stem for path in INVALID}
    assert {
        "duplicate-id",
        "self-dependency",
        "unknown-dependency",
        "cycle",
        "unknown-key",
        "malformed",
        "absolute-claim",
    } <= names


def test_every_invalid_example_that_can_carry_a_comment_names_its_message() -> None:
    """docs/plans.md promises the expected message in the first line; JSON has no comments."""
    assert [path.name for path in INVALID if path.suffix != ".json" and expected_message(path) is None] == []


@pytest.mark.parametrize("path", INVALID, ids=lambda path: path.name)
def test_each_invalid_example_exits_2_with_its_message(stella_main: StellaRunner, path: Path) -> None:
    result = stella_main("plan", "check", f"invalid/{path.name}", cwd=EXAMPLES)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith(f"invalid/{path.name}") for line in lines), lines
    expected = expected_message(path)
    if expected is not None:
        expected = f"invalid/{expected}"
        if expected.endswith("..."):
            assert lines[0].startswith(expected.removesuffix("...")), lines
        else:
            assert expected in lines, lines
    if path.name == "unknown-dependency.toml":
        assert lines == [
            'invalid/unknown-dependency.toml: task "reader": depends_on: unknown task "shema" '
            '(did you mean "schema"?)'
        ]
    if path.name == "cycle.toml":
        assert lines == ["invalid/cycle.toml: dependency cycle: reader -> writer -> reader"]


def test_check_several_files(stella_main: StellaRunner) -> None:
    result = stella_main(
        "plan", "check", "feature-buildout.toml", "feature-buildout.yaml", "invalid/cycle.toml", cwd=EXAMPLES
    )
    assert result.returncode == 2
    hint = (
        "hint: {}: isolated task docs waits for its dependencies but starts from the pinned base, "
        'without their work: set base = "parents" to start from it'
    )
    assert result.stdout.splitlines() == [
        "ok: feature-buildout.toml (4 tasks, 3 waves)",
        hint.format("feature-buildout.toml"),
        "ok: feature-buildout.yaml (4 tasks, 3 waves)",
        hint.format("feature-buildout.yaml"),
        "invalid/cycle.toml: dependency cycle: reader -> writer -> reader",
    ]
    ok = stella_main("plan", "check", "feature-buildout.json", cwd=EXAMPLES)
    assert (ok.returncode, ok.stdout.splitlines()) == (
        0,
        ["ok: feature-buildout.json (4 tasks, 3 waves)", hint.format("feature-buildout.json")],
    )


def test_check_refuses_a_directory_claim_and_an_unknown_pipeline(
    stella_main: StellaRunner, git_repo: Path
) -> None:
    (git_repo / "src").mkdir()
    (git_repo / "plan.toml").write_text(
        '[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["src"]\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\npipeline = "claud-code"\n'
    )
    result = stella_main("plan", "check", "plan.toml", cwd=git_repo)
    assert (result.returncode, result.stderr) == (2, "")
    assert result.stdout.splitlines() == [
        'plan.toml: task "a": claims: "src" is a directory; claims match exact file paths, so it would '
        "protect no file inside it: claim the files"
    ]
    (git_repo / "plan.toml").write_text('[[tasks]]\nid = "b"\nprompt = "p"\npipeline = "claud-code"\n')
    result = stella_main("plan", "check", "plan.toml", cwd=git_repo)
    assert result.returncode == 2
    assert result.stdout.startswith(
        'plan.toml: task "b": pipeline: unknown pipeline "claud-code" (did you mean "claude-code"?); '
        "installed pipelines are "
    )
    assert "ok:" not in result.stdout


def waves_in(text: str) -> list[list[str]]:
    waves: list[list[str]] = []
    for line in text.splitlines():
        if re.fullmatch(r"wave \d+", line):
            waves.append([])
        elif re.match(r"  \S", line) and waves:
            waves[-1].append(line.split()[0])
    return waves


def test_show_prints_the_waves(stella_main: StellaRunner) -> None:
    result = stella_main("plan", "show", "feature-buildout.toml", cwd=EXAMPLES)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("feature-buildout.toml: 4 tasks in 3 waves (no concurrency limit)")
    assert waves_in(result.stdout) == [["schema"], ["reader", "writer"], ["docs"]]
    assert "      depends on: reader, writer\n      claims: -\n      isolation: isolated" in result.stdout
    assert "      claims: src/store/schema.rs, src/store/migrations.rs" in result.stdout
    narrow = stella_main("plan", "show", "feature-buildout.yaml", "--max-concurrency", "1", cwd=EXAMPLES)
    assert narrow.returncode == 0
    assert "4 tasks in 4 waves (max concurrency 1)" in narrow.stdout
    assert waves_in(narrow.stdout) == [["schema"], ["reader"], ["writer"], ["docs"]]


def test_show_json(stella_main: StellaRunner) -> None:
    result = stella_main(
        "plan", "show", "feature-buildout.json", "--json", "--max-concurrency", "1", cwd=EXAMPLES
    )
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert document["waves"] == [["schema"], ["reader"], ["writer"], ["docs"]]
    assert document["max_concurrency"] == 1
    docs = document["tasks"][3]
    assert docs["id"] == "docs" and docs["wave"] == 4 and docs["isolation"] == "isolated"
    assert docs["depends_on"] == ["reader", "writer"]
    assert len(document["sha256"]) == 64


def test_show_rejects_a_bad_concurrency_and_a_bad_plan(stella_main: StellaRunner) -> None:
    bad = stella_main("plan", "show", "feature-buildout.toml", "--max-concurrency", "0", cwd=EXAMPLES)
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr
    invalid = stella_main("plan", "show", "invalid/cycle.toml", cwd=EXAMPLES)
    assert invalid.returncode == 2
    assert "dependency cycle: reader -> writer -> reader" in invalid.stderr
    assert "Traceback" not in invalid.stderr


def test_list_and_info_are_doits_views(stella_main: StellaRunner, tmp_path: Path) -> None:
    listing = stella_main("plan", "list", str(EXAMPLES / "feature-buildout.toml"), cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == ["schema", "reader", "writer", "docs"]
    info = stella_main("plan", "info", str(EXAMPLES / "feature-buildout.toml"), "docs", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert "Rewrite the receipts page" in info.stdout and " - reader\n - writer" in info.stdout
    typo = stella_main("plan", "info", str(EXAMPLES / "feature-buildout.toml"), "doc", cwd=tmp_path)
    assert typo.returncode == 2 and 'did you mean "docs"' in typo.stderr
    assert list(tmp_path.glob(".doit*")) == []


def test_schema_prints_the_bundled_file(stella_main: StellaRunner, tmp_path: Path) -> None:
    result = stella_main("plan", "schema", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == (REPO / "stellafleet" / "plan" / "plan.schema.json").read_text(encoding="utf-8")


def test_plan_without_a_subcommand_is_a_usage_error(stella_main: StellaRunner, tmp_path: Path) -> None:
    result = stella_main("plan", cwd=tmp_path)
    assert result.returncode == 2
    assert "check" in result.stderr and "schema" in result.stderr


def test_show_on_a_terminal_draws_a_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import sys

    from stellafleet.commands import plan as plan_command

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "160")
    args = argparse.Namespace(file=str(EXAMPLES / "feature-buildout.toml"), max_concurrency=2, json=False)
    assert plan_command.show_command(args) == 0
    out = capsys.readouterr().out
    assert "4 tasks in 3 waves (max concurrency 2)" in out
    rows = [line for line in out.splitlines() if "│" in line]
    assert any("schema" in row and "Add the migration" in row and "shared" in row for row in rows)
    assert any("docs" in row and "reader, writer" in row and "isolated" in row for row in rows)


def test_check_and_show_give_one_wave_count_and_say_emitted_tasks_add_waves(
    stella_main: StellaRunner,
) -> None:
    check = stella_main("plan", "check", "grow-modules.toml", cwd=EXAMPLES)
    assert check.stdout == "ok: grow-modules.toml (3 tasks, 3 waves, plus waves for emitted tasks)\n"
    show = stella_main("plan", "show", "grow-modules.toml", cwd=EXAMPLES)
    assert show.stdout.startswith(
        "grow-modules.toml: 3 tasks in 3 waves (no concurrency limit), plus waves for emitted tasks\n"
    ), show.stdout
