"""`stella fleet --resume RUN`: run again only what an earlier run left undone."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner

# a -> b -> c -> d and an independent e; c reads a file that does not exist yet
PLAN = """\
[[tasks]]
id = "a"
prompt = "first"

[[tasks]]
id = "b"
prompt = "second"
depends_on = ["a"]

[[tasks]]
id = "c"
prompt = "read the input"
depends_on = ["b"]

[[tasks]]
id = "d"
prompt = "after c"
depends_on = ["c"]

[[tasks]]
id = "e"
prompt = "independent"
"""

READER = """\
Path(os.environ["MARKS"], TASK).write_text("ran")
if TASK == "c":
    text = Path(os.environ["INPUT"]).read_text()  # fails until the input exists
report(summary=f"{TASK} done")
"""


def _attempts(record: dict) -> list[str]:
    return sorted(a["task_id"] for a in record["attempts"])


def test_resume_runs_exactly_the_failed_task_and_its_dependents(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner, monkeypatch
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    missing = tmp_path / "input.txt"
    monkeypatch.setenv("MARKS", str(marks))
    monkeypatch.setenv("INPUT", str(missing))
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("reader", READER))
    args = ("fleet", "--pipeline", "command", "--max-concurrency", "2")

    first = stella_main(*args, "--plan", str(plan), cwd=git_repo)
    assert first.returncode == 1, first.stdout + first.stderr
    before = run_record(git_repo)
    tasks = by_id(before["tasks"])
    statuses = [tasks[t]["status"] for t in "abcde"]
    assert statuses == ["succeeded", "succeeded", "failed", "skipped", "succeeded"]

    missing.write_text("now it exists")
    second = stella_main(*args, "--resume", "latest", cwd=git_repo)

    assert second.returncode == 0, second.stdout + second.stderr
    after = run_record(git_repo)
    assert after["run"]["id"] != before["run"]["id"]
    assert after["run"]["resumed_from"] == before["run"]["id"]
    assert after["run"]["plan_path"] == before["run"]["plan_path"]
    assert _attempts(after) == ["c", "d"]  # the succeeded tasks get no new attempt
    tasks = by_id(after["tasks"])
    assert {t: tasks[t]["status"] for t in "abcde"} == dict.fromkeys("abcde", "succeeded")
    assert tasks["a"]["reason"] == f"succeeded in run {before['run']['id']}"
    assert _attempts(run_record(git_repo, before["run"]["id"])) == ["a", "b", "c", "e"]  # untouched
    assert f"resumes {before['run']['id']} (3 of 5 tasks done)" in second.stdout
    # the progress lines and the table number the resumed run's waves alike: c and d are its 1 and 2
    assert "wave 1: c\n" in second.stdout and "wave 2: d\n" in second.stdout, second.stdout
    assert "1 wave" not in second.stdout and "2 waves" in second.stdout
    assert {t: tasks[t]["wave"] for t in "abcde"} == {"a": None, "b": None, "c": 1, "d": 2, "e": None}
    rows = [line.split() for line in second.stdout.splitlines()]
    table = {row[0]: row[1] for row in rows if row and row[0] in tuple("abcde")}
    assert table == {"a": "-", "b": "-", "c": "1", "d": "2", "e": "-"}, second.stdout

    listing = stella_main("runs", "--json", cwd=git_repo)
    rows = by_id(json.loads(listing.stdout)["runs"])
    assert rows[after["run"]["id"]]["resumed_from"] == before["run"]["id"]
    shown = stella_main("runs", before["run"]["id"][:-1], cwd=git_repo)
    assert f"resumed by  {after['run']['id']}" in shown.stdout
    shown = stella_main("runs", "latest", cwd=git_repo)
    assert f"resumes     {before['run']['id']}" in shown.stdout


def test_a_changed_plan_is_refused_naming_the_task_unless_forced(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner, monkeypatch
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("MARKS", str(marks))
    monkeypatch.setenv("INPUT", str(tmp_path / "input.txt"))
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("reader", READER))
    args = ("fleet", "--pipeline", "command", "--max-concurrency", "2")
    assert stella_main(*args, "--plan", str(plan), cwd=git_repo).returncode == 1
    first_id = run_record(git_repo)["run"]["id"]
    (tmp_path / "input.txt").write_text("x")
    plan.write_text(PLAN.replace('prompt = "second"', 'prompt = "second, reworded"'))

    refused = stella_main(*args, "--resume", first_id[:12], cwd=git_repo)

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"the plan changed since run {first_id}: task 'b': prompt" in refused.stderr
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert run_record(git_repo)["run"]["id"] == first_id  # nothing recorded

    forced = stella_main(*args, "--resume", "latest", "--force", cwd=git_repo)

    assert forced.returncode == 0, forced.stdout + forced.stderr
    # b changed: it runs again, and so do its dependents; a is still done
    assert _attempts(run_record(git_repo)) == ["b", "c", "d"]


def test_forcing_a_changed_task_runs_again_its_dependent_that_had_succeeded(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner, monkeypatch
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("MARKS", str(marks))
    monkeypatch.setenv("INPUT", str(tmp_path / "input.txt"))
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("reader", READER))
    args = ("fleet", "--pipeline", "command", "--max-concurrency", "2")
    assert stella_main(*args, "--plan", str(plan), cwd=git_repo).returncode == 1  # a, b, e succeed; c fails
    (tmp_path / "input.txt").write_text("x")
    plan.write_text(PLAN.replace('prompt = "first"', 'prompt = "first, reworded"'))

    forced = stella_main(*args, "--resume", "latest", "--force", cwd=git_repo)

    assert forced.returncode == 0, forced.stdout + forced.stderr
    # a changed: b, which had succeeded on the old a, is not done either; e (independent) is
    assert _attempts(run_record(git_repo)) == ["a", "b", "c", "d"]


def test_resume_of_inline_prompts_reuses_the_recorded_tasks(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    flag = tmp_path / "ok"
    write_config(git_repo, run="true", tasks={"t2": f"test -e {flag}"})
    args = ("fleet", "--pipeline", "command")
    assert stella_main(*args, "one", "two", "three", cwd=git_repo).returncode == 1
    first_id = run_record(git_repo)["run"]["id"]
    preview = stella_main(*args, "--resume", "latest", "--dry-run", cwd=git_repo)
    assert f"resumes {first_id}; done there, no new attempt: t1, t3" in preview.stdout, preview.stderr
    flag.write_text("")

    resumed = stella_main(*args, "--resume", "latest", cwd=git_repo)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = run_record(git_repo)
    assert _attempts(record) == ["t2"]
    assert f"succeeded in run {first_id}" in resumed.stdout  # the summary row of a task done before
    prompts = {t["id"]: t["prompt"] for t in record["tasks"]}
    assert prompts == {"t1": "one", "t2": "two", "t3": "three"}
    # the tasks done before come first, in no wave of this run; t2 is its wave 1
    assert [(t["id"], t["wave"]) for t in record["tasks"]] == [("t1", None), ("t3", None), ("t2", 1)]
    both = stella_main(*args, "--resume", "latest", "four", cwd=git_repo)
    assert both.returncode == 2 and "give no prompts" in both.stderr
    nothing = stella_main(*args, "--resume", "nosuchrun", cwd=git_repo)
    assert nothing.returncode == 2 and "no run matches 'nosuchrun'" in nothing.stderr
