"""Park instead of deny, with the engine's `ask`: the task parks (its dependent waits, the independent
task goes on, exit 5, one inbox item, one `parked` event), a bad answer changes nothing (exit 2), and after
`stella answer`, `stella fleet --resume` serves the answer first, in the task's own session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.engine import make_repo
from helpers.enginefleet import configure
from helpers.fleet import by_id, run_record
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths
from stellafleet.run.parked import only_parked
from stellafleet.state.dashboard import load_run_page
from stellafleet.state.ledger import Ledger
from stellafleet.testing.model_server import ScriptedModelServer

QUESTION = "Which colour should the button be?"


def finish(task: str) -> dict[str, Any]:
    call = {"name": "finish", "arguments": {"summary": f"{task} done"}}
    return {"tool_calls": [call], "usage": {"input_tokens": 900, "output_tokens": 10}}


def ask() -> dict[str, Any]:
    call = {"name": "ask", "arguments": {"question": QUESTION}}
    return {
        "text": "I need a decision.",
        "tool_calls": [call],
        "usage": {"input_tokens": 800, "output_tokens": 9},
    }


PLAN = """\
[[tasks]]
id = "asker"
prompt = "marker-asker: paint the button"

[[tasks]]
id = "after"
prompt = "marker-after: document the button"
depends_on = ["asker"]

[[tasks]]
id = "other"
prompt = "marker-other: unrelated"
"""


def test_an_engine_task_that_asks_parks_and_goes_on_in_its_session_once_answered(
    tmp_path: Path, stella_main: StellaRunner
) -> None:
    root = make_repo(tmp_path / "repo")
    heard = tmp_path / "heard.jsonl"
    scripts = {
        "marker-asker": [ask(), finish("asker")],
        "marker-after": [finish("after")],
        "marker-other": [finish("other")],
    }
    (tmp_path / "plan.toml").write_text(PLAN)
    plan = str(tmp_path / "plan.toml")
    with ScriptedModelServer([], scripts=scripts) as server:
        configure(root, server)
        with (root / ".stella/config.toml").open("a") as config:
            config.write(f"\n[notify]\ncommand = {json.dumps(f'cat >> {heard}; echo >> {heard}')}\n")
        parked = stella_main("fleet", "--plan", plan, "--max-concurrency", "1", cwd=root)
        assert parked.returncode == 5, parked.stdout + parked.stderr
        assert "parked: 1 task waits on you" in parked.stderr
        assert "exit 5" in parked.stdout + parked.stderr and "exit 1" not in parked.stdout + parked.stderr
        first = run_record(root)
        tasks = by_id(first["tasks"])
        assert (tasks["asker"]["status"], tasks["other"]["status"]) == ("parked", "succeeded")
        # it waits: --resume runs it once the asker is done
        assert (tasks["after"]["status"], tasks["after"]["reason"]) == ("skipped", "waits on parked: asker")
        assert first["run"]["status"] == "parked" and first["run"]["exit_code"] == 5

        inbox = json.loads(stella_main("inbox", "--json", cwd=root).stdout)["items"]
        (item,) = inbox
        assert item["task_id"] == "asker" and item["parked"]["question"] == QUESTION
        assert item["parked"]["last_words"] == "I need a decision."

        page = load_run_page(StatePaths(root).fleet_db, first["run"]["id"], now_ms=0)
        (lane, *_rest) = page["attention"]  # the "needs you" lane comes first, with its answer command
        assert (lane["kind"], lane["task"]) == (
            "parked",
            "asker",
        ) and f"stella answer {item['item']}" in lane["text"]
        with Ledger.open(StatePaths(root).fleet_db) as ledger:  # as a killed fleet's recovery would
            ledger.abandon_run(first["run"]["id"], "its fleet was killed")
        assert json.loads(stella_main("inbox", "--json", cwd=root).stdout)["items"] == [item]  # still parked
        early = stella_main("fleet", "--plan", plan, "--resume", first["run"]["id"], cwd=root)
        assert early.returncode == 5, early.stdout + early.stderr  # no answer yet: it stays parked
        still = run_record(root)
        assert [a["summary"] for a in still["attempts"]] == [
            f"still parked: asks: {QUESTION} (stella answer {item['item']})"
        ]
        number = str(item["item"])
        for bad, says in (
            (("answer", "999", "blue"), "no item 999"),
            (("answer", number, "--allow"), "asks a question"),
        ):
            refused = stella_main(*bad, cwd=root)
            assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr
        assert stella_main("answer", number, "blue, like the sky", cwd=root).returncode == 0
        again = stella_main("answer", number, "red", cwd=root)
        assert again.returncode == 2 and "already answered" in again.stderr

        resumed = stella_main("fleet", "--plan", plan, "--resume", still["run"]["id"], cwd=root)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        answer_call = next(r.body for r in server.requests if "blue, like the sky" in json.dumps(r.body))
    events = [json.loads(line) for line in heard.read_text().splitlines() if line.strip()]
    told = [e for e in events if e["event"] == "parked"]  # once, though it was parked in two runs
    assert len(told) == 1 and told[0]["item"] == item["item"] and told[0]["question"] == QUESTION
    ended = [e for e in events if e["event"] == "run_ended"]  # the run's end is said as parked, exit 5
    assert (ended[0]["status"], ended[0]["exit_code"]) == ("parked", 5), ended
    second = run_record(root)
    tasks = by_id(second["tasks"])
    assert tasks["asker"]["status"] == tasks["after"]["status"] == "succeeded"
    # the asker went on in its session: the question it asked, then the answer as the next message
    said = json.dumps(answer_call["messages"])
    assert QUESTION in said and "blue, like the sky" in said
    assert "blue, like the sky" in json.dumps(answer_call["messages"][-1])  # the answer is what is new
    assert sum("marker-asker" in json.dumps(m) for m in answer_call["messages"]) == 1  # the task once
    asker = next(a for a in second["attempts"] if a["task_id"] == "asker")
    assert asker["reason"] == "answer"
    facts = {f["key"]: f["value"] for f in second["facts"] if f["attempt_id"] == asker["id"]}
    assert facts["session_start"].startswith("resumed session asker.jsonl")
    (answered,) = [r for r in run_record(root, first["run"]["id"])["requests"] if r["reason"] == "answer"]
    assert answered["state"] == "served" and answered["attempt_id"] == asker["id"]
    assert answered["answer"] == "blue, like the sky" and answered["answered_by"]
    assert stella_main("inbox", cwd=root).stdout.strip() == "nothing waits on you"
    late = stella_main("answer", number, "green", cwd=root)  # served by now: one line, exit 2
    assert late.returncode == 2 and "already answered" in late.stderr


def test_only_parked_work_left_is_what_exit_5_means() -> None:
    parked = {"id": "a", "status": "parked"}
    waits = {"id": "b", "status": "skipped", "reason": "waits on parked: a"}
    assert only_parked([parked, waits, {"id": "c", "status": "succeeded"}]) == ["a"]
    assert only_parked([parked, {"id": "d", "status": "failed"}]) == []
    assert only_parked([parked, {"id": "e", "status": "skipped", "reason": "dependency failed: d"}]) == []
