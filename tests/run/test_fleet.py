"""`stella fleet` end to end: real repositories, real worker processes, the command pipeline."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.fleet import Scripts, by_id, file_locks, run_record, wait_for, write_config
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops, worktrees

EXAMPLE_PLAN = Path(__file__).resolve().parents[2] / "examples" / "feature-buildout.toml"

FEATURE_BUILDOUT = """\
[[tasks]]
id = "schema"
title = "Add the migration"
prompt = "Add a migration creating the `receipts` table with an execution_id foreign key"
claims = ["src/store/schema.rs", "src/store/migrations.rs"]

[[tasks]]
id = "reader"
title = "Read path"
prompt = "Add Store::receipts_for_execution reading the new receipts table"
depends_on = ["schema"]
claims = ["src/store/read.rs"]

[[tasks]]
id = "writer"
title = "Write path"
prompt = "Record one receipt row per model call from the engine's emit path"
depends_on = ["schema"]
claims = ["src/store/write.rs"]

[[tasks]]
id = "docs"
title = "Rewrite the receipts page"
prompt = "Rewrite docs/receipts.md against the new table; try two structures and keep the better one"
depends_on = ["reader", "writer"]
isolation = "isolated"
"""

SCHEMA = """\
run = os.environ["STELLA_RUN_ID"]
for rel in ("src/store/schema.rs", "src/store/migrations.rs"):
    path = WS / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"// {rel} from {run}\\n")
stella_commit("schema: receipts table", "src/store/schema.rs", "src/store/migrations.rs")
report(summary="migration added")
"""

READ_WRITE = """\
other = "writer" if TASK == "reader" else "reader"
mark(f"{TASK}.start", time.time())
mark(f"{TASK}.started")
wait_file(MARKS / f"{other}.started")  # only possible when both run at the same time
name = "read.rs" if TASK == "reader" else "write.rs"
(WS / "src" / "store" / name).write_text(f"// {name} from {os.environ['STELLA_RUN_ID']}\\n")
stella_commit(f"{TASK}: {name}", f"src/store/{name}")
mark(f"{TASK}.end", time.time())
report(summary=f"{name} written")
"""

DOCS = """\
assert os.environ["STELLA_ISOLATION"] == "isolated"
run = os.environ["STELLA_RUN_ID"]
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=WS, capture_output=True, text=True).stdout.strip()
mark(f"docs-{run}.head", head)
mark(f"docs-{run}.sees-schema", (WS / "src" / "store" / "schema.rs").exists())
mark(f"docs-{run}.cwd", os.getcwd())
(WS / "docs").mkdir(exist_ok=True)
(WS / "docs" / "receipts.md").write_text(f"# Receipts ({run})\\n")
subprocess.run(["git", "add", "docs/receipts.md"], cwd=WS, check=True)
subprocess.run(["git", "commit", "-q", "-m", "docs: receipts page"], cwd=WS, check=True)
report(summary="receipts page rewritten")
"""


def _buildout(git_repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    plan = tmp_path / "feature-buildout.toml"
    if EXAMPLE_PLAN.exists():
        shutil.copy(EXAMPLE_PLAN, plan)
    else:
        plan.write_text(FEATURE_BUILDOUT)
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(
        git_repo,
        tasks={
            "schema": scripts.python("schema", SCHEMA),
            "reader": scripts.python("reader", READ_WRITE),
            "writer": scripts.python("writer", READ_WRITE),
            "docs": scripts.python("docs", DOCS),
        },
    )
    # The project config is committed, as a team would: the tree is clean before the run.
    git("add", ".stella/config.toml", cwd=git_repo)
    git("commit", "-q", "-m", "stella config", cwd=git_repo)
    return plan, marks


def test_feature_buildout_runs_in_three_waves_with_docs_isolated_from_the_pinned_base(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan, marks = _buildout(git_repo, tmp_path)
    base = gitops.head_commit(git_repo)
    env = {"MARKS": str(marks)}
    args = ("fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "3")

    first = stella(*args, cwd=git_repo, env=env)

    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[0] == "stella fleet: max concurrency 3 (--max-concurrency)"
    record = run_record(git_repo)
    run_id = record["run"]["id"]
    assert re.fullmatch(r"r-\d{8}-\d{6}-[0-9a-f]{4}", run_id)
    assert record["run"]["status"] == "succeeded" and record["run"]["exit_code"] == 0
    assert record["run"]["base_commit"] == base
    tasks = by_id(record["tasks"])
    assert {t: tasks[t]["wave"] for t in tasks} == {"schema": 1, "reader": 2, "writer": 2, "docs": 3}
    assert {t: tasks[t]["status"] for t in tasks} == dict.fromkeys(tasks, "succeeded")

    # reader and writer ran at the same time (each waited for the other to start)
    start = {t: float((marks / f"{t}.start").read_text()) for t in ("reader", "writer")}
    end = {t: float((marks / f"{t}.end").read_text()) for t in ("reader", "writer")}
    assert start["reader"] < end["writer"] and start["writer"] < end["reader"]

    # docs ran in its own worktree, on its own branch, from the pinned base (HEAD moved meanwhile)
    digest = worktrees.task_hash(run_id, "docs")
    worktree = git_repo / ".stella" / "worktrees" / f"docs-{digest}"
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    assert tasks["docs"]["branch"] == f"fleet/docs-{digest}"
    assert Path(tasks["docs"]["worktree"]) == worktree
    assert Path((marks / f"docs-{run_id}.cwd").read_text()).resolve() == worktree.resolve()
    assert (marks / f"docs-{run_id}.head").read_text() == base
    assert (marks / f"docs-{run_id}.sees-schema").read_text() == "False"
    head = gitops.head_commit(git_repo)
    assert head != base
    assert git("rev-parse", f"fleet/docs-{digest}~1", cwd=git_repo).strip() == base

    # every commit recorded for its own task and branch
    commits = record["commits"]
    assert sorted((c["task_id"], c["branch"]) for c in commits) == sorted(
        [("schema", "main"), ("reader", "main"), ("writer", "main"), ("docs", f"fleet/docs-{digest}")]
    )
    main_log = git("log", "--format=%H", f"{base}..main", cwd=git_repo).split()
    assert {c["sha"] for c in commits if c["branch"] == "main"} == set(main_log)
    docs_commit = git("rev-parse", f"fleet/docs-{digest}", cwd=git_repo).strip()
    assert [c["sha"] for c in commits if c["task_id"] == "docs"] == [docs_commit]
    assert git("status", "--porcelain", cwd=git_repo) == ""  # state stays out of git status
    exclude = (git_repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert ".stella/private/" in exclude and ".stella/worktrees/" in exclude
    assert file_locks(git_repo) == []

    # the same plan again: new branch and worktree, nothing collides with the first run's
    second = stella(*args, cwd=git_repo, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    again = run_record(git_repo)
    assert again["run"]["id"] != run_id
    docs_again = by_id(again["tasks"])["docs"]
    assert docs_again["branch"] != tasks["docs"]["branch"]
    assert docs_again["worktree"] != tasks["docs"]["worktree"]
    branches = gitops.git("branch", "--list", "fleet/*", "--format=%(refname:short)", cwd=git_repo).split()
    assert sorted(branches) == sorted([tasks["docs"]["branch"], docs_again["branch"]])
    assert (marks / f"docs-{again['run']['id']}.head").read_text() == head  # pinned to the new HEAD


SLOW_HOLDER = """\
import sqlite3
mark(f"{TASK}.holding")
db = WS / ".stella" / "private" / "fleet.db"
deadline = time.monotonic() + 60
# hold the claim until the other task's attempt has been recorded as failed
while time.monotonic() < deadline:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    failed = conn.execute(
        "SELECT count(*) FROM attempts WHERE run_id = ? AND outcome = 'failed'",
        (os.environ["STELLA_RUN_ID"],),
    ).fetchone()[0]
    conn.close()
    if failed:
        break
    time.sleep(0.05)
report(summary="held shared.txt")
"""


BOTH_HOLDING = """\
mark(f"{TASK}.holding")
wait_file(MARKS / ("right.holding" if TASK == "left" else "left.holding"), timeout=30)
"""


def test_an_isolated_tasks_claims_name_its_own_worktrees_files(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "left"\nprompt = "edit"\nclaims = ["shared.txt"]\n\n'
        '[[tasks]]\nid = "right"\nprompt = "edit"\nclaims = ["shared.txt"]\nisolation = "isolated"\n'
    )
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=scripts.python("both", BOTH_HOLDING))

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    # both held shared.txt at once: the shared tree's file and the worktree's own copy are different files
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {t["status"] for t in run_record(git_repo)["tasks"]} == {"succeeded"}
    assert file_locks(git_repo) == []


def test_two_tasks_of_one_wave_claiming_one_path_second_fails_naming_the_first(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "left"\ntitle = "Left side"\nprompt = "edit"\nclaims = ["shared.txt"]\n\n'
        '[[tasks]]\nid = "right"\ntitle = "Right side"\nprompt = "edit"\nclaims = ["./shared.txt"]\n\n'
        '[[tasks]]\nid = "after"\nprompt = "next"\ndepends_on = ["left", "right"]\n'
    )
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, run=scripts.python("holder", SLOW_HOLDER))

    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    winner = "left" if tasks["left"]["status"] == "succeeded" else "right"
    loser = "right" if winner == "left" else "left"
    assert tasks[winner]["status"] == "succeeded"
    assert tasks[loser]["status"] == "failed"
    expected = (
        f'claim conflict: shared.txt is held by task "{winner}" ({tasks[winner]["title"]}) '
        f"(run {record['run']['id']}, pid "
    )
    assert tasks[loser]["reason"].startswith(expected)
    # the holder named is the winner's worker (not the fleet holding for it), and its start came first
    (held,) = [a for a in record["attempts"] if a["task_id"] == winner]
    assert tasks[loser]["reason"].startswith(f"{expected}{held['pid']})")
    assert proc.stdout.index(f"  started {winner} ") < proc.stdout.index(f"  failed {loser} "), proc.stdout
    failed = [a for a in record["attempts"] if a["task_id"] == loser]
    assert len(failed) == 1 and failed[0]["success"] == 0
    assert failed[0]["error"].startswith(expected) and failed[0]["summary"].startswith(expected)
    assert failed[0]["pid"] is None  # no worker was started for it
    assert tasks["after"]["status"] == "skipped"
    assert tasks["after"]["reason"] == f"dependency failed: {loser}"
    assert f"failed {loser}" in proc.stdout and "claim conflict: shared.txt" in proc.stdout
    assert file_locks(git_repo) == []


HOLD_UNTIL_RELEASED = """\
mark("holder.holding")
wait_file(MARKS / "release")
report(summary="done holding")
"""


def test_a_second_fleet_run_cannot_take_a_path_the_first_run_holds(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, spawned: list[subprocess.Popen[str]]
) -> None:
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    write_config(git_repo, tasks={"holder": scripts.python("hold", HOLD_UNTIL_RELEASED), "intruder": "true"})
    first_plan = tmp_path / "first.toml"
    first_plan.write_text('[[tasks]]\nid = "holder"\ntitle = "Holds x"\nprompt = "p"\nclaims = ["x.txt"]\n')
    second_plan = tmp_path / "second.toml"
    second_plan.write_text('[[tasks]]\nid = "intruder"\nprompt = "p"\nclaims = ["x.txt"]\n')
    env = {**__import__("os").environ, "MARKS": str(marks)}
    first = subprocess.Popen(
        [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(first_plan), "--pipeline", "command"],
        cwd=git_repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    spawned.append(first)
    wait_for(marks / "holder.holding", process=first)
    with_first = run_record(git_repo)
    first_run = with_first["run"]["id"]
    holder_attempt = with_first["attempts"][0]

    second = stella("fleet", "--plan", str(second_plan), "--pipeline", "command", cwd=git_repo)

    assert second.returncode == 1, second.stdout + second.stderr
    record = run_record(git_repo)
    assert record["run"]["id"] != first_run
    reason = by_id(record["tasks"])["intruder"]["reason"]
    assert reason.startswith(
        f'claim conflict: x.txt is held by task "holder" (Holds x) (run {first_run}, pid '
    )
    assert holder_attempt["task_id"] == "holder"
    (marks / "release").write_text("go")
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out
    assert file_locks(git_repo) == []


def test_isolated_tasks_of_one_wave_get_their_own_worktrees_and_branches_at_once(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[defaults]\nisolation = "isolated"\n\n'
        + "".join(f'[[tasks]]\nid = "iso-{n}"\nprompt = "variant {n}"\n\n' for n in range(4))
    )
    write_config(
        git_repo,
        run='echo "$STELLA_PROMPT" > variant.txt && git add variant.txt && git commit -q -m "$STELLA_PROMPT" '
        '&& echo "$STELLA_PROMPT" > second.txt && git add second.txt && git commit -q -m "second" && echo ok',
    )
    base = gitops.head_commit(git_repo)
    proc = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4", cwd=git_repo
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = run_record(git_repo)
    tasks = by_id(record["tasks"])
    assert {t["wave"] for t in tasks.values()} == {1}
    for n in range(4):
        task = tasks[f"iso-{n}"]
        branch = task["branch"]
        assert branch == f"fleet/iso-{n}-{worktrees.task_hash(record['run']['id'], f'iso-{n}')}"
        assert git("show", f"{branch}:variant.txt", cwd=git_repo) == f"variant {n}\n"
        recorded = [c for c in record["commits"] if c["task_id"] == f"iso-{n}"]
        assert [c["message"] for c in recorded] == [f"variant {n}", "second"]  # base..branch, oldest first
        assert {c["branch"] for c in recorded} == {branch}
    assert gitops.head_commit(git_repo) == base  # the user's checkout is untouched
    assert len(worktrees.worktree_list(git_repo)) == 5


def test_a_pipeline_without_a_transcript_leaves_no_dead_transcript_path(
    git_repo: Path, stella: StellaRunner
) -> None:
    write_config(git_repo, run='echo "done"')
    proc = stella("fleet", "--pipeline", "command", "one job", cwd=git_repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [attempt] = run_record(git_repo)["attempts"]
    assert attempt["transcript_path"] is None and attempt["log_path"]
