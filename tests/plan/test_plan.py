"""Plan loading and checking: formats, defaults, claims, every kind of problem, waves."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from stellafleet.core.errors import EXIT_USAGE, PlanError, StellaError
from stellafleet.plan.model import (
    Plan,
    PlanTask,
    load_plan,
    normalise_claim,
    plan_from_data,
    plan_from_prompts,
    title_from,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILDOUT = ["feature-buildout.toml", "feature-buildout.json", "feature-buildout.yaml"]


def problems_of(path: Path | str) -> list[str]:
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert caught.value.exit_code == EXIT_USAGE
    return caught.value.problems


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", BUILDOUT)
def test_feature_buildout_waves(name: str) -> None:
    plan = load_plan(EXAMPLES / name)
    assert plan.ids == ("schema", "reader", "writer", "docs")
    assert plan.waves(3) == [["schema"], ["reader", "writer"], ["docs"]]
    assert plan.waves(2) == [["schema"], ["reader", "writer"], ["docs"]]
    assert plan.waves(1) == [["schema"], ["reader"], ["writer"], ["docs"]]
    docs = plan.task("docs")
    assert docs.isolation == "isolated" and docs.depends_on == ("reader", "writer")
    assert plan.task("schema").claims == ("src/store/schema.rs", "src/store/migrations.rs")
    assert plan.task("reader").title == "Read path"
    assert plan.source == str(EXAMPLES / name)
    assert plan.sha256 is not None and len(plan.sha256) == 64


def test_the_three_formats_give_the_same_plan() -> None:
    tasks = {load_plan(EXAMPLES / name).tasks for name in BUILDOUT}
    assert len(tasks) == 1


def test_plan_is_immutable() -> None:
    plan = load_plan(EXAMPLES / "feature-buildout.toml")
    assert isinstance(plan.tasks, tuple) and all(isinstance(t.claims, tuple) for t in plan.tasks)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tasks[0].id = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.source = "x"  # type: ignore[misc]


def test_unknown_task_lookup_suggests() -> None:
    plan = load_plan(EXAMPLES / "feature-buildout.toml")
    with pytest.raises(StellaError, match=r'no task "shema" .*\(did you mean "schema"\?\)'):
        plan.task("shema")


def test_defaults_apply_unless_a_task_overrides(tmp_path: Path) -> None:
    plan = load_plan(EXAMPLES / "with-defaults.toml")
    bump, notes = plan.tasks
    assert (bump.pipeline, bump.timeout, bump.isolation) == ("plain", 1800.0, "shared")
    assert (notes.pipeline, notes.timeout, notes.isolation) == ("plain", 600.0, "isolated")
    assert notes.model is None
    bare = plan_from_data({"tasks": [{"id": "a", "prompt": "p"}]})
    assert bare.tasks[0] == PlanTask(id="a", prompt="p", title="p")


def test_title_defaults_to_the_first_line_of_the_prompt() -> None:
    assert title_from("\n  Fix the parser  \nand more details") == "Fix the parser"
    long = "word " * 40
    title = title_from(long)
    assert len(title) <= 72 and title.endswith("...")
    plan = plan_from_data({"tasks": [{"id": "a", "prompt": "First line\nsecond", "title": " Given "}]})
    assert plan.tasks[0].title == "Given"


def test_inline_prompts() -> None:
    plan = plan_from_prompts(["Add unit tests for the parser module", "Document src/api/\nevery function"])
    assert plan.ids == ("t1", "t2")
    assert plan.tasks[1].title == "Document src/api/"
    assert plan.tasks[1].prompt == "Document src/api/\nevery function"
    assert plan.waves(5) == [["t1", "t2"]]
    assert plan.waves(1) == [["t1"], ["t2"]]
    assert plan.source is None
    with pytest.raises(PlanError) as caught:
        plan_from_prompts(["ok", "  "])
    assert caught.value.problems == ["prompt #2: must not be empty"]
    with pytest.raises(PlanError, match="no tasks"):
        plan_from_prompts([])


def test_waves_are_greedy_in_plan_order() -> None:
    five = plan_from_data({"tasks": [{"id": name, "prompt": name} for name in "abcde"]})
    assert five.waves(2) == [["a", "b"], ["c", "d"], ["e"]]
    # "late" becomes ready in wave 1's aftermath but a ready earlier-listed task still goes first
    plan = plan_from_data(
        {
            "tasks": [
                {"id": "root", "prompt": "p"},
                {"id": "child", "prompt": "p", "depends_on": ["root"]},
                {"id": "x", "prompt": "p"},
                {"id": "y", "prompt": "p"},
            ]
        }
    )
    assert plan.waves(2) == [["root", "x"], ["child", "y"]]
    assert plan.waves(10) == [["root", "x", "y"], ["child"]]
    with pytest.raises(ValueError):
        plan.waves(0)


def test_claims_are_normalised(tmp_path: Path) -> None:
    plan = plan_from_data(
        {"tasks": [{"id": "a", "prompt": "p", "claims": ["./src//a.rs", "src/./b.rs", "c"]}]}
    )
    assert plan.tasks[0].claims == ("src/a.rs", "src/b.rs", "c")
    assert normalise_claim("a/../b") == "b"
    assert normalise_claim("src/a.rs") == "src/a.rs" and normalise_claim("a/b/") == "a/b"
    for bad, why in [
        ("/etc/hosts", "absolute"),
        ("\\\\server\\x", "absolute"),
        ("C:\\x", "absolute"),
        ("C:/x", "absolute"),
        ("a\x00b", "NUL"),
        ("../x", "climbs out"),
        ("a/../../x", "climbs out"),
        (".", "workspace itself"),
        ("~/notes.md", "home directory"),
    ]:
        with pytest.raises(ValueError, match=why):
            normalise_claim(bad)


def test_claims_naming_the_same_file_twice(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        plan_from_data({"tasks": [{"id": "a", "prompt": "p", "claims": ["a/b", "./a/b"]}]}, source="p.toml")
    assert caught.value.problems == ['p.toml: task "a": claims: "./a/b" and "a/b" name the same file']


def test_directory_claim_is_refused_relative_to_the_repository(git_repo: Path) -> None:
    (git_repo / "src" / "store").mkdir(parents=True)
    (git_repo / "plans").mkdir()
    plan_file = write(
        git_repo / "plans",
        "p.toml",
        '[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["src/store", "src/store/schema.rs", "docs/"]\n',
    )
    problems = problems_of(plan_file)
    assert len(problems) == 2
    assert problems[0].startswith(f'{plan_file}: task "a": claims: "src/store" is a directory')
    assert '"docs" is a directory' in problems[1]
    with pytest.raises(PlanError) as caught:
        load_plan(plan_file, root=git_repo / "plans")
    assert caught.value.problems == [problems[1]]


def test_claims_on_private_state_or_odd_paths_are_refused() -> None:
    claims = [".git/config", "sub/.git/HEAD", ".stella/private/store.db", ".stella/worktrees/x/a.py"]
    claims += ["a\nb", "a\\b", "x\ud800", ".stella/config.toml", ".gitignore"]
    with pytest.raises(PlanError) as caught:
        plan_from_data({"tasks": [{"id": "a", "prompt": "p", "claims": claims}]}, source="p.json")
    where = 'p.json: task "a": claims:'
    private = "is inside stella's private state (.stella/private, .stella/worktrees)"
    surrogate = "contains a lone surrogate (\\ud800), which is not text: write the character itself"
    assert caught.value.problems == [
        f'{where} ".git/config" is inside git\'s own directory (.git), which no task edits',
        f'{where} "sub/.git/HEAD" is inside git\'s own directory (.git), which no task edits',
        f'{where} ".stella/private/store.db" {private}',
        f'{where} ".stella/worktrees/x/a.py" {private}',
        f'{where} "a\\nb" contains a control character (a newline, a tab, ...): a claim names a file',
        f"{where} \"a\\\\b\" contains a backslash: separate the parts of a path with '/'",
        f'{where} "x\\ud800" {surrogate}',
    ]


def test_a_lone_surrogate_in_a_json_plan_is_refused(tmp_path: Path) -> None:
    text = '{"tasks": [{"id": "a", "prompt": "fix \\ud800", "title": "t\\udfff", "model": "m\\ud801"}]}'
    plan_file = write(tmp_path, "p.json", text)
    why = "which is not text: write the character itself"
    assert problems_of(plan_file) == [
        f'{plan_file}: task "a": prompt: contains a lone surrogate (\\ud800), {why}',
        f'{plan_file}: task "a": title: contains a lone surrogate (\\udfff), {why}',
        f'{plan_file}: task "a": model: contains a lone surrogate (\\ud801), {why}',
    ]


def test_unknown_pipelines_are_named_at_their_place_with_the_closest_installed_one() -> None:
    plan = plan_from_data(
        {
            "defaults": {"pipeline": "claud-code"},
            "tasks": [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p", "pipeline": "comand"}],
        },
        source="p.toml",
    )
    installed = ["plain", "command", "claude-code"]
    listing = "installed pipelines are claude-code, command, plain"
    assert plan.unknown_pipelines(installed) == [
        f'p.toml: defaults: pipeline: unknown pipeline "claud-code" (did you mean "claude-code"?); {listing}',
        f'p.toml: task "b": pipeline: unknown pipeline "comand" (did you mean "command"?); {listing}',
    ]
    assert plan.unknown_pipelines([*installed, "claud-code", "comand"]) == []


def test_every_problem_of_a_file_at_once() -> None:
    name = str(EXAMPLES / "invalid" / "many-problems.json")
    assert problems_of(name) == [
        f'{name}: task "schema": isolation: must be "shared" or "isolated", not "isolate" '
        '(did you mean "isolated"?)',
        f'{name}: task "reader": prompt: must not be empty',
        f'{name}: task "writer": timeout: must be a number of seconds greater than 0, not 0',
        f"{name}: task #4: id: missing: every task needs an id (letters, digits, '.', '_', '-')",
        f'{name}: task "reader": claims: "../outside.rs" climbs out of the workspace',
        f"{name}: dependency cycle: reader -> writer -> reader",
    ]


def test_graph_problems(tmp_path: Path) -> None:
    data = {
        "tasks": [
            {"id": "a", "prompt": "p", "depends_on": ["c"]},
            {"id": "b", "prompt": "p", "depends_on": ["a"]},
            {"id": "c", "prompt": "p", "depends_on": ["b"]},
            {"id": "d", "prompt": "p", "depends_on": ["d", "e"]},
            {"id": "e", "prompt": "p", "depends_on": ["d", "schema"]},
            {"id": "a", "prompt": "p"},
            {"id": "f", "prompt": "p", "depends_on": ["a"]},
        ]
    }
    with pytest.raises(PlanError) as caught:
        plan_from_data(data, source="plan.toml")
    assert caught.value.problems == [
        'plan.toml: task #6: id: duplicate id "a" (task #1 has it too)',
        'plan.toml: task "d": depends_on: the task depends on itself',
        'plan.toml: task "e": depends_on: unknown task "schema"',
        "plan.toml: dependency cycle: a -> c -> b -> a",
        "plan.toml: dependency cycle: d -> e -> d",
    ]


def test_long_cycle_is_printed_whole() -> None:
    ids = [f"s{n}" for n in range(50)]
    tasks = [{"id": ids[n], "prompt": "p", "depends_on": [ids[(n + 1) % 50]]} for n in range(50)]
    with pytest.raises(PlanError) as caught:
        plan_from_data({"tasks": tasks}, source="big.json")
    assert caught.value.problems == [f"big.json: dependency cycle: {' -> '.join([*ids, 's0'])}"]


def test_deep_chain_is_fine() -> None:
    tasks = [{"id": f"s{n}", "prompt": "p", "depends_on": [f"s{n - 1}"] if n else []} for n in range(5000)]
    plan = plan_from_data({"tasks": tasks})
    assert len(plan.waves(4)) == 5000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be a number of seconds greater than 0, not 0"),
        (-5, "must be a number of seconds greater than 0, not -5"),
        (True, "must be a number, not a boolean (true)"),
        ("60", 'must be a number, not a string ("60")'),
        (float("inf"), "must be a finite number of seconds, not inf"),
        (10**400, "must be a finite number of seconds, not a very large number"),
    ],
)
def test_timeout_problems(value: object, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        plan_from_data({"tasks": [{"id": "a", "prompt": "p", "timeout": value}]}, source="p.toml")
    assert caught.value.problems == [f'p.toml: task "a": timeout: {message}']


def test_field_problems_name_file_task_and_field() -> None:
    data = {
        "defaults": {"isolation": "isolated", "modle": "x"},
        "tasks": [
            {"id": "a b", "prompt": "p"},
            {"id": "ok", "prompt": "p", "depends_on": "a", "claims": ["x", "x"], "titel": "t"},
            "just a string",
        ],
        "task": [],
    }
    with pytest.raises(PlanError) as caught:
        plan_from_data(data, source="p.toml")
    assert caught.value.problems == [
        'p.toml: defaults: modle: unknown key (did you mean "model"?)',
        'p.toml: task: unknown key (did you mean "tasks"?)',
        "p.toml: task #1: id: \"a b\" is not a valid task id: use letters, digits, '.', '_' and '-'",
        'p.toml: task "ok": claims: "x" is listed more than once',
        'p.toml: task "ok": depends_on: must be a list, not a string ("a") (write ["a"])',
        'p.toml: task "ok": titel: unknown key (did you mean "title"?)',
        'p.toml: task #3: must be a table, not a string ("just a string")',
    ]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (None, 'p.toml: a plan must be a table with a "tasks" list, not null'),
        ([1], 'p.toml: a plan must be a table with a "tasks" list, not a list'),
        ({}, "p.toml: tasks: missing: a plan is a list of tasks"),
        ({"tasks": []}, "p.toml: tasks: the plan has no tasks"),
    ],
)
def test_plan_roots(data: object, problem: str) -> None:
    with pytest.raises(PlanError) as caught:
        plan_from_data(data, source="p.toml")
    assert caught.value.problems[0].startswith(problem)


def test_schema_key_is_allowed_for_editors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.json",
        json.dumps({"$schema": "./plan.schema.json", "tasks": [{"id": "a", "prompt": "p"}]}),
    )
    assert load_plan(path).ids == ("a",)
    path = write(tmp_path, "p.yml", "$schema: ./plan.schema.json\ntasks:\n  - {id: a, prompt: p}\n")
    assert load_plan(path).ids == ("a",)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.toml", '[[tasks]]\nid = "a"\nprompt = "p\n', "bad.toml:3:12: invalid TOML: "),
        ("bad.toml", '[[tasks]]\nid = "a"\nid = "b"\n', "bad.toml:3:"),
        ("bad.json", '{"tasks": [\n  {"id": "a",, "prompt": "p"}]}', "bad.json:2:14: invalid JSON: "),
        (
            "dup.json",
            '{"tasks": [{"id": "a", "id": "b", "prompt": "p"}]}',
            'dup.json: invalid JSON: key "id" appears twice',
        ),
        ("bad.yaml", "tasks:\n  - id: a\n   prompt: [\n", "bad.yaml:"),
        ("dup.yaml", "tasks:\n  - id: a\n    id: b\n    prompt: p\n", "dup.yaml:3:5: invalid YAML: "),
        ("tag.yaml", "tasks: !!python/object:os.system {}\n", "tag.yaml:1:8: invalid YAML: "),
        ("bin.toml", "", None),
    ],
)
def test_malformed_files_report_line_and_column(
    tmp_path: Path, name: str, text: str, expected: str | None
) -> None:
    path = tmp_path / name
    if expected is None:
        path.write_bytes(b'[[tasks]]\nid = "\xff"\n')
        expected = "bin.toml:2: not UTF-8 text"
    else:
        path.write_text(text, encoding="utf-8")
    problems = problems_of(path)
    assert len(problems) == 1
    assert problems[0].startswith(str(tmp_path / expected)), problems[0]


def test_file_problems(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope.toml") == [f"{tmp_path / 'nope.toml'}: no such file"]
    (tmp_path / "dir.toml").mkdir()
    assert problems_of(tmp_path / "dir.toml") == [f"{tmp_path / 'dir.toml'}: is a directory, not a plan file"]
    write(tmp_path, "plan.txt", "")
    assert problems_of(tmp_path / "plan.txt") == [
        f'{tmp_path / "plan.txt"}: unknown plan format ".txt": use .toml, .json, .yaml or .yml'
    ]
    empty = write(tmp_path, "empty.yaml", "")
    assert problems_of(empty) == [f'{empty}: a plan must be a mapping with a "tasks" list, not null']
    endless = tmp_path / "endless.toml"
    endless.symlink_to("/dev/zero")  # a plan that never ends is refused, not read until memory runs out
    assert problems_of(endless) == [f"{endless}: larger than 16 MiB: not a plan file"]
    if os.geteuid() != 0:  # root reads anything
        locked = write(tmp_path, "locked.toml", "")
        locked.chmod(0)
        assert problems_of(locked)[0].startswith(f"{locked}: cannot read")


def test_yaml_with_a_byte_order_mark_and_dates(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"tasks": [{"id": "a", "prompt": "p"}]}).encode())
    assert load_plan(path).ids == ("a",)
    dated = write(tmp_path, "d.yaml", "tasks:\n  - id: 2024-01-01\n    prompt: p\n")
    assert problems_of(dated) == [f"{dated}: task #1: id: must be a string, not a date/time (2024-01-01)"]


def test_plan_equality_is_by_value() -> None:
    one = Plan(tasks=(PlanTask(id="a", prompt="p", title="p"),))
    assert one == Plan(tasks=(PlanTask(id="a", prompt="p", title="p"),))
    assert one != Plan(tasks=one.tasks, source="other.toml")


def test_a_prompt_of_any_size_is_accepted(tmp_path: Path) -> None:
    # once refused over 100,000 bytes (the environment's limit): a worker now gets its prompt in a file
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"tasks": [{"id": "huge", "prompt": "x" * 300_000}]}))
    assert len(load_plan(plan).tasks[0].prompt) == 300_000


def test_an_inline_prompt_that_is_not_utf8_is_refused() -> None:
    # the command line's bytes b"bad \xff" arrive as "bad \udcff" (surrogateescape)
    with pytest.raises(PlanError) as caught:
        plan_from_prompts([b"bad \xff".decode("utf-8", "surrogateescape"), "fine", " "])
    assert caught.value.problems == [
        "prompt #1: contains a lone surrogate (\\udcff), which is not text: write the character itself",
        "prompt #3: must not be empty",
    ]


def test_base_is_an_isolated_tasks_own_or_its_defaults_and_an_error_on_a_shared_task() -> None:
    plan = plan_from_data(
        {
            "defaults": {"base": "parents"},
            "tasks": [
                {"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "x", "isolation": "isolated"},
                {"id": "c", "prompt": "x", "isolation": "isolated", "base": "pinned"},
            ],
        }
    )
    assert [task.base for task in plan.tasks] == ["pinned", "parents", "pinned"]
    assert plan_from_data({"tasks": [{"id": "a", "prompt": "x", "isolation": "isolated"}]}).tasks[0].base == (
        "pinned"
    )
    with pytest.raises(PlanError) as caught:
        plan_from_data(
            {
                "tasks": [
                    {"id": "a", "prompt": "x", "base": "parents"},
                    {"id": "b", "prompt": "x", "isolation": "isolated", "base": "parent"},
                ]
            }
        )
    assert caught.value.problems == [
        'plan: task "b": base: must be "pinned" or "parents", not "parent" (did you mean "parents"?)',
        'plan: task "a": base: only an isolated task has a base (a shared task works in the tree its '
        'dependencies committed to): remove it, or set isolation = "isolated"',
    ]


def test_check_fields_from_defaults_and_their_problems() -> None:
    plan = plan_from_data(
        {
            "defaults": {"check": "make test", "check_rounds": 2},
            "tasks": [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p", "check_fails_first": True}],
        }
    )
    a, b = plan.tasks
    assert (a.check, a.check_timeout, a.check_rounds, a.check_fails_first) == ("make test", 600.0, 2, False)
    assert (b.check, b.check_fails_first) == ("make test", True)
    bad = {"check": " ", "check_timeout": float("inf"), "check_rounds": -1, "check_fails_first": "yes"}
    with pytest.raises(PlanError) as caught:
        data = {"tasks": [{"id": "a", "prompt": "p", **bad}], "defaults": {"chek": "x"}}
        plan_from_data(data, source="p.toml")
    assert caught.value.problems == [
        'p.toml: defaults: chek: unknown key (did you mean "check"?)',
        'p.toml: task "a": check: must not be empty',
        'p.toml: task "a": check_fails_first: must be true or false, not a string ("yes")',
        'p.toml: task "a": check_rounds: must be 0 or more, not -1',
        'p.toml: task "a": check_timeout: must be a finite number of seconds, not inf',
    ]
