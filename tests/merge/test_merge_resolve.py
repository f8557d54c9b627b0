"""stella merge --resolve: a conflicting branch goes to a worker as a task whose prompt carries the
conflict; its merge is checked like any other before it lands, under the spend limit."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers.fleet import Scripts, toml_str, write_config
from helpers.merging import RUN_ID, build_run, merges
from helpers.repo import StellaRunner, add_submodule, git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.state.ledger import Ledger

# The resolver: merge the commit the prompt names, settle README.md for both sides, commit the merge.
RESOLVER = """
prompt = os.environ["STELLA_PROMPT"]
(Path(os.environ["MARKS"]) / f"{TASK}.prompt").write_text(prompt)
sha = re.search(r"git merge --no-ff ([0-9a-f]{40})", prompt).group(1)
merged = subprocess.run(["git", "merge", "--no-ff", "--no-edit", sha], capture_output=True, text=True)
assert merged.returncode != 0 and "CONFLICT" in merged.stdout, merged.stdout
(WS / "README.md").write_text("# changed by a and by c\\n")
subprocess.run(["git", "add", "README.md"], check=True)
subprocess.run(["git", "commit", "-q", "--no-edit"], check=True)
report(spend_usd=0.3, summary="merged, README.md keeps both")
"""


def test_a_conflict_goes_to_a_worker_and_its_merge_lands_after_the_check(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("resolver", "import re\n" + RESOLVER))
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = stella(
        "merge",
        "--serial",
        "--resolve",
        "--check",
        "test ! -e bad.txt",
        cwd=git_repo,
        env={"MARKS": str(marks)},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # d still fails its check
    rows = {r["task_id"]: r for r in merges(git_repo)}
    assert [r["status"] for r in merges(git_repo)] == ["merged", "merged", "merged", "check_failed"]
    assert "conflict resolved by task resolve-c on fleet/resolve-c-" in str(rows["c"]["reason"])
    assert rows["c"]["files"] == ["README.md"]
    # the prompt carried the conflict: the file, the markers, the task's own prompt
    prompt = (marks / "resolve-c.prompt").read_text()
    assert "conflicts with main" in prompt and "README.md" in prompt
    assert "<<<<<<< HEAD" in prompt and "# changed by c" in prompt and ">>>>>>>" in prompt
    assert "The task the branch did:\ndo it" in prompt
    # main has the resolution, both c's file and a's and b's; HEAD is the resolved merge
    assert (git_repo / "README.md").read_text() == "# changed by a and by c\n"
    assert (git_repo / "c.txt").exists() and (git_repo / "b.txt").exists()
    assert git("rev-parse", "HEAD", cwd=git_repo).strip() == rows["c"]["after_sha"]
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        record = ledger.get_run(RUN_ID)
    [task] = [t for t in record["tasks"] if t["id"] == "resolve-c"]
    assert task["status"] == "succeeded" and task["branch"].startswith("fleet/resolve-c-")
    assert record["run"]["spend_usd"] == 0.3


@pytest.mark.parametrize(("fleet", "lib"), [("", "True"), ("init_submodules = false", "False")])
def test_a_resolve_tasks_worktree_is_readied_as_the_fleets_are(
    git_repo: Path, stella: StellaRunner, tmp_path: Path, fleet: str, lib: str
) -> None:
    # [worktree] setup runs in it and [fleet] init_submodules decides about its submodules
    add_submodule(git_repo, tmp_path)
    build_run(git_repo)
    looks = 'mark(f"{TASK}.lib", (WS / "vendor" / "lib" / "lib.c").exists())\n'
    setup = 'echo "$STELLA_TASK_ID" >> "$MARKS/setup.log"'
    write_config(
        git_repo,
        run=Scripts(tmp_path / "scripts").python("resolver", "import re\n" + looks + RESOLVER),
        extra=f"[fleet]\n{fleet}\n[worktree]\nsetup = {toml_str(setup)}\n",
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = stella("merge", "--serial", "--resolve", cwd=git_repo, env={"MARKS": str(marks)})
    assert "conflict resolved by task resolve-c" in proc.stdout, proc.stdout + proc.stderr
    assert (marks / "resolve-c.lib").read_text() == lib
    assert (marks / "setup.log").read_text().split() == ["resolve-c"]


def test_a_resolve_worker_reads_the_config_file_stella_was_given(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    build_run(git_repo)
    config = write_config(
        git_repo, run=Scripts(tmp_path / "scripts").python("resolver", "import re\n" + RESOLVER)
    )
    given = config.rename(tmp_path / "given.toml")
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = stella(
        "--config", str(given), "merge", "--serial", "--resolve", cwd=git_repo, env={"MARKS": str(marks)}
    )
    assert "conflict resolved by task resolve-c" in proc.stdout, proc.stdout + proc.stderr


def test_no_resolve_task_once_the_spend_limit_is_reached(git_repo: Path, stella: StellaRunner) -> None:
    build_run(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        attempt = ledger.attempts.start(RUN_ID, "a", pipeline="command")
        ledger.spend.add(attempt, 1.0)
        ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="earlier work"))
    proc = stella("--spend-limit", "1", "merge", "--serial", "--resolve", cwd=git_repo)
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if re.match(r"\s*\d+\. .*fleet/c-abcd", line))
    assert re.search(
        r"CONFLICT .*conflicts with main in README.md; spend limit reached \(\$1.00 of \$1.00\)", line
    )
    with Ledger.open(StatePaths(git_repo).fleet_db, readonly=True) as ledger:
        assert [t["id"] for t in ledger.get_run(RUN_ID)["tasks"]] == ["b", "a", "c", "d"]


def test_a_resolve_worker_is_guarded_by_what_is_left_of_the_limit(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    # the run spent $0.70 of its $1.00: the resolve worker may spend the $0.30 left, not the whole limit
    build_run(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        attempt = ledger.attempts.start(RUN_ID, "a", pipeline="command")
        ledger.spend.add(attempt, 0.7)
        ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary="earlier work"))
    guard = 'Path(os.environ["MARKS"], "guard").write_text(os.environ["STELLA_SPEND_GUARD"])\n'
    write_config(
        git_repo, run=Scripts(tmp_path / "scripts").python("resolver", "import re\n" + guard + RESOLVER)
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = stella(
        "--spend-limit", "1", "merge", "--serial", "--resolve", cwd=git_repo, env={"MARKS": str(marks)}
    )
    assert "conflict resolved by task resolve-c" in proc.stdout, proc.stdout + proc.stderr
    assert float((marks / "guard").read_text()) == pytest.approx(0.3)


# A resolver that never merges: it commits a file of its own and reports success.
UNRELATED = """
(WS / "notes.txt").write_text("looked at it\\n")
subprocess.run(["git", "add", "notes.txt"], check=True)
subprocess.run(["git", "commit", "-q", "-m", "notes"], check=True)
report(spend_usd=0.1, summary="done")
"""


def test_a_resolve_task_that_never_merged_the_branch_is_not_recorded_merged(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    heads = build_run(git_repo).heads
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("resolver", UNRELATED))
    proc = stella("merge", "--serial", "--resolve", cwd=git_repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["task_id"]: r for r in merges(git_repo)}
    assert rows["c"]["status"] == "conflict" and rows["c"]["after_sha"] is None
    assert "never merged fleet/c-abcd" in str(rows["c"]["reason"]), rows["c"]["reason"]
    line = next(line for line in proc.stdout.splitlines() if re.match(r"\s*\d+\. .*fleet/c-abcd", line))
    assert "CONFLICT" in line and "never merged" in line
    # c's commit is not in main, and neither is the resolver's unrelated file
    assert git("merge-base", "--is-ancestor", heads["a"], "main", cwd=git_repo) == ""
    assert not (git_repo / "notes.txt").exists() and not (git_repo / "c.txt").exists()
    done = subprocess.run(["git", "merge-base", "--is-ancestor", heads["c"], "main"], cwd=git_repo)
    assert done.returncode == 1


def test_a_resolve_tasks_branch_that_did_not_land_is_never_merged_on_its_own(
    git_repo: Path, stella: StellaRunner, tmp_path: Path
) -> None:
    # Its resolve task succeeded but its result did not land (here it never merged the branch; the same
    # after a failed check, or a merge killed while it ran). The next `stella merge` took the resolve
    # task's branch as one of the run's own and landed its unrelated commit unchecked against the branch
    # it was for; with --resolve, one that conflicted got a resolve task of its own (resolve-resolve-c).
    build_run(git_repo)
    write_config(git_repo, run=Scripts(tmp_path / "scripts").python("resolver", UNRELATED))
    first = stella("merge", "--serial", "--resolve", "--check", "test ! -e bad.txt", cwd=git_repo)
    assert first.returncode == 1, first.stdout + first.stderr

    # --unwatched: every succeeded task's branch, whatever CI said (the resolve task's was never watched)
    again = stella("merge", "--unwatched", "--check", "test ! -e bad.txt", cwd=git_repo)

    assert not (git_repo / "notes.txt").exists()  # the resolver's unrelated commit is not in main
    assert [r["task_id"] for r in merges(git_repo) if r["status"] == "merged"] == ["a", "b"]
    left = next(line for line in again.stdout.splitlines() if "fleet/resolve-c-" in line)
    assert "left out" in left and "it lands only as the resolution of fleet/c-abcd" in left, again.stdout
