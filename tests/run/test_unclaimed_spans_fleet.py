"""Issue 49 item 7, end to end: a `command` task writes (through its shell) into the file an engine task
claims, between the engine's tool calls, and ends while the engine still runs. The engine's write spans
show it could not have made that write: the intruder is named and fails under `[fleet] strict_claims`; the
claimant is not blamed, and its summary says its file was last changed while the intruder ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.engine import make_repo
from helpers.enginefleet import configure
from helpers.fleet import Scripts, by_id, run_record, toml_str
from helpers.repo import StellaRunner

from stellafleet.testing.model_server import ScriptedModelServer

ENDED = "INTRUDER-ENDED"  # the observer's word to the model server once the intruder's end is recorded


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": name, "arguments": arguments}],
        "usage": {"input_tokens": 500, "output_tokens": 9},
    }


# the intruder: once the claimant's write_file call has closed, past its edge, `sed -i` on the claimant's file
INTRUDER = """\
import sqlite3
store = WS / ".stella/private/store.db"
def closed():
    with sqlite3.connect(store) as conn:
        return conn.execute("SELECT count(*) FROM write_spans WHERE end_ns IS NOT NULL").fetchone()[0]
while not closed():
    time.sleep(0.02)
time.sleep(0.2)  # past the span's edge (EDGE_NS, 50 ms)
subprocess.run(["sed", "-i", "s/the claimant/the intruder/", str(WS / "c.txt")], check=True)
"""

# the observer (an isolated task, not judged): once the intruder's end is recorded, it tells the model
# server, which then answers the claimant's waiting request
OBSERVER = """\
import sqlite3, urllib.error, urllib.request
ledger = Path({root!r}) / ".stella/private/fleet.db"
def ended():
    with sqlite3.connect(ledger) as conn:
        row = "SELECT count(*) FROM attempts WHERE task_id = 'intruder' AND finished_at_ms IS NOT NULL"
        return conn.execute(row).fetchone()[0]
while not ended():
    time.sleep(0.02)
try:
    urllib.request.urlopen({url!r}, data=json.dumps({{"marker": {ended!r}}}).encode())
except urllib.error.HTTPError:
    pass  # the default script is empty: the request only had to be seen
"""

PLAN = """\
[[tasks]]
id = "claimant"
prompt = "marker-claimant: write c.txt"
claims = ["c.txt"]

[[tasks]]
id = "intruder"
prompt = "format the code"
pipeline = "command"
claims = ["i.txt"]

[[tasks]]
id = "observer"
prompt = "watch"
pipeline = "command"
isolation = "isolated"
"""


def test_an_intruder_writing_a_running_engine_tasks_file_is_named_and_the_claimant_is_not(
    tmp_path: Path, stella_main: StellaRunner
) -> None:
    root = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "c.txt": "original\n", "i.txt": "x\n"})
    claimant = [
        call("write_file", path="c.txt", content="the claimant's line\n"),
        {**call("commit", message="Write c.txt", paths=["c.txt"]), "after": ENDED},
        call("finish", summary="wrote c.txt"),
    ]
    scripts = Scripts(tmp_path / "scripts")
    with ScriptedModelServer([], scripts={"marker-claimant": claimant}) as server:
        configure(root, server, fleet="strict_claims = true")
        observer = OBSERVER.format(
            root=str(root), url=f"{server.openai_base_url}/chat/completions", ended=ENDED
        )
        commands = {
            "intruder": scripts.python("intruder", INTRUDER),
            "observer": scripts.python("observer", observer),
        }
        with (root / ".stella/config.toml").open("a") as config:
            for task, command in commands.items():
                config.write(f"\n[pipelines.command.tasks.{task}]\nrun = {toml_str(command)}\n")
        (tmp_path / "plan.toml").write_text(PLAN)
        done = stella_main("fleet", "--plan", str(tmp_path / "plan.toml"), "--max-concurrency", "3", cwd=root)
        assert done.returncode == 1, done.stdout + done.stderr
        assert server.remaining == 0
    attempts = by_id(run_record(root)["attempts"], "task_id")
    intruder, claimant_row = attempts["intruder"], attempts["claimant"]
    assert intruder["outcome"] == "failed"
    assert intruder["error"] == "changed files it did not claim: c.txt ([fleet] strict_claims)"
    assert json.loads(intruder["unclaimed_writes"]) == ["c.txt"]
    # the claimant is not blamed; its record says the file it committed holds a change made while the
    # intruder ran, between its own tool calls
    assert claimant_row["outcome"] == "succeeded" and json.loads(claimant_row["unclaimed_writes"]) == []
    assert claimant_row["summary"] == (
        "wrote c.txt; c.txt was last changed outside this task's tool calls (while intruder ran)"
    )
    assert (root / "c.txt").read_text() == "the intruder's line\n"
