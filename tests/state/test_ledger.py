"""The fleet ledger on real SQLite files: schema, the documented query, queries the UI needs, refusals."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from helpers.needs import missing

from stellafleet.core.errors import StellaError
from stellafleet.core.status import AttemptEnd
from stellafleet.plan.model import PlanTask
from stellafleet.state.ledger import Ledger
from stellafleet.state.ledger_schema import LEDGER_SCHEMA
from stellafleet.testing.sample_ledger import StepClock, add_run, leave_for_you

DOC_QUERY = (
    "SELECT a.task_id, a.branch, a.summary FROM attempts a WHERE a.run_id = "
    "(SELECT id FROM runs ORDER BY created_at_ms DESC LIMIT 1) AND a.success = 0;"
)

# The public interface: users' queries depend on these names.
CONTRACT_COLUMNS = {
    "runs": "id created_at_ms finished_at_ms status plan_path plan_sha256 base_ref base_commit"
    " max_concurrency spend_limit_usd spend_usd pipeline argv root pid exit_code reason"
    " schedule resumed_from executor",
    "tasks": "run_id id title prompt depends_on_json claims_json isolation wave status reason pipeline"
    " model timeout_s branch worktree expands parent_id fragment_path base stale check_command"
    " check_timeout_s",
    "attempts": "id run_id task_id started_at_ms finished_at_ms success outcome branch worktree pid"
    " exit_code spend_usd input_tokens output_tokens steps summary error cpu_seconds peak_rss_bytes"
    " pipeline log_path transcript_path node reason token_sha256 last_progress_ms guard_usd"
    " cache_read_tokens cache_write_tokens setup_ms salvage_ref salvage_sha start_commit start_parents_json"
    " unclaimed_writes worktree_index setup_started_ms pid_started_ms",
    "commits": "sha run_id task_id attempt_id branch message committed_at_ms",
    "ci": "run_id branch task_id head_sha pr_url pr_number state conclusion reason run_urls_json"
    " updated_at_ms",
    "cleanups": "id run_id task_id kind target action reason at_ms",
    "spend_events": "id attempt_id run_id usd input_tokens output_tokens at_ms seq cache_read_tokens"
    " cache_write_tokens",
    "limit_events": "id run_id attempt_id task_id at_ms source kind status reset_at_ms message concurrency",
    "merges": "id run_id task_id branch position strategy onto_ref before_sha after_sha status reason"
    " files_json check_command check_tail started_at_ms finished_at_ms batch_id",
    "merge_batches": "id run_id number window members_json onto_ref before_sha combined_sha after_sha"
    " steps_json outcome started_at_ms finished_at_ms",
    "checks": "id run_id task_id attempt_id merge_id phase command exit_code passed duration_ms commit_sha"
    " output_tail log_path at_ms",
    "requests": "id run_id task_id branch reason context state asked_by asked_at_ms from_attempt_id start_at"
    " not_before_ms taken_at_ms attempt_id ended_at_ms why answer_kind answer answered_by answered_at_ms",
    "attempt_facts": "attempt_id key value_json at_ms",
}


def new_run(ledger: Ledger, run_id: str, **overrides: object) -> None:
    fields: dict = dict(
        plan_path="plan.toml",
        plan_sha256="ab" * 32,
        base_ref="HEAD",
        base_commit="c0" * 20,
        max_concurrency=2,
        spend_limit_usd=6.0,
        argv=["stella", "fleet", "--plan", "plan.toml"],
        pid=4242,
    )
    fields.update(overrides)
    add_run(ledger, run_id, **fields)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / ".stella" / "private" / "fleet.db"


def test_a_new_ledger_has_the_contract_schema_in_wal_mode(db: Path) -> None:
    Ledger.open(db).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LEDGER_SCHEMA.version == 13
    for table, columns in CONTRACT_COLUMNS.items():
        have = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        assert have == columns.split(), table
    conn.close()
    assert sorted(p.name for p in db.parent.iterdir() if not p.name.startswith("fleet.db")) == []


def test_the_documented_query_finds_the_failed_attempt_of_the_latest_run(db: Path) -> None:
    ticks = StepClock(1_700_000_000_000)
    with Ledger.open(db, now_ms=ticks) as ledger:
        new_run(ledger, "r-old")
        ledger.tasks.add("r-old", [PlanTask("t1", "p", "old task")], {"t1": 1})
        old = ledger.attempts.start("r-old", "t1", pipeline="command", branch="fleet/old")
        ledger.attempts.finish(old, AttemptEnd(outcome="failed", exit_code=1, summary="old failure"))
        ticks.ms += 60_000
        new_run(ledger, "r-new")
        ledger.tasks.add(
            "r-new", [PlanTask("ok", "p", "fine"), PlanTask("bad", "p", "broken")], {"ok": 1, "bad": 1}
        )
        good = ledger.attempts.start("r-new", "ok", pipeline="command", branch="main")
        bad = ledger.attempts.start("r-new", "bad", pipeline="command", branch="fleet/bad-0123456789abcdef")
        running = ledger.attempts.start("r-new", "bad", pipeline="command")
        ledger.attempts.finish(good, AttemptEnd(outcome="succeeded", exit_code=0, summary="all good"))
        ledger.attempts.finish(
            bad, AttemptEnd(outcome="failed", exit_code=1, summary="tests still fail in parser.py")
        )
        del running  # still running: success is NULL, so the query leaves it out

    expected = [("bad", "fleet/bad-0123456789abcdef", "tests still fail in parser.py")]
    conn = sqlite3.connect(db)
    assert conn.execute(DOC_QUERY).fetchall() == expected
    conn.close()

    cli = shutil.which("sqlite3")
    if cli is None:
        missing("the sqlite3 command-line shell is not installed (the Python check above passed)")
    out = subprocess.run([cli, str(db), DOC_QUERY], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines() == ["bad|fleet/bad-0123456789abcdef|tests still fail in parser.py"]


def test_run_lifecycle_and_everything_get_run_returns(db: Path) -> None:
    ticks = StepClock(1_700_000_000_000)
    with Ledger.open(db, now_ms=ticks) as ledger:
        new_run(ledger, "r-20261130-aaaa")
        tasks = [
            PlanTask("schema", "Add the migration", "Add the migration", claims=("src/store/schema.rs",)),
            PlanTask("reader", "Read", "Read path", depends_on=("schema",), claims=("src/store/read.rs",)),
            PlanTask(
                "docs", "Docs", "Rewrite", depends_on=("reader",), isolation="isolated", model="m", timeout=60
            ),
        ]
        ledger.tasks.add("r-20261130-aaaa", tasks, {"schema": 1, "reader": 2, "docs": 3})
        ledger.tasks.set_status("r-20261130-aaaa", "schema", "running")
        attempt = ledger.attempts.start(
            "r-20261130-aaaa", "schema", pipeline="command", log_path="l", transcript_path="t"
        )
        ledger.attempts.set_pid(attempt, 999)
        ledger.spend.add(attempt, 0.25, input_tokens=100, output_tokens=10, steps=1)
        ledger.spend.add(attempt, 0.5, input_tokens=50, output_tokens=5, steps=2)
        where = {"run_id": "r-20261130-aaaa", "task_id": "schema", "branch": "main"}
        assert ledger.commits.record([("f" * 40, "Add receipts", ticks.ms)], attempt_id=attempt, **where) == 1
        # a commit this run already has is left as it was
        assert ledger.commits.record([("f" * 40, "again", ticks.ms)], attempt_id=None, **where) == 0
        ticks.ms += 1500
        done = AttemptEnd("succeeded", "done", exit_code=0, cpu_seconds=1.5, peak_rss_bytes=1 << 20)
        ledger.attempts.finish(attempt, done)
        ledger.tasks.set_status("r-20261130-aaaa", "schema", "succeeded")
        ledger.tasks.set_status("r-20261130-aaaa", "reader", "failed", "claim conflict: ...")
        ledger.tasks.set_status("r-20261130-aaaa", "docs", "skipped", "dependency failed: reader")
        ledger.tasks.set_workspace("r-20261130-aaaa", "docs", "fleet/docs-0123456789abcdef", "/w/docs")
        ledger.ci.upsert(run_id="r-20261130-aaaa", branch="fleet/docs", task_id="docs", head_sha="a" * 40,
                         pr_url=None, pr_number=None, state="pending", conclusion=None, reason=None,
                         run_urls=[])  # fmt: skip
        ledger.ci.upsert(run_id="r-20261130-aaaa", branch="fleet/docs", task_id="docs", head_sha="b" * 40,
                         pr_url="https://example.invalid/pr/7", pr_number=7, state="green",
                         conclusion="success", reason=None,
                         run_urls=["https://example.invalid/run/1"])  # fmt: skip
        ledger.cleanups.record(run_id="r-20261130-aaaa", task_id="docs", kind="worktree", target="/w/docs",
                              action="kept", reason="unmerged work")  # fmt: skip
        ticks.ms += 500
        ledger.runs.finish("r-20261130-aaaa", "failed", exit_code=1, reason="1 task failed")

        assert ledger.spend.of_run("r-20261130-aaaa") == pytest.approx(0.75)
        got = ledger.get_run("r-20261130-aaaa")
    run = got["run"]
    assert (run["status"], run["exit_code"], run["reason"]) == ("failed", 1, "1 task failed")
    assert run["finished_at_ms"] - run["created_at_ms"] == 2000
    assert run["argv"] == '["stella", "fleet", "--plan", "plan.toml"]'
    assert [(t["id"], t["wave"], t["status"], t["reason"]) for t in got["tasks"]] == [
        ("schema", 1, "succeeded", None),
        ("reader", 2, "failed", "claim conflict: ..."),
        ("docs", 3, "skipped", "dependency failed: reader"),
    ]
    assert got["tasks"][1]["depends_on"] == ["schema"] and got["tasks"][0]["claims"] == [
        "src/store/schema.rs"
    ]
    assert (got["tasks"][2]["isolation"], got["tasks"][2]["timeout_s"], got["tasks"][2]["model"]) == (
        "isolated", 60.0, "m",
    )  # fmt: skip
    assert got["tasks"][2]["branch"] == "fleet/docs-0123456789abcdef"
    [a] = got["attempts"]
    assert (a["success"], a["outcome"], a["pid"], a["steps"], a["input_tokens"], a["output_tokens"]) == (
        1, "succeeded", 999, 3, 150, 15,
    )  # fmt: skip
    assert a["spend_usd"] == pytest.approx(0.75) and a["finished_at_ms"] - a["started_at_ms"] == 1500
    assert [c["message"] for c in got["commits"]] == ["Add receipts"]
    [ci] = got["ci"]
    assert (ci["state"], ci["pr_number"], ci["head_sha"], ci["run_urls"]) == (
        "green", 7, "b" * 40, ["https://example.invalid/run/1"],
    )  # fmt: skip
    assert [(c["kind"], c["action"]) for c in got["cleanups"]] == [("worktree", "kept")]


def test_list_runs_pages_newest_first_with_counts_and_durations(db: Path) -> None:
    ticks = StepClock(1_700_000_000_000)
    with Ledger.open(db, now_ms=ticks) as ledger:
        for n in range(5):
            new_run(ledger, f"r-{n}")
            ledger.tasks.add(f"r-{n}", [PlanTask(f"t{i}", "p", "t") for i in range(3)], {})
            ledger.spend.add(ledger.attempts.start(f"r-{n}", "t0", pipeline="command"), 0.01 * n)
            ledger.tasks.set_status(f"r-{n}", "t0", "succeeded")
            ledger.tasks.set_status(f"r-{n}", "t1", "failed", "boom")
            ticks.ms += 1000
            if n != 4:
                ledger.runs.finish(f"r-{n}", "failed", exit_code=1)
            ticks.ms += 1000
        assert ledger.runs.count() == 5
        first = ledger.runs.page(limit=2)
        second = ledger.runs.page(limit=2, offset=2)
        rest = ledger.runs.page(limit=10, offset=4)
        assert ledger.runs.page(offset=5) == []
    assert [r["id"] for r in first + second + rest] == ["r-4", "r-3", "r-2", "r-1", "r-0"]
    newest = first[0]
    assert newest["task_counts"] == {"succeeded": 1, "failed": 1, "pending": 1}
    assert newest["tasks_total"] == 3 and newest["attempts_total"] == 1
    assert newest["status"] == "running" and newest["duration_ms"] is None
    assert first[1]["duration_ms"] == 1000 and first[1]["spend_usd"] == pytest.approx(0.03)


def test_resolve_run_id(db: Path) -> None:
    ticks = StepClock(1_700_000_000_000)
    with Ledger.open(db, now_ms=ticks) as ledger:
        with pytest.raises(StellaError, match="no fleet runs recorded"):
            ledger.runs.resolve(None)
        for run_id in ("r-20261130-aaaa", "r-20261130-aabb", "r-20261201-cccc"):
            new_run(ledger, run_id)
            ticks.ms += 1
        assert ledger.runs.latest_id() == "r-20261201-cccc"
        assert ledger.runs.resolve(None) == ledger.runs.resolve("latest") == "r-20261201-cccc"
        assert ledger.runs.resolve("r-20261130-aaaa") == "r-20261130-aaaa"
        assert ledger.runs.resolve("r-20261201") == "r-20261201-cccc"
        with pytest.raises(StellaError, match=r"matches several runs \(r-20261130-aaaa, r-20261130-aabb\)"):
            ledger.runs.resolve("r-20261130")
        with pytest.raises(StellaError, match="no run matches 'nope'"):
            ledger.runs.resolve("nope")
        with pytest.raises(StellaError, match="no run 'nope'"):
            ledger.get_run("nope")
        with pytest.raises(StellaError, match="already in the ledger"):
            new_run(ledger, "r-20261130-aaaa")


def test_bad_status_values_are_programming_errors(db: Path) -> None:
    with Ledger.open(db) as ledger:
        new_run(ledger, "r")
        with pytest.raises(ValueError, match="unknown run status 'done'"):
            ledger.runs.finish("r", "done", exit_code=0)
        with pytest.raises(StellaError, match="no attempt 77"):
            ledger.spend.add(77, 1.0)


def test_the_ui_queries_use_indexes(db: Path) -> None:
    """No full scans of tasks or attempts behind the UI's queries (bench/ledger_listing.py times them)."""
    with Ledger.open(db) as ledger:
        new_run(ledger, "r")
        statements: list[str] = []
        ledger._db.conn.set_trace_callback(statements.append)
        ledger.runs.page(limit=50)
        ledger.get_run("r")
        ledger._db.conn.set_trace_callback(None)
        plans = []
        for sql in statements:
            if sql.lstrip().upper().startswith("SELECT"):
                plans += [row[3] for row in ledger._db.conn.execute("EXPLAIN QUERY PLAN " + sql)]
    full_scans = [p for p in plans if p.startswith("SCAN") and "USING" not in p and "json_each" not in p]
    assert not full_scans, plans
    assert "SCAN runs USING INDEX runs_by_created" in plans


def test_every_query_in_the_ledger_docs_runs(db: Path) -> None:
    ticks = StepClock(1_700_000_000_000)
    with Ledger.open(db, now_ms=ticks) as ledger:
        new_run(ledger, "r-20261130-091500-1a2b")
        ledger.tasks.add(
            "r-20261130-091500-1a2b", [PlanTask("writer", "p", "Write", claims=("src/store/schema.rs",))], {}
        )
        emitted = [
            PlanTask("split", "p", "Split", expands=True),
            PlanTask("split.m1", "p", "M1", parent="split"),
        ]
        ledger.tasks.add("r-20261130-091500-1a2b", emitted, {})
        attempt = ledger.attempts.start("r-20261130-091500-1a2b", "writer", pipeline="plain")
        ledger.spend.add(attempt, 0.5, input_tokens=10, output_tokens=2)
        ledger.commits.record(
            [("a" * 40, "m", ticks.ms)],
            run_id="r-20261130-091500-1a2b",
            task_id="writer",
            attempt_id=attempt,
            branch="main",
        )
        ticks.ms += 1000
        ledger.attempts.finish(attempt, AttemptEnd(outcome="failed", exit_code=1, summary="nope"))
        ledger.tasks.set_status("r-20261130-091500-1a2b", "writer", "skipped", "spend limit reached")
        leave_for_you(ledger, "r-20261130-091500-1a2b", "writer", "nope", attempt=attempt)
        ledger.runs.finish("r-20261130-091500-1a2b", "failed", exit_code=1)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "ledger.md").read_text()
    queries = [block.split("```")[0] for block in docs.split("```sql\n")[1:]]
    assert len(queries) >= 7
    conn = sqlite3.connect(db)
    for query in queries:
        assert conn.execute(query.replace("attempt_id = 42", f"attempt_id = {attempt}")).fetchall(), query
    conn.close()


def test_a_succeeded_task_with_no_commit_is_flagged_shared_or_isolated(db: Path) -> None:
    from stellafleet.state.views import run_model

    tasks = [PlanTask("shared", "p", "t"), PlanTask("iso", "p", "t", isolation="isolated")]
    tasks.append(PlanTask("made-one", "p", "t"))
    with Ledger.open(db) as ledger:
        new_run(ledger, "r1")
        ledger.tasks.add("r1", tasks, {t.id: 1 for t in tasks})
        for task in tasks:
            attempt = ledger.attempts.start("r1", task.id, pipeline="command")
            ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="done"))
        ledger.commits.record(
            [("a" * 40, "m", 1)], run_id="r1", task_id="made-one", attempt_id=None, branch="main"
        )
        model = run_model(ledger.get_run("r1"), now_ms=0, alive=lambda pid, at: False)
        [row] = ledger.runs.page(limit=1, offset=0)
    assert model["run"]["no_commits"] == ["shared", "iso"] == row["no_commits"]
