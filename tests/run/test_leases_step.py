"""Where an attempt's leases reach besides its worker: `stella merge`'s check of the task's branch (its
scratch tree's setup too) holds the task's locks and sees its ports; `stella clean` hands a removed
worktree's ports back, after its teardown saw them; `plan check` says claims on isolated tasks do nothing."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from helpers.fleet import make_attempt
from helpers.repo import StellaRunner

from stellafleet.core.clock import SystemClock
from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CheckPhase
from stellafleet.git import clean, gitops
from stellafleet.run import checking
from stellafleet.state.leases import LeaseHolder, LeaseStore
from stellafleet.state.ledger import Ledger

# the check: the ports it sees, and who holds which lock on the machine while it runs
PROBE = (
    "import json, os; from stellafleet.state.leases import LeaseStore\n"
    "held = LeaseStore.open().held()['locks']\n"
    "print(json.dumps([os.environ.get('STELLA_PORTS'), [(r['name'], r['pid'], r['repo']) for r in held]]))\n"
)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STELLA_HOST_STATE", str(tmp_path / "host"))
    return tmp_path / "host"


def test_a_merge_check_holds_its_tasks_locks_and_sees_its_ports(
    git_repo: Path, tmp_path: Path, host: Path
) -> None:
    ctx = make_attempt(git_repo, "t1")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    seen_by_setup = tmp_path / "setup-ports"
    env = {"PATH": "/usr/bin:/bin", "STELLA_HOST_STATE": str(host), "PYTHONPATH": ":".join(sys.path)}
    log = StatePaths(git_repo).private / "logs" / "merge.log"
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        ledger.facts.set(ctx.attempt_id, "locks", ["db:test"])
        ledger.facts.set(ctx.attempt_id, "ports", [23001, 23002])
        fresh = checking.FreshTree(WorktreeConfig(setup=f'echo "$STELLA_PORT" > {seen_by_setup}'), False, env)
        [run] = checking.run_and_record(
            ledger,
            checking.CheckRow(ctx.run_id, "t1", CheckPhase.MERGE, merge_id=1),
            [checking.Command(f"{sys.executable} {probe}", 60, log.with_suffix(".check.log"))],
            gitops.head_commit(git_repo),
            tree=fresh, root=git_repo, env=env, log_path=log, tail_bytes=4000,
        )  # fmt: skip
    assert run.passed, run.tail
    ports, locks = json.loads(run.tail.strip().splitlines()[-1])
    assert ports == "23001 23002" and seen_by_setup.read_text().strip() == "23001"
    assert [(name, repo) for name, _, repo in locks] == [("db:test", str(git_repo))]  # held while it ran ...
    with LeaseStore.open() as store:
        assert store.held()["locks"] == []  # ... and released after it


def _merge_check(
    root: Path, ledger: Ledger, row: checking.CheckRow, stop: threading.Event
) -> list[checking.CheckRun]:
    log = StatePaths(root).private / "logs" / "merge.log"
    return checking.run_and_record(
        ledger, row, [checking.Command("true", 60, log.with_suffix(".check.log"))], gitops.head_commit(root),
        tree=checking.FreshTree(WorktreeConfig(), False, {}), root=root, env={"PATH": "/usr/bin:/bin"},
        log_path=log, tail_bytes=4000, stop=stop,
    )  # fmt: skip


def test_an_attempts_own_check_takes_no_lease_a_merge_check_waits_for_them_until_the_run_stops(
    git_repo: Path, host: Path
) -> None:
    ctx = make_attempt(git_repo, "t1")
    other = LeaseHolder.here("other", git_repo, "r0", "t0")
    with LeaseStore.open() as store, Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        ledger.facts.set(ctx.attempt_id, "locks", ["db:test"])
        assert store.take(["db:test"], other, clock=SystemClock(), stop=threading.Event()) is not None
        # in its attempt, the task holds its locks already: its own check waits for none (a wait is stopped)
        stop = threading.Event()
        waited = threading.Timer(30, stop.set)
        waited.start()
        attempt_row = checking.CheckRow(ctx.run_id, "t1", CheckPhase.AFTER, attempt_id=ctx.attempt_id)
        [run] = _merge_check(git_repo, ledger, attempt_row, stop)
        waited.cancel()
        assert run.passed, run.tail
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()  # the run is stopped while the merge check waits
        with pytest.raises(StellaError, match=r"^stopped while waiting for the locks of task t1: db:test$"):
            _merge_check(
                git_repo, ledger, checking.CheckRow(ctx.run_id, "t1", CheckPhase.MERGE, merge_id=1), stop
            )
        store.release("other")


def test_clean_gives_a_removed_worktrees_ports_back_after_its_teardown_saw_them(
    git_repo: Path, tmp_path: Path, host: Path
) -> None:
    worktree = tmp_path / "wt"
    worktree.mkdir()
    with LeaseStore.open() as store:
        ports = store.lease_ports(2, (24000, 24999), LeaseHolder.here("tok", git_repo, "r1", "t1"), worktree)
    owner = clean._Owner("r1", "t1", None, None, True, "fleet/t1", 1)
    env = clean.teardown_env(git_repo, owner, worktree)
    assert (env["STELLA_PORT"], env["STELLA_PORTS"]) == (str(ports[0]), f"{ports[0]} {ports[1]}")
    clean.release_ports([worktree])
    with LeaseStore.open() as store:
        assert store.held()["ports"] == []


def test_plan_check_says_claims_on_isolated_tasks_do_nothing_and_points_to_locks(
    tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "a"\nprompt = "p"\nisolation = "isolated"\nclaims = ["locks/port-5199"]\n\n'
        '[[tasks]]\nid = "b"\nprompt = "p"\nlocks = ["port:5199"]\nports = 1\n'
    )
    said = stella_main("plan", "check", str(plan), cwd=tmp_path).stdout
    assert "claims of isolated tasks (a) do nothing" in said and 'locks = ["db:test"]' in said
    shown = json.loads(stella_main("plan", "show", str(plan), "--json", cwd=tmp_path).stdout)
    assert {t["id"]: (t["locks"], t["ports"]) for t in shown["tasks"]} == {
        "a": ([], None),
        "b": (["port:5199"], 1),
    }
