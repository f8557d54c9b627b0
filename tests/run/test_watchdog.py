"""The hung-worker watchdog: idle workers end `stalled`, busy ones are left alone."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import by_id, file_locks, make_attempt, run_record, write_config
from helpers.repo import StellaRunner

from stellafleet.core.paths import StatePaths
from stellafleet.run.watchdog import Watchdog
from stellafleet.state.ledger import Ledger
from stellafleet.testing.clock import FakeClock


class FakeExecution:
    pid = 4242

    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1

    def wait(self) -> None:  # pragma: no cover - the watchdog never waits
        raise AssertionError


def _watchdog(root: Path, cpu: list[float]) -> tuple[Watchdog, FakeExecution, FakeClock, Ledger, Path]:
    ctx = make_attempt(root)
    ledger = Ledger.open(StatePaths(root).fleet_db, now_ms=lambda: 1_000)
    clock = FakeClock()
    dog = Watchdog(60, ledger, clock=clock, cpu_of=lambda pid: cpu[0], now_ms=lambda: 5_000)
    execution = FakeExecution()
    dog.watch(ctx, execution)  # type: ignore[arg-type]
    return dog, execution, clock, ledger, ctx.log_path


def test_an_idle_worker_is_stopped_after_idle_timeout_with_the_evidence(git_repo: Path) -> None:
    cpu = [0.0]  # a worker starts with none
    dog, execution, clock, ledger, _ = _watchdog(git_repo, cpu)
    clock.advance(59)
    cpu[0] = 0.3  # a trickle: less than 1% of a core over 59 s is no progress
    dog.check()
    assert execution.stops == 0
    clock.advance(1)
    dog.check()
    dog.check()  # stopped once, not again
    assert execution.stops == 1
    evidence = dog.forget(1)
    assert evidence is not None
    assert evidence.startswith("stalled: idle for 60s, no CPU time, output or spend (idle_timeout 60s)")
    assert "0.30 CPU seconds in all" in evidence and "no output since it started" in evidence
    ledger.close()


def test_cpu_output_and_spend_each_count_as_progress(git_repo: Path) -> None:
    cpu = [0.0]
    dog, execution, clock, ledger, log = _watchdog(git_repo, cpu)
    clock.advance(50)
    cpu[0] = 2.0  # busy: 2 CPU seconds in 50 s
    dog.check()
    clock.advance(50)
    ledger.spend.add(1, 0.01)  # a spend event
    dog.check()
    clock.advance(50)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("output\n")
    dog.check()
    clock.advance(50)
    dog.check()
    assert execution.stops == 0
    clock.advance(10)
    dog.check()
    assert execution.stops == 1
    evidence = dog.forget(1) or ""
    assert "last output at" in evidence and "7 bytes of log" in evidence
    attempt = ledger.get_run(ledger.runs.latest_id() or "")["attempts"][0]
    assert attempt["last_progress_ms"] == 5_000
    ledger.close()


def test_a_worker_stuck_in_sleep_ends_stalled_and_a_worker_printing_progress_does_not(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "stuck"\nprompt = "p"\nclaims = ["a.txt"]\n\n'
        '[[tasks]]\nid = "after-stuck"\nprompt = "p"\ndepends_on = ["stuck"]\n\n'
        '[[tasks]]\nid = "ticker"\nprompt = "p"\n'
    )
    write_config(
        git_repo,
        run="true",
        tasks={"stuck": "sleep 60", "ticker": "for i in $(seq 15); do echo tick $i; sleep 0.2; done"},
        extra=f"[fleet]\nidle_timeout = 1\nstop_grace = 1\n\n[notify]\ncommand = 'cat >> {tmp_path}/told'\n",
    )

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2", cwd=git_repo
    )

    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks, attempts = by_id(record["tasks"]), by_id(record["attempts"], "task_id")
    assert tasks["stuck"]["status"] == "stalled"
    assert attempts["stuck"]["outcome"] == "stalled"
    assert attempts["stuck"]["summary"].startswith("stalled: idle for ")
    assert "(idle_timeout 1s)" in attempts["stuck"]["summary"]
    assert tasks["stuck"]["reason"] == attempts["stuck"]["summary"]
    took = attempts["stuck"]["finished_at_ms"] - attempts["stuck"]["started_at_ms"]
    assert 1000 <= took < 20_000  # stopped by the watchdog, long before `sleep 60` would end
    assert tasks["after-stuck"]["status"] == "skipped"
    assert tasks["after-stuck"]["reason"] == "dependency failed: stuck"
    assert tasks["ticker"]["status"] == "succeeded"  # 3 s of work, never 1 s without output
    assert attempts["ticker"]["last_progress_ms"] is not None
    assert file_locks(git_repo) == []  # the stalled attempt's claim is freed
    assert record["run"]["reason"] == "1 skipped, 1 stalled"
    told = [json.loads(line) for line in (tmp_path / "told").read_text().splitlines()]
    assert [(event["event"], event.get("task")) for event in told] == [
        ("task_stalled", "stuck"),
        ("run_ended", None),
    ]
    assert told[0]["summary"] == attempts["stuck"]["summary"]


def test_a_worker_without_a_local_process_is_not_watched(git_repo: Path) -> None:
    ctx = make_attempt(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        clock = FakeClock()
        dog = Watchdog(1, ledger, clock=clock, cpu_of=lambda pid: 0.0)
        remote = FakeExecution()
        remote.pid = None  # type: ignore[assignment]
        dog.watch(ctx, remote)  # type: ignore[arg-type]
        clock.advance(3600)
        dog.check()
        assert remote.stops == 0 and dog.forget(ctx.attempt_id) is None


def test_watching_a_started_worker_reads_nothing_but_its_output_size(git_repo: Path) -> None:
    """A just-started worker has no CPU time or spend to read: starting to watch it scans no processes."""
    ctx = make_attempt(git_repo)
    looked: list[int] = []
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        dog = Watchdog(60, ledger, clock=FakeClock(), cpu_of=lambda pid: looked.append(pid) or 0.0)
        dog.watch(ctx, FakeExecution())  # type: ignore[arg-type]
        assert looked == []
        dog.check()
        assert looked == [4242]
