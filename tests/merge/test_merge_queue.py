"""stella merge on a real repository: a run's green branches land in dependency order, each checked,
and the user's branch only ever moves to a commit whose check passed."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
from helpers.merging import RUN_ID, build_run, commit_on, merges
from helpers.repo import StellaRunner, add_submodule, git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CIState
from stellafleet.merge.runner import MergeOptions, merge_run
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

# Each passing check appends "PASS <sha>", each failing one "FAIL <sha>", to this log.
CHECK = (
    'sha=$(git rev-parse HEAD); if [ -e bad.txt ]; then echo "FAIL $sha" >> "$CHECK_LOG"; '
    'echo "collected 3 items"; echo "bad.txt: forbidden file"; echo "1 failed, 2 passed"; exit 1; fi; '
    'echo "PASS $sha" >> "$CHECK_LOG"'
)


def checked(log: Path, verdict: str) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(verdict)]


@pytest.fixture
def check_env(tmp_path: Path) -> dict[str, str]:
    return {"CHECK_LOG": str(tmp_path / "checks.log")}


def test_green_branches_land_in_dependency_order_and_head_only_moves_to_checked_commits(
    git_repo: Path, stella: StellaRunner, check_env: dict[str, str], tmp_path: Path
) -> None:
    build_run(git_repo)
    start = git("rev-parse", "main", cwd=git_repo).strip()
    proc = stella("merge", "--serial", "--check", CHECK, cwd=git_repo, env=check_env)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.strip()[:2].rstrip(".").isdigit()]
    assert [line.split()[1] for line in lines] == ["merged", "merged", "CONFLICT", "CHECK"]
    assert "fleet/a-abcd" in lines[0] and "fleet/b-abcd [b] (after a)" in lines[1]
    assert "fleet/c-abcd [c]" in lines[2] and "conflicts with main in README.md" in lines[2]
    assert "fleet/d-abcd [d]" in lines[3] and "exited 1" in lines[3]
    assert "| bad.txt: forbidden file" in out and "| 1 failed, 2 passed" in out
    assert "merged 2, failed 2" in out

    # main moved twice, each time to a commit whose check passed; the failing result was never HEAD
    log = Path(check_env["CHECK_LOG"])
    passed, failed = checked(log, "PASS"), checked(log, "FAIL")
    assert len(passed) == 2 and len(failed) == 2 and failed[0] == failed[1]  # a red one is confirmed once
    reflog = git("reflog", "show", "--format=%H", "refs/heads/main", cwd=git_repo).split()
    assert reflog[:-1] == list(reversed(passed)) and reflog[-1] == start
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == passed[-1]
    assert failed[0] not in git("rev-list", "--all", cwd=git_repo) or failed[0] not in reflog
    # the work tree follows the branch: a's and b's files are there, c's and d's are not
    assert (git_repo / "b.txt").exists() and (git_repo / "README.md").read_text() == "# changed by a\n"
    assert not (git_repo / "c.txt").exists() and not (git_repo / "bad.txt").exists()
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    # rebase: linear history, the fleet branches themselves untouched
    assert git("rev-list", "--merges", "--count", "main", cwd=git_repo).strip() == "0"
    rows = merges(git_repo)
    assert [(r["branch"], r["status"], r["position"]) for r in rows] == [
        ("fleet/a-abcd", "merged", 1),
        ("fleet/b-abcd", "merged", 2),
        ("fleet/c-abcd", "conflict", 3),
        ("fleet/d-abcd", "check_failed", 4),
    ]
    assert rows[1]["after_sha"] == passed[-1] and rows[1]["before_sha"] == rows[0]["after_sha"]
    assert rows[2]["files"] == ["README.md"]
    assert "bad.txt: forbidden file" in str(rows[3]["check_tail"])
    assert not list(tmp_path.glob("stella-merge-*"))
    assert (
        len(git("worktree", "list", "--porcelain", cwd=git_repo).split("worktree ")) == 3
    )  # + the check tree

    shown = stella("runs", RUN_ID, cwd=git_repo)
    assert "merges" in shown.stdout and "conflict" in shown.stdout and "README.md" in shown.stdout

    # a second pass finds a and b already in and tries c and d again
    again = stella("merge", "--serial", "--check", CHECK, "--json", cwd=git_repo, env=check_env)
    doc = json.loads(again.stdout)
    assert [(i["task_id"], i["status"]) for i in doc["queue"]] == [
        ("a", "skipped"),
        ("b", "skipped"),
        ("c", "conflict"),
        ("d", "check_failed"),
    ]
    assert [i["reason"] for i in doc["queue"][:2]] == ["already in main", "already in main"]
    assert doc["end_sha"] == passed[-1]
    dry = json.loads(stella("merge", "--dry-run", "--json", cwd=git_repo).stdout)  # the preview says so too
    assert [i["reason"] for i in dry["queue"][:2]] == ["already in main", "already in main"]


def test_a_dirty_tree_is_refused_and_nothing_changes(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    (git_repo / "README.md").write_text("my own unfinished edit\n")
    head = git("rev-parse", "HEAD", cwd=git_repo)
    proc = stella("merge", cwd=git_repo)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "stella: error: your work tree has uncommitted changes (1 file: README.md): "
        "commit or stash them before stella merge"
    ]
    assert git("rev-parse", "HEAD", cwd=git_repo) == head
    assert (git_repo / "README.md").read_text() == "my own unfinished edit\n"
    assert merges(git_repo) == []


def test_dry_run_shows_the_order_and_changes_nothing(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo, ci={"d": CIState.RED})
    head = git("rev-parse", "HEAD", cwd=git_repo)
    refs = git("for-each-ref", cwd=git_repo)
    proc = stella("merge", "--dry-run", "--check", "true", cwd=git_repo)
    assert proc.returncode == 0, proc.stderr
    assert "would rebase 1 commit onto main and run `true`" in proc.stdout
    assert proc.stdout.index("fleet/a-abcd") < proc.stdout.index("fleet/b-abcd")
    # c clashes with a, which lands before it: the dry run says so (a merge in the object store only)
    clash = next(line for line in proc.stdout.splitlines() if "fleet/c-abcd" in line)
    assert "would clash" in clash and "would conflict with main in README.md" in clash
    assert "left out" in proc.stdout and "CI is red, not green" in proc.stdout
    assert "nothing changed" in proc.stdout
    assert git("rev-parse", "HEAD", cwd=git_repo) == head
    assert git("for-each-ref", cwd=git_repo) == refs
    assert git("status", "--porcelain", "--untracked-files=no", cwd=git_repo) == ""
    assert merges(git_repo) == []


def test_merge_strategy_and_unwatched_and_clean_sees_rebased_branches_as_merged(
    git_repo: Path, stella: StellaRunner
) -> None:
    build_run(git_repo, ci={"a": CIState.RED})
    (git_repo / ".stella" / "config.toml").write_text(
        '[merge]\nstrategy = "merge"\ncheck = "test ! -e bad.txt"\n'
    )
    proc = stella("merge", "--unwatched", cwd=git_repo)
    assert proc.returncode == 1, proc.stderr
    assert git("rev-list", "--merges", "--count", "main", cwd=git_repo).strip() == "2"
    rows = {r["branch"]: r for r in merges(git_repo)}
    assert rows["fleet/a-abcd"]["strategy"] == "merge" and rows["fleet/a-abcd"]["status"] == "merged"
    assert rows["fleet/a-abcd"]["check_command"] == "test ! -e bad.txt"
    cleaned = stella("clean", "--dry-run", "--json", cwd=git_repo)
    doc = json.loads(cleaned.stdout)
    assert sorted(i["target"] for i in doc["would_remove"]) == ["fleet/a-abcd", "fleet/b-abcd"]


def test_clean_counts_a_rebased_branch_as_merged(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    (git_repo / "other.txt").write_text("main moved on\n")
    git("add", "other.txt", cwd=git_repo)
    git("commit", "-qm", "main moves on", cwd=git_repo)
    assert stella("merge", "--check", "test ! -e bad.txt", cwd=git_repo).returncode == 1
    # rebased: neither fleet branch is an ancestor of main any more, yet their changes are in it
    for branch in ("fleet/a-abcd", "fleet/b-abcd"):
        is_ancestor = ["git", "merge-base", "--is-ancestor", branch, "main"]
        assert subprocess.run(is_ancestor, cwd=git_repo).returncode == 1
    proc = stella("clean", "--json", cwd=git_repo)
    doc = json.loads(proc.stdout)
    removed = {i["target"]: i["reason"] for i in doc["removed"]}
    assert set(removed) == {"fleet/a-abcd", "fleet/b-abcd"}
    assert "stella merge" in removed["fleet/b-abcd"]
    kept = {i["target"] for i in doc["kept"]}
    assert kept == {"fleet/c-abcd", "fleet/d-abcd"}
    with sqlite3.connect(StatePaths(git_repo).fleet_db) as conn:
        assert conn.execute("SELECT count(*) FROM cleanups WHERE action = 'removed'").fetchone()[0] == 2


def test_the_checks_output_is_shown_escaped_never_obeyed(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    check = "printf 'bad \\033]0;pwned\\007 \\033[2J\\n'; test ! -e bad.txt"
    proc = stella("merge", "--check", check, cwd=git_repo)
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout, repr(proc.stdout)
    # the ledger keeps a check's output without its terminal codes (its log keeps them)
    assert "      | bad" in [line.rstrip() for line in proc.stdout.splitlines()], proc.stdout


def test_a_dependency_whose_branch_is_gone_skips_its_dependent(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    git("branch", "-D", "fleet/a-abcd", cwd=git_repo)
    proc = stella("merge", "--check", "test ! -e bad.txt", "--json", cwd=git_repo)
    doc = json.loads(proc.stdout)
    queue = {i["task_id"]: i for i in doc["queue"]}
    assert queue["a"]["status"] == "skipped" and "no longer exists" in queue["a"]["reason"]
    assert (queue["b"]["status"], queue["b"]["reason"]) == ("skipped", "depends on a, which did not land")
    assert not (git_repo / "b.txt").exists()  # b, built on a, did not land a's work either


def test_check_tail_lines_keeps_exactly_the_last_n_lines(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    (git_repo / ".stella" / "config.toml").write_text(
        '[merge]\ncheck = "if [ -e bad.txt ]; then seq 1 50; exit 1; fi"\ncheck_tail_lines = 3\n'
    )
    doc = json.loads(stella("merge", "--json", cwd=git_repo).stdout)
    d = next(i for i in doc["queue"] if i["task_id"] == "d")
    assert d["status"] == "check_failed" and d["check_tail"] == "48\n49\n50"
    assert {r["branch"]: r["check_tail"] for r in merges(git_repo)}["fleet/d-abcd"] == "48\n49\n50"


def test_check_timeout_stops_a_hanging_check(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    (git_repo / ".stella" / "config.toml").write_text(
        '[merge]\ncheck = "if [ -e bad.txt ]; then echo hanging; sleep 600; fi"\ncheck_timeout = 0.5\n'
    )
    proc = stella("merge", "--json", cwd=git_repo, timeout=60)  # without the timeout: 600 s, then killed
    d = next(i for i in json.loads(proc.stdout)["queue"] if i["task_id"] == "d")
    assert d["status"] == "check_failed" and d["reason"].endswith("ran out of time")
    assert re.fullmatch(
        r"hanging\n\[stella\] stopped after [\d.]+ s: check_timeout is 0.5 s", d["check_tail"]
    )


def test_merge_and_clean_name_the_pull_requests_and_remote_branches_they_leave_open(
    git_repo: Path, stella: StellaRunner
) -> None:
    build_run(git_repo, prs=True)  # --watch opened a pull request for each branch
    proc = stella("merge", "--check", "test ! -e bad.txt", cwd=git_repo)
    assert proc.returncode == 1, proc.stderr
    note = (
        "still open on GitHub, their branches on the remote: PR #1 (fleet/a-abcd), PR #2 (fleet/b-abcd); "
        "push main and close them (`gh pr close N --delete-branch`), or land them through GitHub with "
        "`stella merge --via-gh`"
    )
    assert note in proc.stdout.splitlines(), proc.stdout  # the landed ones; c and d did not land
    again = stella("merge", "--json", "--check", "test ! -e bad.txt", cwd=git_repo)
    assert json.loads(again.stdout)["open_prs"] == []  # a and b are already in: nothing landed this time
    cleaned = stella("clean", cwd=git_repo)
    assert cleaned.returncode == 0, cleaned.stderr
    assert note in cleaned.stdout.splitlines(), cleaned.stdout


def test_each_branch_is_checked_in_a_kept_check_tree_readied_as_a_worktree_and_cleaned_between_checks(
    git_repo: Path, stella: StellaRunner
) -> None:
    (git_repo / ".gitignore").write_text("node_modules/\nset-up\n")
    (git_repo / ".worktreeinclude").write_text("node_modules/\n")
    git("add", ".gitignore", ".worktreeinclude", cwd=git_repo)
    git("commit", "-qm", "ignore node_modules", cwd=git_repo)
    (git_repo / "node_modules").mkdir()
    (git_repo / "node_modules" / "lib.js").write_text("module.exports = 1\n")
    build_run(git_repo)
    check = "test -f node_modules/lib.js && test -f set-up && ! test -e leftover && touch leftover"
    check += " && echo checked $STELLA_MERGE_TASK"
    (git_repo / ".stella" / "config.toml").write_text(
        f'[worktree]\nsetup = "touch set-up"\n\n[merge]\ncheck = "{check}"\n'
    )
    proc = stella("merge", "--serial", "--json", cwd=git_repo, timeout=120)
    queue = {i["task_id"]: i for i in json.loads(proc.stdout)["queue"]}
    assert {t: queue[t]["status"] for t in "abcd"} == {
        "a": "merged", "b": "merged", "c": "conflict", "d": "merged"
    }  # fmt: skip
    stored = {r["task_id"]: r["check_tail"] for r in merges(git_repo)}
    # a passing check's output is kept; what it left untracked is removed before the next check, and said
    assert stored["a"].splitlines()[0] == "checked a" and stored["d"].splitlines()[0] == "checked d"
    assert "removed what the check left untracked: leftover" in stored["a"]
    assert (StatePaths(git_repo).private / "merge-trees" / "check-1" / "set-up").exists()  # ignored: kept


@pytest.mark.parametrize("init", ["true", "false"])
def test_a_check_tree_gets_the_main_trees_submodules_as_init_submodules_says(
    git_repo: Path, stella: StellaRunner, tmp_path: Path, init: str
) -> None:
    add_submodule(git_repo, tmp_path)
    build_run(git_repo)
    (git_repo / ".stella" / "config.toml").write_text(f"[fleet]\ninit_submodules = {init}\n")
    proc = stella("merge", "--json", "--check", "cat vendor/lib/lib.c", cwd=git_repo, timeout=120)
    queue = {i["task_id"]: i["status"] for i in json.loads(proc.stdout)["queue"]}
    landed = "merged" if init == "true" else "check_failed"
    assert (queue["a"], queue["d"]) == (landed, landed), proc.stdout + proc.stderr
    stored = {r["task_id"]: r["check_tail"] for r in merges(git_repo)}
    assert ("int lib;" in stored["a"]) == (init == "true"), stored["a"]


def test_a_dry_run_names_the_check_each_branch_would_get(git_repo: Path) -> None:
    # in process: the dry run's word on a branch whose task has a check of its own (issue 49 item 12)
    base = git("rev-parse", "HEAD", cwd=git_repo).strip()
    tasks = [
        sample_task("own", isolation="isolated", check="make test"),
        sample_task("none", isolation="isolated"),
    ]
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(git_repo))
        ledger.tasks.add(RUN_ID, tasks, {"own": 1, "none": 1})
        for task in ("own", "none"):
            commit_on(git_repo, f"fleet/{task}", base, {f"{task}.txt": "x\n"})
            ledger.tasks.set_workspace(RUN_ID, task, f"fleet/{task}", None)
            ledger.tasks.set_status(RUN_ID, task, "succeeded")
        ledger.runs.finish(RUN_ID, "succeeded", exit_code=0)

    for check, own, none in [
        (None, "and run `make test`", "(no check command)"),
        ("true", "and run `make test` then `true`", "and run `true`"),
    ]:
        result = merge_run(git_repo, MergeOptions(dry_run=True, unwatched=True, check=check))
        said = {item.task_id: item.reason for item in result.queue}
        assert said == {
            "own": f"would rebase 1 commit onto main {own}",
            "none": f"would rebase 1 commit onto main {none}",
        }
