"""Plans that grow: a task with `expands = true` writes a plan fragment to $STELLA_PLAN_OUT and its tasks
join the run, checked like a plan, behind the emitter as a barrier (real `stella fleet` runs of the command
pipeline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner

PLAN = """\
[[tasks]]
id = "survey"
prompt = "look around first"

[[tasks]]
id = "split"
prompt = "list the modules and emit one task per module"
depends_on = ["survey"]
expands = true

[[tasks]]
id = "integrate"
prompt = "integrate what the modules did"
depends_on = ["split"]
"""

# Every task logs when it starts and ends; `split` emits FRAGMENT (from the environment) first.
WORKER = """\
log = Path(os.environ["LOG"])
def say(what):
    with log.open("a") as stream:
        stream.write(f"{what} {TASK}\\n")
say("start")
if os.environ.get("STELLA_PLAN_OUT") and TASK in json.loads(os.environ.get("EMITTERS", '["split"]')):
    fragment = Path(os.environ["FRAGMENTS"], TASK).read_text()
    Path(os.environ["STELLA_PLAN_OUT"]).write_text(fragment)
time.sleep(float(os.environ.get("NAP", "0")))
say("end")
report(summary=f"{TASK} done")
"""


def twenty_modules() -> str:
    """m01..m20: m(i) depends on m(i-1) when i is not a multiple of 5 plus one (four chains of five), the
    first of each chain on the plan's `survey` (a task the emitter could see); the last one on all."""
    lines = ["[defaults]", 'timeout = 60', ""]
    for number in range(1, 21):
        deps = [f"m{number - 1:02d}"] if number % 5 != 1 else ["survey"]
        if number == 20:
            deps = [f"m{n:02d}" for n in (5, 10, 15, 19)]
        lines += [
            "[[tasks]]",
            f'id = "m{number:02d}"',
            f'prompt = "migrate module {number}"',
            f"depends_on = {json.dumps(deps)}",
            f'claims = ["src/m{number:02d}.py"]',
            "",
        ]
    return "\n".join(lines)


def _setup(tmp_path: Path, git_repo: Path, monkeypatch, fragments: dict[str, str], plan: str = PLAN) -> Path:
    (tmp_path / "fragments").mkdir()
    for task_id, text in fragments.items():
        (tmp_path / "fragments" / task_id).write_text(text)
    monkeypatch.setenv("FRAGMENTS", str(tmp_path / "fragments"))
    monkeypatch.setenv("LOG", str(tmp_path / "log"))
    monkeypatch.setenv("EMITTERS", json.dumps(sorted(fragments)))
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("worker", WORKER))
    path = tmp_path / "plan.toml"
    path.write_text(plan)
    return path


def _log(tmp_path: Path) -> list[tuple[str, str]]:
    path = tmp_path / "log"
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]


@pytest.mark.parametrize("schedule", ["waves", "eager"])
def test_an_emitter_adds_twenty_tasks_that_run_in_order_behind_it_as_a_barrier(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch, schedule: str
) -> None:
    plan = _setup(tmp_path, git_repo, monkeypatch, {"split": twenty_modules()})
    done = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4",
        "--schedule", schedule, "--json", cwd=git_repo,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    log = _log(tmp_path)
    at = {(what, task): position for position, (what, task) in enumerate(log)}
    emitted = [f"split.m{n:02d}" for n in range(1, 21)]
    # every task ran exactly once
    assert sorted(task for what, task in log if what == "end") == sorted(["survey", "split", "integrate", *emitted])
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    for task_id in emitted:
        row = tasks[task_id]
        assert row["status"] == "succeeded" and row["parent_id"] == "split"
        # in order: after the emitter, after each of its dependencies
        assert at[("start", task_id)] > at[("end", "split")]
        for dep in row["depends_on"]:
            assert at[("start", task_id)] > at[("end", dep)], (task_id, dep)
        # the barrier: integrate waits for all the emitter emitted
        assert at[("start", "integrate")] > at[("end", task_id)]
    assert tasks["split.m02"]["depends_on"] == ["split.m01"]
    assert tasks["split.m01"]["depends_on"] == ["survey"]
    assert tasks["split.m01"]["claims"] == ["src/m01.py"] and tasks["split.m01"]["timeout_s"] == 60
    assert tasks["split"]["expands"] == 1 and tasks["split"]["fragment_path"].endswith(".plan")
    assert Path(tasks["split"]["fragment_path"]).exists()
    assert tasks["integrate"]["parent_id"] is None
    doc = json.loads(done.stdout)
    assert doc["status"] == "succeeded"
    # --json lists each emitted task under its parent
    order = [task["id"] for task in doc["tasks"]]
    assert order == ["survey", "split", *emitted, "integrate"]
    shown = by_id(doc["tasks"])
    assert shown["split"]["expands"] is True and shown["split.m07"]["parent"] == "split"
