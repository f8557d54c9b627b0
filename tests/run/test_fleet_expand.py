"""Plans that grow: a task with `expands = true` writes a plan fragment to $STELLA_PLAN_OUT and its tasks
join the run, checked like a plan, behind the emitter as a barrier (real `stella fleet` runs of the command
pipeline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fleet import Scripts, by_id, run_record, wait_for, write_config
from helpers.repo import StellaRunner
from helpers.spawn import ended_within

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
if TASK == os.environ.get("GATED"):  # holds until the test opens the gate
    Path(os.environ["GATE"] + ".pid").write_text(str(os.getpid()))
    wait_file(os.environ["GATE"], timeout=120)
if os.environ.get("STELLA_PLAN_OUT") and TASK in json.loads(os.environ.get("EMITTERS", '["split"]')):
    fragment = Path(os.environ["FRAGMENTS"], TASK).read_text()
    Path(os.environ["STELLA_PLAN_OUT"]).write_text(fragment)
time.sleep(float(os.environ.get("NAP", "0")))
say("end")
report(summary=f"{TASK} done")
"""


def twenty_modules(count: int = 20) -> str:
    """m01..m20: m(i) depends on m(i-1) when i is not a multiple of 5 plus one (chains of five), the first
    of each chain on the plan's `survey` (a task the emitter could see); the last one on every chain's."""
    lines = ["[defaults]", "timeout = 60", ""]
    for number in range(1, count + 1):
        deps = [f"m{number - 1:02d}"] if number % 5 != 1 else ["survey"]
        if number == count:
            deps = [f"m{n:02d}" for n in sorted({*range(5, count, 5), count - 1})]
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


# the eager schedule with fewer tasks, to keep the suite quick (tests/run/test_graph_growth.py has both)
@pytest.mark.parametrize(("schedule", "count"), [("waves", 20), ("eager", 8)])
def test_an_emitter_adds_twenty_tasks_that_run_in_order_behind_it_as_a_barrier(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch, schedule: str, count: int
) -> None:
    plan = _setup(tmp_path, git_repo, monkeypatch, {"split": twenty_modules(count)})
    done = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4",
        "--schedule", schedule, "--json", cwd=git_repo,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    log = _log(tmp_path)
    at = {(what, task): position for position, (what, task) in enumerate(log)}
    emitted = [f"split.m{n:02d}" for n in range(1, count + 1)]
    # every task ran exactly once
    ended = sorted(task for what, task in log if what == "end")
    assert ended == sorted(["survey", "split", "integrate", *emitted])
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
    assert order[:2] == ["survey", "split"] and order[-1] == "integrate"
    assert sorted(order[2:-1]) == emitted  # right after their parent (in the order they started)
    shown = by_id(doc["tasks"])
    assert shown["split"]["expands"] is True and shown["split.m07"]["parent"] == "split"
    if schedule == "waves":  # `stella runs RUN` shows them under their parent too
        listed = stella("runs", "latest", cwd=git_repo).stdout
        assert (
            "  split  succeeded  shared  list the modules and emit one task per module  (expands at run time)"
            in listed
        )
        assert "    split.m07  succeeded  shared  migrate module 7  (emitted by split)" in listed
        assert listed.index("split.m20") < listed.index("  integrate  succeeded")


BROKEN = """\
[[tasks]]
id = "a"
prompt = "one"
depends_on = ["b"]
claims = ["src/shared.py"]

[[tasks]]
id = "b"
prompt = "two"
depends_on = ["a"]

[[tasks]]
id = "c"
prompt = "three"
depends_on = ["nowhere"]
claims = ["src/shared.py"]

[[tasks]]
id = "c"
prompt = "three again"

[[tasks]]
id = "d"
prompt = "four"
claims = ["src/shared.py"]
"""

SMALL = """\
[[tasks]]
id = "split"
prompt = "emit"
expands = true

[[tasks]]
id = "integrate"
prompt = "after"
depends_on = ["split"]
"""


def test_an_invalid_fragment_fails_its_emitter_with_every_problem_and_runs_none_of_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch
) -> None:
    plan = _setup(tmp_path, git_repo, monkeypatch, {"split": BROKEN}, plan=SMALL)
    done = stella("fleet", "--plan", str(plan), "--pipeline", "command", "--json", cwd=git_repo)
    assert done.returncode != 0
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert sorted(tasks) == ["integrate", "split"]  # nothing of the fragment was added
    assert [task for what, task in _log(tmp_path) if what == "start"] == ["split"]
    split = tasks["split"]
    assert split["status"] == "failed" and split["fragment_path"] is None
    reason = split["reason"]
    assert reason.startswith("its plan fragment was refused (")
    for problem in (
        'fragment of "split": dependency cycle: a -> b -> a',
        'fragment of "split": task #3 ("c"): depends_on: unknown task "nowhere"',
        'fragment of "split": task #4: id: duplicate id "c" (task #3 has it too)',
        'fragment of "split": task "d": claims: "src/shared.py" is claimed by task "a" too, and they may run',
    ):
        assert problem in reason, (problem, reason)
    assert tasks["integrate"]["status"] == "skipped"
    assert tasks["integrate"]["reason"] == "dependency failed: split"


def test_the_cap_on_emitted_tasks_refuses_a_fragment_with_a_clear_line(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch
) -> None:
    plan = _setup(tmp_path, git_repo, monkeypatch, {"split": twenty_modules()})
    config = git_repo / ".stella" / "config.toml"
    config.write_text(config.read_text() + "\n[fleet]\nmax_emitted_tasks = 12\n")
    done = stella("fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo)
    assert done.returncode != 0
    split = by_id(run_record(git_repo)["tasks"])["split"]
    assert split["reason"] == (
        'its plan fragment was refused: fragment of "split": emits 20 tasks, more than the 12 the run may '
        "still add ([fleet] max_emitted_tasks = 12, 0 emitted so far); emit fewer tasks or raise the limit"
    )
    assert "emits 20 tasks, more than the 12" in done.stdout + done.stderr


NESTED = """\
[[tasks]]
id = "sub"
prompt = "split further"
expands = true

[[tasks]]
id = "after"
prompt = "after the sub-split"
depends_on = ["sub"]
"""

DEEPER = """\
[[tasks]]
id = "leaf"
prompt = "a leaf"
expands = true
"""


def test_an_emitted_task_expands_in_turn_up_to_the_depth_limit(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch
) -> None:
    fragments = {"split": NESTED, "split.sub": DEEPER}
    plan = _setup(tmp_path, git_repo, monkeypatch, fragments, plan=SMALL)
    config = git_repo / ".stella" / "config.toml"
    config.write_text(config.read_text() + "\n[fleet]\nmax_expand_depth = 2\n")
    done = stella("fleet", "--plan", str(plan), "--pipeline", "command", "--json", cwd=git_repo)
    assert done.returncode != 0
    tasks = by_id(run_record(git_repo)["tasks"])
    # split (a plan task) emitted sub, which expands too: one level down may; two levels down may not
    assert tasks["split.sub"]["parent_id"] == "split" and tasks["split.sub"]["expands"] == 1
    assert tasks["split.sub"]["reason"] == (
        'its plan fragment was refused: fragment of "split.sub": task "leaf": expands: an emitted task 2 '
        "levels down may not expand ([fleet] max_expand_depth = 2); do its work in it, or raise the limit"
    )
    assert "split.sub.leaf" not in tasks
    assert tasks["split.after"]["reason"] == "dependency failed: split.sub"
    assert tasks["integrate"]["reason"] == "dependency failed: split.sub"
    assert [task for what, task in _log(tmp_path) if what == "start"] == ["split", "split.sub"]


def test_resume_after_the_fleet_is_killed_mid_expansion_runs_each_emitted_task_exactly_once(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch
) -> None:
    plan = _setup(tmp_path, git_repo, monkeypatch, {"split": twenty_modules(6)})
    gate = tmp_path / "gate"
    monkeypatch.setenv("GATED", "split.m03")
    monkeypatch.setenv("GATE", str(gate))
    # one at a time: the gated task is the only one running when the fleet dies (a worker that is busy then
    # may finish its work before it notices its fleet is gone, unrecorded, and would run again)
    args = ["fleet", "--pipeline", "command", "--max-concurrency", "1"]
    fleet = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", *args, "--plan", str(plan)],
        cwd=git_repo, env=dict(os.environ),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(Path(f"{gate}.pid"), timeout=120)
        fleet.send_signal(signal.SIGKILL)  # some emitted tasks done, one held, the rest not started
        fleet.wait(timeout=30)
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()
    first = run_record(git_repo)
    ended_before = {task for what, task in _log(tmp_path) if what == "end"}
    assert ended_before == {"survey", "split", "split.m01", "split.m02"}
    assert len(by_id(first["tasks"])) == 9  # the emitted tasks were recorded under their parent
    held = int(Path(f"{gate}.pid").read_text())
    assert ended_within(held, 15), "the held worker outlived its killed fleet"

    gate.write_text("open")
    second = stella(*args, "--resume", "latest", cwd=git_repo)
    assert second.returncode == 0, second.stdout + second.stderr
    ends = [task for what, task in _log(tmp_path) if what == "end"]
    emitted = [f"split.m{n:02d}" for n in range(1, 7)]
    assert sorted(ends) == sorted(["survey", "split", "integrate", *emitted])  # each exactly once
    after = run_record(git_repo)
    tasks = by_id(after["tasks"])
    assert all(tasks[task_id]["status"] == "succeeded" for task_id in ["split", "integrate", *emitted])
    assert all(tasks[task_id]["parent_id"] == "split" for task_id in emitted)
    rerun = sorted(attempt["task_id"] for attempt in after["attempts"])
    assert rerun == sorted(set(emitted) - ended_before | {"integrate"})
    assert tasks["split"]["reason"] == f"succeeded in run {first['run']['id']}"


HOLDER = """\
import sqlite3
log = Path(os.environ["LOG"])
with log.open("a") as stream:
    stream.write(f"start {TASK}\\n")
if TASK == "holder":  # holds its claim until the emitted task that wants the same file has failed on it
    db = Path(os.environ["STELLA_ROOT"], ".stella", "private", "fleet.db")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        row = conn.execute("SELECT status FROM tasks WHERE id = 'split.a'").fetchone()
        conn.close()
        if row and row[0] == "failed":
            break
        time.sleep(0.1)
if os.environ.get("STELLA_PLAN_OUT"):
    fragment = '[[tasks]]\\nid = "a"\\nprompt = "p"\\nclaims = ["held.txt"]\\n'
    Path(os.environ["STELLA_PLAN_OUT"]).write_text(fragment)
report(summary=f"{TASK} done")
"""


def test_an_emitted_task_whose_claim_a_running_task_holds_fails_naming_it(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, monkeypatch
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "holder"\nprompt = "hold"\nclaims = ["held.txt"]\n\n'
        '[[tasks]]\nid = "split"\nprompt = "emit"\nexpands = true\n'
    )
    monkeypatch.setenv("LOG", str(tmp_path / "log"))
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("holder", HOLDER))
    done = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        "--schedule", "eager", cwd=git_repo,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    tasks = by_id(run_record(git_repo)["tasks"])
    assert tasks["holder"]["status"] == "succeeded" and tasks["split"]["status"] == "succeeded"
    assert tasks["split.a"]["status"] == "failed"
    assert "held.txt" in tasks["split.a"]["reason"] and "holder" in tasks["split.a"]["reason"]
    assert ("start", "split.a") not in _log(tmp_path)  # it failed on the claim, before its worker started
