"""Leased ports and named locks in real fleets: two repositories' fleets of isolated tasks whose workers and
checks all bind their STELLA_PORT at once never collide; tasks with a lock in common never overlap while
others do; a killed fleet's leases are freed by the next command, a live one's by none."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from helpers.engine import make_repo
from helpers.fleet import Scripts, by_id, run_record, wait_until, write_config
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths
from stellafleet.state.ledger import Ledger

# binds STELLA_PORT (where a dev server or a test server would listen) for a moment, and says when: a bind
# that fails (EADDRINUSE) exits 1 with the error, and fails the task
BIND = """\
import os, socket, sys, time
from pathlib import Path
port, start = int(os.environ["STELLA_PORT"]), time.time()
with socket.socket() as server:
    server.bind(("127.0.0.1", port))
    server.listen()
    time.sleep(0.1)
marks = Path(os.environ["MARKS"])
(marks / f"{os.environ['STELLA_TASK_ID']}.{sys.argv[1]}").write_text(f"{port} {start} {time.time()}")
"""
PORTS = 16  # isolated tasks in each of the two fleets


def _fleet(root: Path, plan: Path, marks: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command", *extra],
        cwd=root, env={**os.environ, "MARKS": str(marks)}, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _leased(root: Path) -> dict[str, list[int]]:
    """task -> the ports its attempts were leased, from the ledger's attempt facts."""
    with Ledger.open(StatePaths(root).fleet_db, readonly=True) as ledger:
        run = ledger.runs.resolve(None)
        return {
            attempt["task_id"]: ledger.facts.of_attempt(attempt["id"]).get("ports", [])
            for attempt in ledger.attempts.of_run(run)
        }


def test_two_repositories_fleets_binding_their_leased_ports_at_once_never_collide(
    tmp_path: Path, isolated_home: Path
) -> None:
    script = tmp_path / "bind.py"
    script.write_text(BIND)
    bind = f"{shlex.quote(sys.executable)} -S {shlex.quote(str(script))}"
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[defaults]\nisolation = "isolated"\nports = 1\n'
        f"check = {json.dumps(bind + ' check')}\n\n"
        + "".join(f'[[tasks]]\nid = "p{n}"\nprompt = "serve"\n\n' for n in range(PORTS))
    )
    fleets = []
    for name in ("one", "two"):
        root, marks = make_repo(tmp_path / name, {"README.md": "# test\n"}), tmp_path / f"marks-{name}"
        marks.mkdir()
        write_config(root, run=f"{bind} worker")
        fleets.append((root, marks, _fleet(root, plan, marks, "--max-concurrency", str(PORTS))))
    ports: list[int] = []
    for root, marks, fleet in fleets:
        out, _ = fleet.communicate(timeout=120)
        assert fleet.returncode == 0, out  # no worker and no check met EADDRINUSE
        leased = _leased(root)
        assert sorted(leased) == sorted(f"p{n}" for n in range(PORTS))
        for task, [port] in leased.items():  # the worker and its check bound the port the ledger says
            assert int((marks / f"{task}.worker").read_text().split()[0]) == port
            assert int((marks / f"{task}.check").read_text().split()[0]) == port
            ports.append(port)
    assert len(set(ports)) == 2 * PORTS  # no port given twice, across the two repositories


LOCKED = """\
import os, sqlite3, time
from pathlib import Path
marks, task = Path(os.environ["MARKS"]), os.environ["STELLA_TASK_ID"]
start = time.time()
(marks / f"{task}.tmp").write_text(f"{os.environ['TMPDIR']} {os.path.isdir(os.environ['TMPDIR'])}")
if task in ("free1", "free2"):  # these two meet: each waits until the other has started
    (marks / f"{task}.started").write_text("")
    other = marks / ("free2.started" if task == "free1" else "free1.started")
    while not other.exists() and time.time() - start < 20:
        time.sleep(0.01)
else:  # holding db:test: until the other one is seen waiting for it in the host's store (or has run)
    store = Path(os.environ["XDG_STATE_HOME"]) / "stella" / "leases.db"
    other = marks / ("db2.worker" if task == "db1" else "db1.worker")
    while time.time() - start < 20 and not other.exists():
        with sqlite3.connect(store) as db:
            if db.execute("SELECT COUNT(*) FROM lock_waits").fetchone()[0]:
                break
        time.sleep(0.02)
(marks / f"{task}.worker").write_text(f"{start} {time.time()}")
"""
CHECK = 'python3 -c "import time; time.sleep(0.1)"; date +%s.%N >> "$MARKS/$STELLA_TASK_ID.check-end"'
LOCK_PLAN = f"""\
[[tasks]]
id = "db1"
prompt = "migrate"
isolation = "isolated"
locks = ["db:test"]
check = {json.dumps(CHECK)}

[[tasks]]
id = "db2"
prompt = "seed"
isolation = "isolated"
locks = ["db:test"]
check = {json.dumps(CHECK)}

[[tasks]]
id = "free1"
prompt = "lint"

[[tasks]]
id = "free2"
prompt = "format"
"""


def test_tasks_with_a_lock_in_common_never_overlap_while_the_others_do(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("locked", LOCKED))
    plan = tmp_path / "plan.toml"
    plan.write_text(LOCK_PLAN)
    shown = stella_main("plan", "show", str(plan), cwd=git_repo).stdout
    assert "locks: db:test" in shown
    dry = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", "--dry-run", cwd=git_repo).stdout
    assert "db1 [command]" in dry and "locks db:test" in dry
    ran = stella_main(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "waiting for lock db:test (held by db" in ran.stdout  # the second one said whom it waits for

    def held(task: str) -> tuple[float, float]:  # from its worker's start to its check's end
        start = float((marks / f"{task}.worker").read_text().split()[0])
        return start, float((marks / f"{task}.check-end").read_text().split()[-1])

    (a_start, a_end), (b_start, b_end) = held("db1"), held("db2")
    assert a_end <= b_start or b_end <= a_start, "two tasks holding db:test overlapped"
    assert (marks / "free1.worker").exists() and (marks / "free2.worker").exists()  # they met: at once

    record = run_record(git_repo)
    attempts = by_id(record["attempts"], "task_id")
    shown_run = stella_main("runs", record["run"]["id"], "--json", cwd=git_repo).stdout
    tasks = {t["id"]: t for wave in json.loads(shown_run)["waves"] for t in wave["tasks"]}
    assert tasks["db1"]["attempts"][0]["facts"]["locks"] == ["db:test"]
    assert "locks" not in tasks["free1"]["attempts"][0]["facts"]
    assert "locks db:test" in stella_main("runs", record["run"]["id"], cwd=git_repo).stdout
    assert attempts["db1"]["success"] == 1
    tmpdirs = {(marks / f"{task}.tmp").read_text() for task in ("db1", "db2", "free1", "free2")}
    private = StatePaths(git_repo).private / "tmp"
    assert {Path(text.split()[0]).parent for text in tmpdirs} == {private} and len(tmpdirs) == 4
    assert all(text.endswith(" True") for text in tmpdirs)  # each attempt had its own, made for it
    assert not list(private.iterdir())  # and it went with the attempt


HOLD = 'touch "$MARKS/holding.$STELLA_PORT"; while [ ! -e "$MARKS/go" ]; do sleep 0.05; done'


def test_a_killed_fleets_leases_are_freed_by_the_next_command_and_a_live_ones_never(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=HOLD)
    plan = tmp_path / "plan.toml"
    plan.write_text('[[tasks]]\nid = "a"\nprompt = "serve"\nlocks = ["port:5199"]\nports = 2\n')
    fleet = _fleet(git_repo, plan, marks)
    try:
        wait_until(lambda: any(marks.glob("holding.*")), "the worker to hold its leases", process=fleet)
        live = json.loads(stella_main("leases", "--json", cwd=git_repo).stdout)
        assert [(row["name"], row["task_id"], row["pid"]) for row in live["locks"]] == [
            ("port:5199", "a", fleet.pid)
        ]
        assert len(live["ports"]) == 2  # another command never frees a live fleet's leases
        fleet.send_signal(signal.SIGKILL)
        fleet.wait(timeout=30)
        after = json.loads(stella_main("leases", "--json", cwd=git_repo).stdout)
        assert after["locks"] == [] and after["ports"] == [] and after["waiting"] == []
    finally:
        (marks / "go").touch()
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()
