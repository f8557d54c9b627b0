"""Each task's own check, run by stella on its committed result: a plan of lying, uncommitted, fixed-in-a-
round, vacuous and honest tasks ends with exactly the liars, the uncommitted and the vacuous failed, the
evidence in the ledger, `stella runs --json` and the dashboard, and `stella merge` checks again."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths
from stellafleet.state.dashboard import load_attempt, load_run_page
from stellafleet.state.ledger import Ledger

# Every worker says it is done; what each commits is another matter.
WORKER = """\
prompt = os.environ.get("STELLA_PROMPT", "")
mark(f"{TASK}.told", "stella runs this check" in prompt)
if TASK == "uncommitted":  # commits one file; the check needs the other, left uncommitted
    (WS / "unc-a.txt").write_text("a\\n")
    stella_commit("a", "unc-a.txt")
    (WS / "unc-b.txt").write_text("b\\n")
elif TASK == "nothing":  # `stella commit` fails, and the worker says it is done all the same
    subprocess.run(["stella", "commit", "-m", "x", "no-such-file.txt"])
elif TASK != "vacuous":
    right = TASK.startswith("honest") or (TASK == "fixed" and "check round 1 of at most 1" in prompt)
    (WS / f"{TASK}.txt").write_text("right\\n" if right else "wrong\\n")
    stella_commit(TASK, f"{TASK}.txt")
"""


def _says_right(name: str) -> str:
    return f'grep -qx right {name}.txt || {{ echo "{name}.txt is not right"; exit 1; }}'


PLAN = f"""\
[[tasks]]
id = "liar"
prompt = "make liar.txt right"
isolation = "isolated"
check = {json.dumps(_says_right("liar"))}

[[tasks]]
id = "uncommitted"
prompt = "add unc-a.txt and unc-b.txt"
check = "test -f unc-b.txt || {{ echo unc-b.txt is missing; exit 1; }}"

[[tasks]]
id = "nothing"
prompt = "add nothing.txt"
check = "test -f nothing.txt"

[[tasks]]
id = "fixed"
prompt = "make fixed.txt right"
isolation = "isolated"
check = {json.dumps(_says_right("fixed"))}
check_rounds = 1

[[tasks]]
id = "vacuous"
prompt = "write a failing test first"
isolation = "isolated"
check = "true"
check_fails_first = true

[[tasks]]
id = "honest"
prompt = "make honest.txt right"
isolation = "isolated"
check = {json.dumps(_says_right("honest"))}
check_fails_first = true

[[tasks]]
id = "honest-shared"
prompt = "make honest-shared.txt right"
check = {json.dumps(_says_right("honest-shared"))}
"""


def test_only_what_its_own_check_passes_on_the_committed_result_succeeds(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("work", WORKER))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    ran = stella_main(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    assert ran.returncode == 1, ran.stdout + ran.stderr

    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    failed = {task_id for task_id, task in tasks.items() if task["status"] == "failed"}
    assert failed == {"liar", "uncommitted", "nothing", "vacuous"}, tasks
    assert tasks["liar"]["reason"] == "check failed (exit 1): liar.txt is not right"
    assert tasks["uncommitted"]["reason"] == "check failed (exit 1): unc-b.txt is missing"
    assert tasks["nothing"]["reason"].startswith("check failed: no commits")
    assert tasks["vacuous"]["reason"] == "check passes before the change: it proves nothing"
    assert (marks / "liar.told").read_text() == "True"  # the first prompt named the check

    checks = record["checks"]
    phases = {(row["task_id"], row["phase"], bool(row["passed"])) for row in checks}
    assert ("honest", "before", False) in phases and ("honest", "after", True) in phases
    assert ("vacuous", "before", True) in phases and ("vacuous", "after", False) not in phases
    fixed = [row for row in checks if row["task_id"] == "fixed"]
    assert [bool(row["passed"]) for row in fixed] == [False, True]  # red, then green in its round
    attempts = [a for a in record["attempts"] if a["task_id"] == "fixed"]
    assert [a["reason"] for a in attempts] == [None, "check"]
    # its round was a request its red check asked for; a red check with no round left waits on a person
    asked = {(r["task_id"], r["reason"], r["state"]) for r in record["requests"]}
    assert asked == {
        ("fixed", "check", "served"),
        ("liar", "check", "needs_you"),
        ("uncommitted", "check", "needs_you"),
        ("nothing", "check", "needs_you"),
        ("vacuous", "retry", "needs_you"),
    }
    (round_asked,) = [r for r in record["requests"] if r["task_id"] == "fixed"]
    assert round_asked["attempt_id"] == attempts[1]["id"]
    assert "check round 1 of at most 1" in round_asked["context"]
    liar_waits = next(r for r in record["requests"] if r["task_id"] == "liar")
    assert "liar.txt is not right" in liar_waits["context"]
    honest = next(row for row in checks if row["task_id"] == "honest" and row["phase"] == "after")
    assert honest["commit_sha"] == git("rev-parse", tasks["honest"]["branch"], cwd=git_repo).strip()
    assert Path(honest["log_path"]).is_file()
    shared = next(row for row in checks if row["task_id"] == "honest-shared")
    assert shared["commit_sha"] == record["commits"][-1]["sha"] or shared["passed"]
    assert not list((StatePaths(git_repo).private / "checks").iterdir())  # every scratch tree went

    shown = json.loads(stella_main("runs", record["run"]["id"], "--json", cwd=git_repo).stdout)
    by_task = {t["id"]: t for wave in shown["waves"] for t in wave["tasks"]}
    liar_check = by_task["liar"]["attempts"][-1]["checks"][0]
    assert {k: liar_check[k] for k in ("phase", "command", "exit_code", "passed")} == {
        "phase": "after",
        "command": _says_right("liar"),
        "exit_code": 1,
        "passed": False,
    }
    assert "liar.txt is not right" in liar_check["output_tail"] and liar_check["commit"]
    assert by_task["nothing"]["no_commits"] is False  # failed, not succeeded with none
    listing = stella_main("runs", record["run"]["id"], cwd=git_repo).stdout
    assert "check after" in listing and "exit 1" in listing, listing

    liar = tasks_attempt(record, "liar")
    view = load_attempt(StatePaths(git_repo).fleet_db, liar, now_ms=record["run"]["created_at_ms"])
    assert view is not None and view["checks"][0]["exit_code"] == 1
    page = load_run_page(StatePaths(git_repo).fleet_db, record["run"]["id"], now_ms=0)
    strip = {item["task"]: item["text"] for item in page["attention"] if item["kind"] == "failed"}
    assert strip["liar"].startswith("check failed (exit 1): liar.txt is not right")

    merged = stella_main("merge", "--unwatched", "--json", cwd=git_repo)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        again = [row for row in ledger.checks.of_run(record["run"]["id"]) if row["phase"] == "merge"]
    assert {row["task_id"] for row in again} == {"fixed", "honest"} and all(row["passed"] for row in again), (
        merged.stdout,
        again,
    )


def tasks_attempt(record: dict[str, object], task_id: str) -> int:
    attempts = [a for a in record["attempts"] if a["task_id"] == task_id]  # type: ignore[attr-defined]
    return int(attempts[-1]["id"])
