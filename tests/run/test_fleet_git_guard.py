"""The git guard: a shared worker that runs the tree-wide git commands while three others edit loses nobody's
work (theirs, nor the user's), its own `stella commit` lands, and its log points it to `stella commit`."""

from __future__ import annotations

from pathlib import Path

from helpers.fleet import Scripts, run_record, write_config
from helpers.repo import StellaRunner, git

from stellafleet.core.paths import StatePaths

EDITORS = ("e1", "e2", "e3")
PLAN = "".join(
    f'[[tasks]]\nid = "{task}"\nprompt = "edit {task}.txt"\nclaims = ["{task}.txt"]\n\n'
    for task in (*EDITORS, "rogue")
)

EDITOR = """
(WS / f"{TASK}.txt").write_text(f"{TASK}'s edit\\n")
mark(f"{TASK}.ready")
wait_file(MARKS / "rogue.done")
stella_commit(f"{TASK}: edit", f"{TASK}.txt")
report(summary="edited")
"""

ROGUE_COMMANDS = [["stash", "-u"], ["checkout", "--", "."], ["reset", "--hard"], ["clean", "-fd"],
                  ["commit", "-am", "everything"]]  # fmt: skip
ROGUE = f"""
for task in {EDITORS!r}:
    wait_file(MARKS / f"{{task}}.ready")
(WS / "rogue.txt").write_text("rogue's edit\\n")
codes = []
for args in {ROGUE_COMMANDS!r}:
    done = subprocess.run(["git", *args], cwd=WS, capture_output=True, text=True)
    codes.append(done.returncode)
    sys.stdout.write(done.stderr)
mark("rogue.codes", json.dumps(codes))
stella_commit("rogue: edit", "rogue.txt")
mark("rogue.done")
report(summary="edited")
"""


def test_a_worker_running_tree_wide_git_beside_three_editors_loses_nobodys_work(
    git_repo: Path, tmp_path: Path, stella: StellaRunner
) -> None:
    for name in (*EDITORS, "rogue", "user"):
        (git_repo / f"{name}.txt").write_text(f"{name} original\n")
    scripts = Scripts(tmp_path / "scripts")
    write_config(
        git_repo,
        tasks={
            **{task: scripts.python(task, EDITOR) for task in EDITORS},
            "rogue": scripts.python("r", ROGUE),
        },
    )
    git("add", ".", cwd=git_repo)
    git("commit", "-q", "-m", "files", cwd=git_repo)
    (git_repo / "user.txt").write_text("the user's own edit\n")  # uncommitted, and no task's
    (git_repo / "notes.txt").write_text("the user's new file\n")  # untracked
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    marks = tmp_path / "marks"
    marks.mkdir()

    proc = stella("fleet", "--plan", str(plan), "--pipeline", "command", "--max-concurrency", "4",
                  cwd=git_repo, env={"MARKS": str(marks)})  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (marks / "rogue.codes").read_text() == "[1, 1, 1, 1, 1]"
    record = run_record(git_repo)
    assert {task["id"]: task["status"] for task in record["tasks"]} == dict.fromkeys(
        (*EDITORS, "rogue"), "succeeded"
    )
    committed = {c["task_id"]: c["sha"] for c in record["commits"]}
    for task in (*EDITORS, "rogue"):
        assert git("show", f"{committed[task]}:{task}.txt", cwd=git_repo) == f"{task}'s edit\n"
        assert git("show", "--name-only", "--format=", committed[task], cwd=git_repo).split() == [
            f"{task}.txt"
        ]
    assert (git_repo / "user.txt").read_text() == "the user's own edit\n"
    assert (git_repo / "notes.txt").read_text() == "the user's new file\n"
    assert git("stash", "list", cwd=git_repo) == ""
    log = StatePaths(git_repo).log_file(record["run"]["id"], "rogue").read_text()
    refusals = [line for line in log.splitlines() if line.startswith("stella: git ")]
    assert len(refusals) == 5 * 2, log  # each on stderr (the script prints it) and written to the log
    assert all("use stella commit" in line or "then stella commit" in line for line in refusals), refusals
    assert (
        "stella: git stash is refused in the shared tree (other workers' edits live here): use stella commit"
        in log
    )
