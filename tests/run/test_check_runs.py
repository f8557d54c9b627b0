"""What run/checking.py decides about one run of a check, in process on real repositories and real processes:
its ledger row and the task log's line, the environment it and its tree's setup get, the commands run in
turn, stella's own lines at the end of its log, a long log's head and cut, the journal record while it
runs, what it changes in a task's worktree, and the repair of a killed one (issue 49 item 18's survivors)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers.fleet import RUN
from helpers.repo import git

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CheckPhase
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.run import checking
from stellafleet.run.checking import CheckRun, Command
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

ENV = {"PATH": "/usr/bin:/bin"}
ROW = checking.CheckRow(RUN, "t1", CheckPhase.AFTER, attempt_id=3)
BRANCH = "fleet/t1"


def _head(root: Path) -> str:
    return git("rev-parse", "HEAD", cwd=root).strip()


def _task_log(root: Path) -> Path:
    return StatePaths(root).private / "logs" / "t1.log"


def _command(root: Path, command: str, name: str = "c", notes: tuple[str, ...] = ()) -> Command:
    return Command(command, 30.0, StatePaths(root).private / "logs" / f"{name}.check.log", notes)


def _checks(
    root: Path,
    ledger: Ledger,
    commands: list[Command],
    tree: Path | checking.FreshTree | None = None,
    **options: object,
) -> list[CheckRun]:
    return checking.run_and_record(
        ledger,
        ROW,
        commands,
        _head(root),
        tree=tree or checking.FreshTree(WorktreeConfig(), False, ENV),
        root=root,
        env=options.pop("env", ENV),  # type: ignore[arg-type]
        log_path=_task_log(root),
        tail_bytes=4000,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def worktree(git_repo: Path, tmp_path: Path) -> Path:
    """A task's worktree on its branch, one tracked file of its own committed."""
    tree = tmp_path / "wt"
    git("worktree", "add", "-q", "-b", BRANCH, str(tree), cwd=git_repo)
    (tree / "work.txt").write_text("the task's work\n")
    git("add", "work.txt", cwd=tree)
    git("commit", "-q", "-m", "the task's commit", cwd=tree)
    return tree


def test_a_checks_row_and_its_line_in_the_task_log(git_repo: Path, ledger: Ledger) -> None:
    log = Path("/logs/t1.check.log")
    green = CheckRun("make test", 0, 1.5, "a" * 40, "ok\n", log)
    red = CheckRun("make test", 1, 0.25, None, "FAIL t\n", None, reason_line="FAIL t")
    merge_row = checking.CheckRow(RUN, "t1", CheckPhase.MERGE, merge_id=7)
    assert checking.recorded(ledger, ROW, green, _task_log(git_repo)) is green
    checking.recorded(ledger, merge_row, red, _task_log(git_repo))
    first, second = ledger.checks.of_run(RUN)
    assert (first["attempt_id"], first["merge_id"], first["duration_ms"], first["log_path"]) == (
        3,
        None,
        1500,
        str(log),
    )
    assert (first["passed"], first["commit_sha"], first["output_tail"]) == (1, "a" * 40, "ok\n")
    assert (second["attempt_id"], second["merge_id"], second["duration_ms"], second["log_path"]) == (
        None,
        7,
        250,
        None,
    )
    assert second["passed"] == 0 and second["exit_code"] == 1 and second["phase"] == "merge"
    assert _task_log(git_repo).read_text().splitlines() == [
        f"[stella] check (after) on aaaaaaaaaaaa: passed in 1.5 s; its log: {log}",
        "[stella] check (merge): failed (exit 1): FAIL t in 0.2 s; its log: None",
    ]


def test_a_check_not_run_is_recorded_with_its_commit_and_no_time(git_repo: Path, ledger: Ledger) -> None:
    assert checking.not_run("make", "no commits", "b" * 40) == CheckRun(
        "make", None, 0.0, "b" * 40, "no commits", None, "no commits"
    )
    config = WorktreeConfig(setup="echo cannot install; exit 3")
    [run] = _checks(git_repo, ledger, [_command(git_repo, "true")], checking.FreshTree(config, False, ENV))
    assert run.problem is not None and run.problem.startswith("its check tree: ")
    [row] = ledger.checks.of_run(RUN)
    assert row["commit_sha"] == _head(git_repo) and row["duration_ms"] == 0


def test_the_commands_run_in_turn_up_to_the_first_red_one(git_repo: Path, ledger: Ledger) -> None:
    commands = [
        _command(git_repo, "true", "a"),
        _command(git_repo, "exit 4", "b"),
        _command(git_repo, "true", "c"),
    ]
    runs = _checks(git_repo, ledger, commands)
    assert [run.exit_code for run in runs] == [0, 4]
    assert [row["exit_code"] for row in ledger.checks.of_run(RUN)] == [0, 4]


def test_a_check_and_its_trees_setup_run_with_exactly_the_environment_given(
    git_repo: Path, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONLY_STELLAS_OWN", "1")  # stella's environment: not the check's
    env = {**ENV, "GIVEN": "yes"}
    wanted = 'test "$GIVEN" = yes && test -z "$ONLY_STELLAS_OWN"'
    seen = tmp_path / "setup-saw"
    fresh = checking.FreshTree(WorktreeConfig(setup=f"{wanted} && touch {seen}"), False, env)
    [run] = _checks(git_repo, ledger, [_command(git_repo, wanted)], fresh, env=env)
    assert run.passed and seen.exists()


def test_a_check_trees_setup_stops_with_the_run(git_repo: Path, ledger: Ledger) -> None:
    stop = threading.Event()
    stop.set()
    fresh = checking.FreshTree(WorktreeConfig(setup="sleep 30"), False, ENV)
    started = time.monotonic()
    [run] = _checks(git_repo, ledger, [_command(git_repo, "true")], fresh, stop=stop)
    assert time.monotonic() - started < 15 and not run.passed
    assert run.problem is not None and run.problem.startswith("its check tree: ")


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("printf 'no newline'", "no newline\n[stella] a note\n"),
        ("echo line", "line\n[stella] a note\n"),
        ("true", "[stella] a note\n"),
    ],
)
def test_stellas_own_line_ends_the_checks_log_and_tail_on_a_line_of_its_own(
    git_repo: Path, ledger: Ledger, command: str, said: str
) -> None:
    [run] = _checks(git_repo, ledger, [_command(git_repo, command, notes=("a note",))])
    assert run.tail == said
    assert run.log_path is not None and run.log_path.read_text() == said


def test_a_check_whose_shell_cannot_start_is_recorded_as_it_was_asked(tmp_path: Path) -> None:
    log = tmp_path / "check.log"
    run = checking.run_check(
        "true", tmp_path / "gone", env={}, timeout=5, log_path=log, tail_bytes=100, commit="c0ffee"
    )
    assert run.problem is not None and run.problem.startswith("could not start /bin/sh: ")
    assert run == CheckRun("true", None, 0.0, "c0ffee", "", log, run.problem)


def test_a_check_with_no_main_tree_to_watch_runs_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no repository here: nothing of git is asked
    run = checking.run_check(
        "echo ok", tmp_path, env=ENV, timeout=30, log_path=tmp_path / "c.log", tail_bytes=100
    )
    assert run.passed and run.tail == "ok\n"


def test_a_long_logs_reason_is_looked_for_in_its_head_and_its_end_only(tmp_path: Path) -> None:
    filler = "head -c 2000000 /dev/zero | tr '\\0' x; echo"
    run = checking.run_check(
        f"echo 'FAIL first'; {filler}; echo 'FAIL middle'; {filler}; echo done; exit 1",
        tmp_path, env=ENV, timeout=60, log_path=tmp_path / "c.log", tail_bytes=100,
    )  # fmt: skip
    assert run.reason_line == "FAIL first"
    size = 2 * 2_000_001 + len("FAIL first\nFAIL middle\ndone\n")
    cut = size - checking.LOG_KEEP_BYTES
    assert (
        (tmp_path / "c.log")
        .read_text()
        .startswith(f"[stella] the check printed {size} bytes: its first {cut} were cut\n")
    )
    run = checking.run_check(
        f"echo first; {filler}; echo 'FAIL middle'; {filler}; echo done; exit 1",
        tmp_path, env=ENV, timeout=60, log_path=tmp_path / "c.log", tail_bytes=100,
    )  # fmt: skip
    assert run.reason_line == "done"  # the middle of megabytes is not read


def test_a_log_of_exactly_the_kept_size_is_not_cut(tmp_path: Path) -> None:
    keep = checking.LOG_KEEP_BYTES
    run = checking.run_check(
        f"head -c {keep} /dev/zero | tr '\\0' x",
        tmp_path,
        env=ENV,
        timeout=60,
        log_path=tmp_path / "c.log",
        tail_bytes=10,
    )
    assert run.passed and (tmp_path / "c.log").stat().st_size == keep


def test_a_log_of_at_most_the_kept_size_is_read_whole_not_with_its_head_cut_mid_line(tmp_path: Path) -> None:
    # the failure line starts 4 bytes before HEAD_BYTES: a head read of this log would end at "FAIL"
    first = "x" * (checking.HEAD_BYTES - 5) + "\n"
    reason = "FAIL the whole reason\n"
    rest = checking.LOG_KEEP_BYTES - len(first) - len(reason)
    run = checking.run_check(
        f"printf '%s' '{first}{reason}'; head -c {rest - 1} /dev/zero | tr '\\0' y; echo; exit 1",
        tmp_path, env=ENV, timeout=60, log_path=tmp_path / "c.log", tail_bytes=10,
    )  # fmt: skip
    assert (tmp_path / "c.log").stat().st_size == checking.LOG_KEEP_BYTES
    assert run.reason_line == "FAIL the whole reason"


def test_stellas_own_lines_are_not_the_reason_a_check_failed(git_repo: Path, tmp_path: Path) -> None:
    run = checking.run_check(
        f"echo building; echo oops > {git_repo / 'written.txt'}; exit 1",
        tmp_path, env=ENV, timeout=30, log_path=tmp_path / "c.log", tail_bytes=4000, main_tree=git_repo,
    )  # fmt: skip
    assert run.tail.endswith("written.txt\n")  # stella's line is the log's last
    assert run.failure() == "check failed (exit 1): building"


def test_an_in_place_checks_journal_record_names_its_tree_branch_commit_and_process(
    git_repo: Path, ledger: Ledger, worktree: Path
) -> None:
    records = StatePaths(git_repo).journal
    found = f"grep -q '\"check\"' {records}/check-*.json"
    wait = f"n=0; until {found} || [ $n -gt 500 ]; do n=$((n+1)); sleep 0.01; done"
    [run] = _checks(
        git_repo, ledger, [_command(git_repo, f"{wait}; echo $PPID; cat {records}/check-*.json")], worktree
    )
    assert run.passed, run.tail
    parent, record = run.tail.split("\n", 1)
    data = json.loads(record)
    assert (data["tree"], data["branch"], data["commit"]) == (str(worktree), BRANCH, _head(worktree))
    assert data["check"][0] == int(parent)  # the check's own process (its group), not stella's


def test_a_check_tree_the_check_locked_still_goes(git_repo: Path, ledger: Ledger) -> None:
    [run] = _checks(git_repo, ledger, [_command(git_repo, 'git worktree lock "$(pwd)"')])
    assert run.passed, run.tail
    assert not list((StatePaths(git_repo).private / "checks").iterdir())  # git keeps its locked entry


def test_a_fresh_trees_changes_are_not_the_checks_failure_and_the_tree_goes(
    git_repo: Path, ledger: Ledger
) -> None:
    check = "echo rebuilt >> README.md && mkdir -p dist && echo built > dist/out.js"
    [run] = _checks(git_repo, ledger, [_command(git_repo, check)])
    assert run.passed, run.tail
    assert git("worktree", "list", "--porcelain", cwd=git_repo).count("worktree ") == 1
    assert not list((StatePaths(git_repo).private / "checks").iterdir())


@pytest.mark.parametrize(("left", "said"), [(5, "f1 f2 f3 f4 f5"), (6, "f1 f2 f3 f4 f5 and 1 more")])
def test_what_an_in_place_check_left_untracked_is_named_five_at_most(
    git_repo: Path, ledger: Ledger, worktree: Path, left: int, said: str
) -> None:
    check = " && ".join(f"touch f{number}" for number in range(1, left + 1))
    [run] = _checks(git_repo, ledger, [_command(git_repo, check)], worktree)
    assert run.passed and run.tail == f"[stella] removed what the check left untracked: {said}\n"


def test_each_change_of_an_in_place_check_is_named_with_its_own_failure(
    git_repo: Path, ledger: Ledger, worktree: Path, tmp_path: Path
) -> None:
    stop = threading.Event()
    changed = tmp_path / "changed"  # outside the tree: written once both changes are made
    check = f"echo more >> work.txt && git checkout -q --detach && touch {changed} && sleep 30"

    def stop_once_changed() -> None:
        while not changed.exists():
            time.sleep(0.01)
        stop.set()

    stopper = threading.Thread(target=stop_once_changed)
    stopper.start()
    [run] = _checks(git_repo, ledger, [_command(git_repo, check)], worktree, stop=stop)
    stopper.join()
    assert run.problem is not None and run.problem.startswith(
        "the check detached HEAD; the check changed tracked files: work.txt; stopped after "
    ), run.problem


def test_a_tree_stella_cannot_put_back_fails_the_check_by_name(
    git_repo: Path, ledger: Ledger, worktree: Path
) -> None:
    lock = git("rev-parse", "--git-dir", cwd=worktree).strip() + "/index.lock"
    [run] = _checks(
        git_repo, ledger, [_command(git_repo, f"echo more >> work.txt && touch {lock}")], worktree
    )
    assert run.problem is not None and run.problem.startswith(
        "stella could not put back what the check changed: "
    ), run.problem
    assert run.failure() == f"check failed: {run.problem}"


def test_the_stash_a_check_left_is_named_in_its_record(
    git_repo: Path, ledger: Ledger, worktree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # stella's own directory is no repository: the check's tree is read
    before = git("stash", "list", cwd=git_repo)
    [run] = _checks(git_repo, ledger, [_command(git_repo, "echo more >> work.txt && git stash -q")], worktree)
    assert git("stash", "list", cwd=git_repo) == before
    assert run.tail.endswith(
        "[stella] the check changed the stash list (every worktree's, yours too): put back as it was\n"
    )


def _record(tmp_path: Path, **data: object) -> list[journal.Record]:
    return [journal.Record(tmp_path / "check-1.json", {"pid": 4242, **data})]


def test_repair_removes_a_check_folder_git_never_knew_and_says_so(
    git_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = StatePaths(git_repo).private / "checks" / "tree-killed"
    folder.mkdir(parents=True)  # killed before its worktree was added
    assert checking.repair(git_repo, _record(tmp_path, path=str(folder)))
    assert not folder.exists()
    assert (
        capsys.readouterr().err
        == f"stella: a killed stella process (pid 4242): its check tree {folder} removed\n"
    )


def test_repair_says_nothing_when_there_was_nothing_to_do(
    git_repo: Path, worktree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {"tree": str(worktree), "branch": BRANCH, "commit": _head(worktree)}
    assert checking.repair(git_repo, _record(tmp_path, **data))
    assert capsys.readouterr().err == ""


def test_repair_puts_back_a_worktree_whose_git_file_the_killed_check_removed(
    git_repo: Path, worktree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tip = _head(worktree)
    git("reset", "-q", "--hard", "HEAD~1", cwd=worktree)  # it moved the branch back ...
    back = _head(worktree)
    (worktree / ".git").unlink()  # ... and removed its .git
    check = subprocess.Popen(
        ["sleep", "60"], start_new_session=True
    )  # the killed fleet's check, still running
    reaped = threading.Thread(target=check.wait)
    reaped.start()
    who = ProcessIdentity.of(check.pid)
    assert who is not None
    data = {"tree": str(worktree), "branch": BRANCH, "commit": tip, "check": [who.pid, who.started_at]}
    assert checking.repair(git_repo, _record(tmp_path, **data))
    reaped.join(timeout=10)
    assert _head(worktree) == tip and git("rev-parse", BRANCH, cwd=git_repo).strip() == tip
    assert capsys.readouterr().err == (
        f"stella: a killed stella process (pid 4242): its check (pid {who.pid}) stopped; "
        f"the check removed {worktree / '.git'} (repaired); the check moved {BRANCH} from {tip[:7]} to "
        f"{back[:7]}: put back\n"
    )


def test_a_check_stopped_by_the_run_says_so_and_how_long_it_ran(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()  # the run is stopping as the check starts
    run = checking.run_check(
        "sleep 30", tmp_path, env=ENV, timeout=30, log_path=tmp_path / "c.log", tail_bytes=400, stop=stop
    )
    assert run.exit_code is None and 0 <= run.seconds < 10
    assert run.problem == f"stopped after {run.seconds:.1f} s: the run is being stopped"


def test_what_a_check_changed_in_the_main_tree_is_named_five_at_most(git_repo: Path, ledger: Ledger) -> None:
    wrote = f"cd {git_repo} && touch m1 m2 m3 m4 m5 m6"  # a check that writes outside its own tree
    [run] = _checks(git_repo, ledger, [_command(git_repo, wrote)])
    assert run.passed, run.tail
    warning = run.tail.splitlines()[-1]
    assert warning.startswith("[stella] warning: the main tree changed while the check ran (by it or by ")
    assert warning.endswith("): m1 m2 m3 m4 m5"), warning


def test_a_check_gone_before_its_process_is_noted_leaves_none_in_its_record(git_repo: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    with checking.tracked(git_repo) as record:
        record.started(gone.pid)
        assert record.fields == {"check": None}


def test_repair_leaves_alone_a_worktree_whose_record_names_no_commit(
    git_repo: Path, worktree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (worktree / "work.txt").write_text("changed since\n")
    data = {"tree": str(worktree), "branch": BRANCH, "commit": None}  # a tree on a branch with no commit
    assert checking.repair(git_repo, _record(tmp_path, **data))
    assert capsys.readouterr().err == ""
    assert (worktree / "work.txt").read_text() == "changed since\n"


def test_a_stash_entry_the_check_made_and_then_committed_is_known_as_its_own(
    git_repo: Path, ledger: Ledger, worktree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # stella's own directory is no repository: the check's tree is read
    before = git("stash", "list", cwd=git_repo)
    # lint-staged's way: a backup stash of what is staged, the stash applied, and the result committed
    check = "echo more >> work.txt && git add work.txt && git stash -q && git stash apply -q --index"
    check += " && git commit -qm x"
    [run] = _checks(git_repo, ledger, [_command(git_repo, check)], worktree)
    assert git("stash", "list", cwd=git_repo) == before, run.tail
