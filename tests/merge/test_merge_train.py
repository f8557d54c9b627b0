"""The merge train: batches of disjoint branches, one check per batch, a red batch bisected (the culprit
confirmed on the tip before it is evicted, the later of a pair red together), a check that did not decide
run again, the window adapting; on real repositories, in-process (merge_run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.merging import RUN_ID, build_disjoint_run, merges
from helpers.repo import StellaRunner, git

from stellafleet.core.clock import wall_ms
from stellafleet.core.paths import StatePaths
from stellafleet.git.clean import REMOVED, clean
from stellafleet.merge import journal as merge_journal
from stellafleet.merge.queue import MergeItem
from stellafleet.merge.runner import MergeOptions, merge_run
from stellafleet.merge.train import Window, narrow, probes, take_batch, undecided
from stellafleet.state import dashboard
from stellafleet.state.journal import recover
from stellafleet.state.ledger import Ledger

ALIVE = lambda pid, started: True  # noqa: E731  (the run's processes count as running)
# Red only when both c.txt and e.txt are there; each run appends a line to $CHECK_LOG.
TOGETHER = 'echo run >> "$CHECK_LOG"; ! { test -e c.txt && test -e e.txt; }'


def items(*names: str, after: dict[str, tuple[str, ...]] | None = None) -> list[MergeItem]:
    return [MergeItem(f"fleet/{n}", n, i, (after or {}).get(n, ())) for i, n in enumerate(names, 1)]


def test_a_batch_takes_disjoint_branches_in_queue_order_and_waits_for_dependencies() -> None:
    queue = items("a", "b", "c", "d", "e", "f", after={"d": ("a",), "f": ("c",)})
    footprint = {
        "a": ("src/api.py",), "b": ("src/api.py", "b.txt"), "c": ("docs/**",), "d": ("d.txt",),
        "e": ("docs/guide.md",), "f": ("f.txt",),
    }  # fmt: skip
    landed: set[str] = set()

    def waiting(item: MergeItem) -> list[str]:
        return [dep for dep in item.after if dep not in landed]

    first = take_batch(queue, 8, footprint, waiting)
    # b shares a file with a, e falls under c's claim; d's dependency a is earlier in the batch
    assert [i.task_id for i in first] == ["a", "c", "d", "f"]
    assert take_batch(queue, 8, footprint, waiting) == first  # the same queue, the same batch
    assert [i.task_id for i in take_batch(queue, 2, footprint, waiting)] == ["a", "c"]
    rest = [i for i in queue if i not in first]
    assert [i.task_id for i in take_batch(rest, 8, footprint, waiting)] == ["b", "e"]
    # a dependency neither landed nor in the batch: the dependent waits
    assert [i.task_id for i in take_batch(queue[3:], 8, footprint, waiting)] == ["d", "e"]


def test_the_window_grows_by_one_halves_on_red_and_never_drops_below_one() -> None:
    window = Window(8, 10)
    window.landed(), window.landed(), window.landed()
    assert window.size == 10
    window.red()
    assert window.size == 5
    for _ in range(5):
        window.red()
    assert window.size == 1


def bisect(red_from: int, size: int, parallel: int) -> tuple[int, list[int]]:
    """The culprit (1-based) a bisection finds when every prefix of red_from or more members is red, and
    the prefixes it checked."""
    lo, hi, checked = 0, size, []
    while hi - lo > 1:
        points = probes(lo, hi, parallel)
        checked += points
        lo, hi = narrow(lo, hi, {p: p < red_from for p in points})
    return hi, checked


def test_a_bisection_finds_the_first_red_prefix_and_never_retests_the_last_member() -> None:
    assert bisect(8, 8, 1) == (8, [4, 6, 7])  # the last is the culprit once all others passed
    assert bisect(3, 8, 1) == (3, [4, 2, 3])
    culprit, checked = bisect(5, 8, 3)
    assert culprit == 5 and len(checked) <= 6 and 8 not in checked
    assert probes(3, 4, 2) == [] and probes(0, 2, 4) == [1]


def test_a_check_that_did_not_decide_is_told_from_a_red_one() -> None:
    assert undecided(None, "stopped after 5 s: check_timeout is 5 s", "", ()) is True  # its timeout
    assert undecided(-15, None, "", ()) is True  # a signal
    assert undecided(1, None, "ECONNRESET while fetching", (r"ECONNRESET",)) is True
    assert undecided(1, None, "1 failed", (r"ECONNRESET",)) is False


def test_a_red_batch_is_bisected_its_green_prefix_lands_and_the_later_of_a_pair_red_together_is_evicted(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stella: StellaRunner
) -> None:
    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "abcde"})
    log = tmp_path / "checks.log"
    monkeypatch.setenv("CHECK_LOG", str(log))  # the check's own environment comes from stella's
    lines: list[str] = []
    result = merge_run(git_repo, MergeOptions(unwatched=True, check=TOGETHER), say=lines.append)
    status = {item.task_id: str(item.status) for item in result.queue}
    assert status == {"a": "merged", "b": "merged", "c": "merged", "d": "merged", "e": "check_failed"}
    # the batch, then prefixes 2, 3 and 4 (never 5), then e confirmed alone on the new tip: 5 runs, not 9
    assert len(log.read_text().splitlines()) == result.check_runs == 5
    assert lines[0] == "batch 1: 5 branches: " + ", ".join(f"fleet/{t}-abcd" for t in "abcde")
    assert any(line.startswith("batch 1: bisect: checking the first 2 of 5") for line in lines)
    assert any(line.startswith("evicted: fleet/e-abcd [e]: check `") for line in lines), lines
    assert {f for f in "abcde" if (git_repo / f"{f}.txt").exists()} == set("abcd")
    rows = merges(git_repo)
    assert {r["batch_id"] for r in rows} == {1} and len(rows) == 5
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        [batch] = ledger.merge_batches.of_run(RUN_ID)
        [request] = ledger.requests.needing_you(RUN_ID)
    assert batch["outcome"] == "bisected" and batch["members"] == [f"fleet/{t}-abcd" for t in "abcde"]
    assert [s["step"] for s in batch["steps"]].count("check") == 5
    # the eviction goes back to e's task: the landed commits it fails with, the new tip
    assert (request["task_id"], request["reason"]) == ("e", "evicted")
    tip = git("rev-parse", "main", cwd=git_repo).strip()
    assert tip in request["context"] and "fleet/c-abcd: work" in request["context"]
    page = dashboard.load_first_view(StatePaths(git_repo).fleet_db, RUN_ID, now_ms=wall_ms(), alive=ALIVE)
    assert [b["outcome"] for b in page["merge_batches"]] == ["bisected"]  # the dashboard's train picture
    shown = stella("runs", RUN_ID, cwd=git_repo).stdout  # the train, as `stella runs RUN` shows it
    assert "merge train" in shown and "batch 1  window 8  5 branch(es)  bisected" in shown
    assert (
        "check 5 failed; check 5 failed; bisect 0..5 at 2; check 2 passed; landed 2 at" in shown
        and "evicted fleet/e-abcd" in shown
    )


def test_disjoint_branches_land_with_one_check_and_a_check_that_did_not_decide_runs_again(
    git_repo: Path, tmp_path: Path
) -> None:
    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "abcd"})
    marker = tmp_path / "flaked"
    flaky = f'if [ ! -e {marker} ]; then touch {marker}; echo "ECONNRESET"; exit 1; fi'
    options = MergeOptions(unwatched=True, check=flaky, retry_on=("ECONNRESET",), window=2, max_window=3)
    result = merge_run(git_repo, options)
    assert all(str(item.status) == "merged" for item in result.queue)
    # batch 1 (a, b): red without deciding, then green; the window grew to 3: batch 2 (c, d)
    assert result.check_runs == 3
    assert [b["members"] for b in result.batches] == [
        ["fleet/a-abcd", "fleet/b-abcd"],
        ["fleet/c-abcd", "fleet/d-abcd"],
    ]
    assert [s["step"] for s in result.batches[0]["steps"]] == ["retry", "check", "land"]


def test_a_merge_killed_during_a_batchs_check_has_every_member_and_the_batch_settled_by_the_next_command(
    git_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from merge.test_merge_killed import kill_merge, wait_for

    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "abc"})
    start = git("rev-parse", "main", cwd=git_repo).strip()
    pid_file = tmp_path / "check.pid"
    check = f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; sleep 60"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "merge", "--unwatched", "--check", check],
        cwd=git_repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_for(pid_file, proc=proc)
    kill_merge(proc)
    recover(git_repo)  # what the next stella command does first
    said = capsys.readouterr().err
    assert "a killed stella merge" in said and "recorded error" in said, said
    assert [r["status"] for r in merges(git_repo)] == ["error", "error", "error"]
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        [batch] = ledger.merge_batches.of_run(RUN_ID)
    assert batch["outcome"] == "interrupted" and len(batch["members"]) == 3
    assert git("rev-parse", "main", cwd=git_repo).strip() == start


class Unfixed:
    """A Fixing that records what it was handed and fixes nothing."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, str]] = []

    def fix(self, item: MergeItem, request_id: int, tip: str) -> str | None:
        self.handed.append((item.task_id, tip))
        return "the worker found nothing to change"


def test_a_later_merge_with_fix_serves_the_evictions_an_earlier_one_left_waiting(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "ce"})
    monkeypatch.setenv("CHECK_LOG", str(tmp_path / "checks.log"))
    first = merge_run(git_repo, MergeOptions(unwatched=True, check=TOGETHER))
    assert [str(i.status) for i in first.queue] == ["merged", "check_failed"]
    fixer = Unfixed()
    options = MergeOptions(unwatched=True, check=TOGETHER, fix_rounds=1)
    merge_run(git_repo, options, make_fixer=lambda ledger, run_id: fixer)
    tip = git("rev-parse", "main", cwd=git_repo).strip()
    assert fixer.handed[0] == ("e", tip)  # served before the train ran again
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        evicted = [r for r in ledger.requests.of_run(RUN_ID) if r["reason"] == "evicted"]
    # the waiting one was taken up, and what the fix said waits on you now, with the eviction's context
    assert [r["state"] for r in evicted][:2] == ["dismissed", "served"]
    assert evicted[1]["why"] == "not served: the worker found nothing to change"
    assert (
        evicted[-1]["state"] == "needs_you" and "the worker found nothing to change" in evicted[-1]["context"]
    )


def test_parallel_checks_bisect_with_several_split_points_at_once_each_in_a_kept_tree_of_its_own(
    git_repo: Path,
) -> None:
    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "abcde"})
    lines: list[str] = []
    check = "! { test -e b.txt && test -e d.txt; }"
    result = merge_run(
        git_repo, MergeOptions(unwatched=True, check=check, parallel_checks=2), say=lines.append
    )
    status = {item.task_id: str(item.status) for item in result.queue}
    assert status == {"a": "merged", "b": "merged", "c": "merged", "d": "check_failed", "e": "merged"}
    assert "batch 1: bisect: checking the first 1, 3 of 5" in lines, lines
    # the batch twice, prefixes 1 and 3 at once, then 4, d confirmed on the tip, then e's batch
    assert result.check_runs == 7
    kept = StatePaths(git_repo).private / "merge-trees"
    assert sorted(path.name for path in kept.iterdir() if path.is_dir()) == ["check-1", "check-2"]


def test_a_fix_attempt_a_killed_merge_left_running_is_abandoned_by_the_next_command(git_repo: Path) -> None:
    build_disjoint_run(git_repo, {"a": {"a.txt": "a\n"}})
    gone = subprocess.Popen(["true"])
    gone.wait()  # a worker pid no process holds any more
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        attempt = ledger.attempts.start(RUN_ID, "a", pipeline="command")
        ledger.attempts.set_pid(attempt, gone.pid)
    said = merge_journal._finish(git_repo, {"fixing": {"run_id": RUN_ID, "task_id": "a"}})
    assert said.startswith("its --fix attempt of task a: ")
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        [row] = [a for a in ledger.get_run(RUN_ID)["attempts"] if a["id"] == attempt]
    assert row["outcome"] == "abandoned" and "stella merge --fix was killed" in str(row["summary"])


def test_a_branch_moved_under_the_train_stops_it_before_landing_and_nothing_more_is_tried(
    git_repo: Path,
) -> None:
    build_disjoint_run(git_repo, {t: {f"{t}.txt": f"{t}\n"} for t in "abc"})
    moves = 'git -C "$STELLA_MERGE_ROOT" commit -q --allow-empty -m "someone else lands first"'
    result = merge_run(git_repo, MergeOptions(unwatched=True, check=moves, window=1))
    reasons = [(str(item.status), item.reason) for item in result.queue]
    assert reasons[0] == (
        "error",
        "main moved or was switched away from while merging: stopped before landing",
    )
    assert reasons[1:] == [("error", f"not tried: {reasons[0][1]}")] * 2
    assert result.check_runs == 1
    assert not (git_repo / "a.txt").exists()


def test_branches_editing_lines_within_three_of_each_other_both_land_and_clean_counts_both_merged(
    git_repo: Path,
) -> None:
    """The second is rebased onto the first: its patch id changes (the first's line is in its context), its
    changes are still all in the result."""
    lines = "".join(f"line {n}\n" for n in range(1, 21))
    (git_repo / "f.txt").write_text(lines)
    git("add", "f.txt", cwd=git_repo)
    git("commit", "-q", "-m", "f", cwd=git_repo)
    edits = {
        t: {"f.txt": lines.replace(f"line {n}\n", f"line {n} by {t}\n")} for t, n in (("a", 10), ("b", 12))
    }
    build_disjoint_run(git_repo, edits)
    result = merge_run(git_repo, MergeOptions(unwatched=True))
    assert {item.task_id: str(item.status) for item in result.queue} == {"a": "merged", "b": "merged"}
    assert "line 10 by a\nline 11\nline 12 by b\n" in (git_repo / "f.txt").read_text()
    report = clean(git_repo, alive=lambda pid, started: False)
    assert {item.target: item.action for item in report.items if item.kind == "branch"} == {
        "fleet/a-abcd": REMOVED, "fleet/b-abcd": REMOVED,
    }  # fmt: skip
