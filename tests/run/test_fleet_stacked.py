"""`base = "parents"`: isolated tasks start from their dependencies' work, built as they are dispatched."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.fleet import Scripts, by_id, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.git import gitops

# The seed's plan, with docs stacked on its parents; reader is isolated and stacked too, and lint is a
# shared task docs does not depend on (its commit must stay out of docs' start).
STACKED = """\
[defaults]
base = "parents"

[[tasks]]
id = "schema"
prompt = "Add the migration"

[[tasks]]
id = "lint"
prompt = "Unrelated shared work"

[[tasks]]
id = "reader"
prompt = "Add the read path"
depends_on = ["schema"]
isolation = "isolated"

[[tasks]]
id = "writer"
prompt = "Add the write path"
depends_on = ["schema"]

[[tasks]]
id = "docs"
prompt = "Rewrite the receipts page"
depends_on = ["reader", "writer"]
isolation = "isolated"
"""

SHARED = """\
name = {"schema": "schema.rs", "writer": "write.rs", "lint": "lint.txt"}[TASK]
(WS / name).write_text(f"{TASK}\\n")
stella_commit(f"{TASK}: {name}", name)
report(summary="committed")
"""

ISOLATED = """\
seen = sorted(p.name for p in WS.iterdir() if p.suffix in (".rs", ".txt"))
mark(f"{TASK}.seen", json.dumps(seen))
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=WS, capture_output=True, text=True)
mark(f"{TASK}.head", head.stdout.strip())
name = {"reader": "read.rs", "docs": "docs.txt", "left": "f.txt", "right": "f.txt"}.get(TASK, "mine.txt")
(WS / name).write_text(f"{TASK}\\n")
subprocess.run(["git", "add", name], cwd=WS, check=True)
subprocess.run(["git", "commit", "-q", "-m", f"{TASK}: {name}"], cwd=WS, check=True)
report(summary="committed")
"""


def _configure(git_repo: Path, tmp_path: Path, plan_text: str, **scripted: str) -> tuple[Path, Path]:
    """The plan and the marks directory; scripted: a task's own worker script instead of the usual one."""
    scripts = Scripts(tmp_path / "scripts")
    marks = tmp_path / "marks"
    marks.mkdir()
    shared, isolated = scripts.python("shared", SHARED), scripts.python("isolated", ISOLATED)
    tasks = {"schema": shared, "writer": shared, "lint": shared}
    tasks.update(dict.fromkeys(("reader", "docs", "left", "right", "child", "grandchild"), isolated))
    tasks.update({task: scripts.python(task, body) for task, body in scripted.items()})
    write_config(git_repo, tasks=tasks)
    git("add", ".stella/config.toml", cwd=git_repo)
    git("commit", "-q", "-m", "stella config", cwd=git_repo)
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text)
    return plan, marks


def test_stacked_tasks_start_with_their_shared_isolated_and_transitive_dependencies_files(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, stella_main: StellaRunner
) -> None:
    plan, marks = _configure(git_repo, tmp_path, STACKED)
    base = gitops.head_commit(git_repo)
    args = ("fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "2")

    done = stella(*args, cwd=git_repo, env={"MARKS": str(marks)})

    assert done.returncode == 0, done.stdout + done.stderr
    seen = {task: json.loads((marks / f"{task}.seen").read_text()) for task in ("reader", "docs")}
    assert seen["reader"] == ["schema.rs"]
    # schema through both parents, read.rs from the isolated reader, write.rs from the shared writer
    assert seen["docs"] == ["read.rs", "schema.rs", "write.rs"]
    record = run_record(git_repo)
    tasks, attempts = by_id(record["tasks"]), by_id(record["attempts"], "task_id")
    reader_tip = git("rev-parse", tasks["reader"]["branch"], cwd=git_repo).strip()
    docs = attempts["docs"]
    assert (marks / "docs.head").read_text() == docs["start_commit"] != base
    parents = json.loads(docs["start_parents_json"])
    assert [parent["task"] for parent in parents] == ["schema", "reader", "writer"]
    assert parents[1]["commit"] == reader_tip
    assert gitops.is_ancestor(git_repo, reader_tip, docs["start_commit"])
    # docs' own commit alone is recorded for docs: its parents' work is theirs
    assert [c["message"] for c in record["commits"] if c["task_id"] == "docs"] == ["docs: docs.txt"]

    shown = stella_main("runs", record["run"]["id"], cwd=git_repo)
    assert f"start {docs['start_commit'][:12]} (parents: schema, reader, writer)" in shown.stdout
    listed = json.loads(stella_main("runs", record["run"]["id"], "--json", cwd=git_repo).stdout)
    (docs_task,) = [task for wave in listed["waves"] for task in wave["tasks"] if task["id"] == "docs"]
    assert docs_task["base"] == "parents" and docs_task["attempts"][0]["start_parents"] == parents


CONFLICTING = """\
[defaults]
isolation = "isolated"

[[tasks]]
id = "left"
prompt = "edit f.txt one way"

[[tasks]]
id = "right"
prompt = "edit f.txt another way"

[[tasks]]
id = "child"
prompt = "build on both"
depends_on = ["left", "right"]
base = "parents"

[[tasks]]
id = "grandchild"
prompt = "build on the child"
depends_on = ["child"]
"""


def test_parents_whose_work_conflicts_fail_the_task_by_name_before_its_worktree_or_worker(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan, marks = _configure(git_repo, tmp_path, CONFLICTING)
    args = ("fleet", "--plan", str(plan), "--pipeline", "command")

    done = stella(*args, cwd=git_repo, env={"MARKS": str(marks)})

    assert done.returncode == 1, done.stdout + done.stderr
    tasks = by_id(run_record(git_repo)["tasks"])
    assert tasks["child"]["status"] == "failed"
    assert tasks["child"]["reason"].endswith("parents left and right both change f.txt")
    assert "parents left and right both change f.txt" in done.stdout + done.stderr
    assert tasks["child"]["worktree"] is None and not (marks / "child.seen").exists()
    assert tasks["grandchild"]["status"] == "skipped"


def test_plan_show_check_and_the_dry_run_say_where_each_isolated_task_starts(
    git_repo: Path, tmp_path: Path, stella_main: StellaRunner
) -> None:
    plan, _ = _configure(git_repo, tmp_path, STACKED.replace('[defaults]\nbase = "parents"\n', ""))
    base = gitops.head_commit(git_repo)

    check = stella_main("plan", "check", str(plan), cwd=git_repo)
    assert check.stdout.splitlines()[1] == (
        f"hint: {plan}: isolated tasks reader, docs wait for their dependencies but start from the pinned "
        'base, without their work: set base = "parents" to start from it'
    )
    plan.write_text(STACKED)
    assert len(stella_main("plan", "check", str(plan), cwd=git_repo).stdout.splitlines()) == 1
    shown = stella_main("plan", "show", str(plan), cwd=git_repo).stdout
    assert "isolation: isolated (starts at parents: reader, writer)" in shown
    document = json.loads(stella_main("plan", "show", str(plan), "--json", cwd=git_repo).stdout)
    assert {task["id"]: task["starts_at"] for task in document["tasks"]} == {
        "schema": None,
        "lint": None,
        "reader": "parents: schema",
        "writer": None,
        "docs": "parents: reader, writer",
    }
    dry = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", "--dry-run", cwd=git_repo).stdout
    assert " from parents: reader, writer; after reader, writer" in dry
    plan.write_text(STACKED.replace('base = "parents"', 'base = "pinned"'))
    dry = stella_main("fleet", "--plan", str(plan), "--pipeline", "command", "--dry-run", cwd=git_repo).stdout
    assert f" from base {base[:7]}; after reader, writer" in dry


HALF_THEN_FAIL = """\
seen = sorted(p.name for p in WS.iterdir() if p.suffix == ".txt")
mark(f"{TASK}.seen", json.dumps(seen))
if not (MARKS / "resumed").exists():
    (WS / "half.txt").write_text("half way\\n")
    sys.exit("stopped half way")
report(summary="finished")
"""

RESUMED = """\
[[tasks]]
id = "left"
prompt = "make the left file"
isolation = "isolated"

[[tasks]]
id = "child"
prompt = "build on left"
depends_on = ["left"]
isolation = "isolated"
base = "parents"
"""


def test_a_resumed_stacked_task_starts_from_its_parents_now_with_its_salvaged_work_on_top(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    plan, marks = _configure(git_repo, tmp_path, RESUMED, child=HALF_THEN_FAIL)
    args = ("fleet", "--plan", str(plan), "--pipeline", "command")
    first = stella(*args, cwd=git_repo, env={"MARKS": str(marks)})
    assert first.returncode == 1, first.stdout + first.stderr
    record = run_record(git_repo)
    # left's branch moves on after the run: the resumed child starts from it as it is now
    worktree = Path(by_id(record["tasks"])["left"]["worktree"])
    (worktree / "later.txt").write_text("later\n")
    git("add", "later.txt", cwd=worktree)
    git("commit", "-q", "-m", "later", cwd=worktree)
    left_now = gitops.head_commit(worktree)
    (marks / "resumed").write_text("")

    resumed = stella(
        "fleet", "--resume", record["run"]["id"], "--from-salvage", "--pipeline", "command",
        cwd=git_repo, env={"MARKS": str(marks)},
    )  # fmt: skip

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((marks / "child.seen").read_text()) == ["f.txt", "half.txt", "later.txt"]
    attempt = by_id(run_record(git_repo)["attempts"], "task_id")["child"]
    parents = json.loads(attempt["start_parents_json"])
    assert [parent["task"] for parent in parents] == ["left", "its salvaged work"]
    assert parents[0]["commit"] == left_now


FAN_IN = """\
[defaults]
isolation = "isolated"

[[tasks]]
id = "child"
prompt = "build on both"
depends_on = ["left", "right"]
base = "parents"

[[tasks]]
id = "left"
prompt = "the left file"

[[tasks]]
id = "right"
prompt = "the right file"
"""


def test_stella_merge_lands_the_parents_first_and_the_childs_copies_of_their_work_drop_out(
    git_repo: Path, tmp_path: Path, stella: StellaRunner, stella_main: StellaRunner
) -> None:
    plan, marks = _configure(
        git_repo, tmp_path, FAN_IN, left=ISOLATED.replace('"left": "f.txt"', '"left": "left.txt"')
    )
    base = gitops.head_commit(git_repo)
    done = stella(
        "fleet", "--plan", str(plan), "--pipeline", "command", cwd=git_repo, env={"MARKS": str(marks)}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((marks / "child.seen").read_text()) == ["f.txt", "left.txt"]

    merged = stella_main("merge", "--unwatched", "--json", cwd=git_repo)

    assert merged.returncode == 0, merged.stdout + merged.stderr
    queue = json.loads(merged.stdout)["queue"]
    assert [item["task_id"] for item in queue] == ["left", "right", "child"]
    assert [item["status"] for item in queue] == ["merged"] * 3
    landed = git("log", "--format=%s", f"{base}..HEAD", cwd=git_repo).split("\n")
    # each task's own commit once: the child's start (its parents' work, the merge of them) is gone
    assert sorted(line for line in landed if line) == ["child: mine.txt", "left: left.txt", "right: f.txt"]
