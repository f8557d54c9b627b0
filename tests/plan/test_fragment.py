"""Plan fragments (plan/fragment.py): read as TOML or JSON, checked like a plan plus the fragment's own
checks, renamed under their emitter."""

from __future__ import annotations

from pathlib import Path

import pytest

from stellafleet.core.errors import PlanError
from stellafleet.plan.fragment import FragmentRules, load_fragment, visible_to
from stellafleet.plan.model import PlanTask, plan_from_data

EMITTER = PlanTask("split", "p", "split", depends_on=("survey",), expands=True)
RULES = FragmentRules(visible=frozenset({"survey"}), depth=1, max_depth=3, emitted_before=0, max_emitted=10)


def fragment(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "split-1.plan"
    path.write_text(text)
    return path


def test_a_toml_fragment_is_renamed_under_its_emitter_with_its_defaults(tmp_path: Path) -> None:
    text = (
        '[defaults]\nisolation = "isolated"\ntimeout = 30\n\n'
        '[[tasks]]\nid = "a"\nprompt = "one"\ndepends_on = ["survey"]\n\n'
        '[[tasks]]\nid = "b"\nprompt = "two"\ndepends_on = ["a"]\nclaims = ["./src//b.py"]\n'
    )
    a, b = load_fragment(fragment(tmp_path, text), EMITTER, RULES)
    assert (a.id, a.depends_on, a.parent, a.isolation, a.timeout) == (
        "split.a",
        ("survey",),
        "split",
        "isolated",
        30,
    )
    assert (b.id, b.depends_on, b.claims) == ("split.b", ("split.a",), ("src/b.py",))


def test_a_json_fragment_is_read_by_its_first_character(tmp_path: Path) -> None:
    path = fragment(tmp_path, '{"tasks": [{"id": "x", "prompt": "p", "expands": true}]}')
    (task,) = load_fragment(path, EMITTER, RULES)
    assert task.id == "split.x" and task.expands


def test_no_file_or_an_empty_task_list_emits_nothing(tmp_path: Path) -> None:
    assert load_fragment(tmp_path / "none.plan", EMITTER, RULES) == ()
    assert load_fragment(fragment(tmp_path, "tasks = []\n"), EMITTER, RULES) == ()


def test_a_local_id_wins_over_a_visible_task_of_the_same_name(tmp_path: Path) -> None:
    text = '[[tasks]]\nid = "survey"\nprompt = "p"\n\n'
    text += '[[tasks]]\nid = "b"\nprompt = "p"\ndepends_on = ["survey"]\n'
    _, b = load_fragment(fragment(tmp_path, text), EMITTER, RULES)
    assert b.depends_on == ("split.survey",)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = (
        '[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["f.py"]\ncolour = 1\n\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\nclaims = ["f.py"]\ndepends_on = ["elsewhere"]\n\n'
        '[[tasks]]\nid = "c"\nprompt = "p"\nclaims = ["f.py"]\ndepends_on = ["a"]\nisolation = "isolated"\n'
    )
    with pytest.raises(PlanError) as caught:
        load_fragment(fragment(tmp_path, text), EMITTER, RULES)
    problems = caught.value.problems
    assert any(p.startswith('fragment of "split": task "a": ') and "colour" in p for p in problems)
    assert 'fragment of "split": task "b": depends_on: unknown task "elsewhere"' in " ".join(problems)
    # a and b may run at once and claim one file; c waits for a and is isolated (its own worktree's file)
    assert [p for p in problems if "claimed" in p] == [
        'fragment of "split": task "b": claims: "f.py" is claimed by task "a" too, and they may run at the '
        "same time; make one depend on the other"
    ]


def test_a_claim_shared_along_a_chain_is_fine(tmp_path: Path) -> None:
    text = (
        '[[tasks]]\nid = "a"\nprompt = "p"\nclaims = ["f.py"]\n\n'
        '[[tasks]]\nid = "m"\nprompt = "p"\ndepends_on = ["a"]\n\n'
        '[[tasks]]\nid = "z"\nprompt = "p"\nclaims = ["f.py"]\ndepends_on = ["m"]\n'
    )
    assert len(load_fragment(fragment(tmp_path, text), EMITTER, RULES)) == 3


def test_a_syntax_error_names_the_fragment_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r'^fragment of "split":2:\d+: invalid TOML'):
        load_fragment(fragment(tmp_path, "[[tasks]]\nid = \n"), EMITTER, RULES)


def test_the_depth_limit_and_the_cap(tmp_path: Path) -> None:
    text = '[[tasks]]\nid = "a"\nprompt = "p"\nexpands = true\n\n[[tasks]]\nid = "b"\nprompt = "p"\n'
    deep = FragmentRules(frozenset(), depth=3, max_depth=3, emitted_before=9, max_emitted=10)
    with pytest.raises(PlanError) as caught:
        load_fragment(fragment(tmp_path, text), EMITTER, deep)
    assert caught.value.problems == [
        'fragment of "split": emits 2 tasks, more than the 1 the run may still add '
        "([fleet] max_emitted_tasks = 10, 9 emitted so far); emit fewer tasks or raise the limit",
        'fragment of "split": task "a": expands: an emitted task 3 levels down may not expand '
        "([fleet] max_expand_depth = 3); do its work in it, or raise the limit",
    ]


def test_what_an_emitter_sees_is_its_dependencies_theirs_and_what_they_emitted() -> None:
    plan = plan_from_data(
        {
            "tasks": [
                {"id": "base", "prompt": "p"},
                {"id": "gen", "prompt": "p", "depends_on": ["base"], "expands": True},
                {"id": "other", "prompt": "p"},
                {"id": "split", "prompt": "p", "depends_on": ["gen"], "expands": True},
            ]
        }
    )
    tasks = {task.id: task for task in plan.tasks}
    tasks["gen.x"] = PlanTask("gen.x", "p", "x", parent="gen")
    assert visible_to(tasks["split"], tasks) == {"gen", "base", "gen.x"}


def test_a_task_whose_full_id_is_over_128_characters_is_refused_by_name(tmp_path: Path) -> None:
    fits, over = "f" * (128 - len("split.")), "o" * (129 - len("split."))
    text = f'[[tasks]]\nid = "{fits}"\nprompt = "p"\n\n[[tasks]]\nid = "{over}"\nprompt = "p"\n'
    with pytest.raises(PlanError) as caught:
        load_fragment(fragment(tmp_path, text), EMITTER, RULES)
    assert caught.value.problems == [
        f'fragment of "split": task "{over}": its full id "split.{over}" is 129 characters, more than the '
        "128 a task id may have; give it a shorter id"
    ]


def test_emitted_tasks_take_the_plans_defaults_and_then_their_fragments(tmp_path: Path) -> None:
    """A plan's `[defaults] pipeline` reaches what its tasks emit (they ran on the built-in engine)."""
    plan = plan_from_data(
        {"defaults": {"pipeline": "command", "timeout": 30}, "tasks": [{"id": "s", "prompt": "p"}]}
    )
    rules = FragmentRules(frozenset(), 1, 3, 0, 10, plan_defaults=plan.defaults)
    text = '[defaults]\ntimeout = 10\n\n[[tasks]]\nid = "a"\nprompt = "p"\n\n'
    text += '[[tasks]]\nid = "b"\nprompt = "p"\ntimeout = 5\n'
    a, b = load_fragment(fragment(tmp_path, text), EMITTER, rules)
    assert (a.pipeline, a.timeout) == ("command", 10)
    assert (b.pipeline, b.timeout) == ("command", 5)
