"""The restack of stacked tasks after their parent's branch moved (run/restack.py), in process: what it
records, and a restack killed between moving a child's branch and its worktree, finished by the next command
(issue 49, items 5 and 18)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.fleet import wait_for
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.run.restack import restack_children
from stellafleet.run.steps import RunSettings
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN_ID = "r-20261207-041500-abcd"


@dataclass
class Stack:
    """p <- c <- g, each an isolated task with its own worktree; p's branch then moved (a fix-up)."""

    root: Path
    base: str
    old_p: str
    new_p: str

    def settings(self) -> RunSettings:
        return RunSettings(self.root, RUN_ID, self.base, default_pipeline="command")

    def branch(self, task: str) -> str:
        return f"fleet/{task}-abcd"

    def worktree(self, task: str) -> Path:
        return self.root.parent / f"wt-{task}"

    def tip(self, task: str) -> str:
        return git("rev-parse", self.branch(task), cwd=self.root).strip()

    def record(self) -> dict[str, object]:
        with Ledger.open(StatePaths(self.root).fleet_db, readonly=True) as ledger:
            return ledger.get_run(RUN_ID)


def _commit(tree: Path, name: str, text: str) -> str:
    (tree / name).write_text(text)
    git("add", name, cwd=tree)
    git("commit", "-qm", f"{name}: {text.strip()}", cwd=tree)
    return git("rev-parse", "HEAD", cwd=tree).strip()


CHAIN = (("c", "p", "c.txt"), ("g", "c", "g.txt"))  # (task, its parent, the file it writes)


def _stack(root: Path, children: tuple[tuple[str, str, str], ...] = CHAIN) -> Stack:
    base = _commit(root, "work.txt", "broken\n")
    tips: dict[str, str] = {}
    starts = {"p": base}
    parents: dict[str, list[tuple[str, str]]] = {"p": []}
    for task, parent, name in (("p", None, "p.txt"), *children):
        start = tips[parent] if parent else base
        if parent:
            starts[task] = start
            parents[task] = [*parents[parent], (parent, tips[parent])]
        tree = root.parent / f"wt-{task}"
        git("worktree", "add", "-q", "-b", f"fleet/{task}-abcd", str(tree), start, cwd=root)
        tips[task] = _commit(tree, name, f"{task}\n")
    new_p = _commit(root.parent / "wt-p", "work.txt", "fixed\n")  # the fix-up round's commit
    tasks = [
        sample_task("p", isolation="isolated"),
        *(sample_task(t, isolation="isolated", base="parents", depends_on=(p,)) for t, p, _ in children),
    ]
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(root))
        ledger.tasks.add(RUN_ID, tasks, {task.id: n for n, task in enumerate(tasks, 1)})
        for task in tasks:
            branch = f"fleet/{task.id}-abcd"
            ledger.tasks.set_workspace(RUN_ID, task.id, branch, str(root.parent / f"wt-{task.id}"))
            attempt = ledger.attempts.start(RUN_ID, task.id, pipeline="command", branch=branch)
            if task.id != "p":
                ledger.attempts.set_start(attempt, starts[task.id], parents[task.id])
            ledger.attempts.finish(attempt, AttemptEnd(AttemptOutcome.SUCCEEDED, "committed"))
    return Stack(root, base, tips["p"], new_p)


def _stale_requests(stack: Stack) -> list[tuple[str, str]]:
    requests = stack.record()["requests"]
    assert isinstance(requests, list)
    return [(r["task_id"], r["state"]) for r in requests if r["reason"] == "stale"]


def _tasks(stack: Stack) -> dict[str, dict[str, object]]:
    tasks = stack.record()["tasks"]
    assert isinstance(tasks, list)
    return {task["id"]: task for task in tasks}


def test_item18_a_restack_replays_each_child_and_records_its_start_parents_and_commits(
    git_repo: Path,
) -> None:
    stack = _stack(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        notes = restack_children(stack.settings(), ledger, "p", stack.old_p)

    assert [note.split(":")[0] for note in notes] == [
        "restacked c onto p's new work",
        "restacked g onto p's new work",
    ]
    record = stack.record()
    starts = {a["task_id"]: a for a in record["attempts"]}  # type: ignore[union-attr]
    new_c, new_g = stack.tip("c"), stack.tip("g")
    assert starts["c"]["start_commit"] == stack.new_p
    assert json.loads(starts["c"]["start_parents_json"]) == [{"task": "p", "commit": stack.new_p}]
    assert starts["g"]["start_commit"] == new_c  # a chain's start is its last link
    assert json.loads(starts["g"]["start_parents_json"]) == [
        {"task": "p", "commit": stack.new_p},
        {"task": "c", "commit": new_c},
    ]
    commits = {(row["task_id"], row["sha"]) for row in record["commits"]}  # type: ignore[union-attr]
    assert {("c", new_c), ("g", new_g)} <= commits
    # each branch holds its own work once, on the fix; each checkout followed its branch
    assert git("log", "--format=%s", f"{stack.new_p}..{new_g}", cwd=git_repo).splitlines() == [
        "g.txt: g",
        "c.txt: c",
    ]
    for task in ("c", "g"):
        assert (stack.worktree(task) / "work.txt").read_text() == "fixed\n"
        assert git("status", "--porcelain", cwd=stack.worktree(task)) == ""
    assert {task: row["stale"] for task, row in _tasks(stack).items()} == {"p": None, "c": None, "g": None}
    # both were stale, waiting on a person, before either moved; both requests are over
    assert _stale_requests(stack) == [("c", "dismissed"), ("g", "dismissed")]


def test_item18_children_that_cannot_be_restacked_keep_their_branches_and_do_not_stop_the_rest(
    git_repo: Path,
) -> None:
    """c rewrites the file p's fix rewrites (its own work conflicts), so g's parents' work conflicts (p's
    new work and c's, unchanged); s, after both in the plan, is restacked all the same."""
    stack = _stack(git_repo, (("c", "p", "work.txt"), ("g", "c", "g.txt"), ("s", "p", "s.txt")))
    old = {task: stack.tip(task) for task in ("c", "g")}
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        notes = restack_children(stack.settings(), ledger, "p", stack.old_p)

    left = "is stale (p changed after it started) and its branch is left as it was"
    assert notes[:2] == [
        f"c {left}: its own work would conflict with the new start on work.txt",
        f"g {left}: parents p and c both change work.txt",
    ]
    assert notes[2].startswith("restacked s onto p's new work")
    assert {task: stack.tip(task) for task in ("c", "g")} == old
    assert git("merge-base", "--is-ancestor", stack.new_p, stack.tip("s"), cwd=git_repo) == ""
    stale = {task: row["stale"] for task, row in _tasks(stack).items()}
    assert stale == {
        "p": None,
        "c": "p changed after it started",
        "g": "p changed after it started",
        "s": None,
    }
    waiting = [task for task, state in _stale_requests(stack) if state == "needs_you"]
    assert waiting == ["c", "g"]


def test_item18_a_restack_of_a_task_with_no_worktree_moves_its_branch_alone(git_repo: Path) -> None:
    stack = _stack(git_repo)
    git("worktree", "remove", "--force", str(stack.worktree("g")), cwd=git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        restack_children(stack.settings(), ledger, "p", stack.old_p)
    assert git("merge-base", "--is-ancestor", stack.tip("c"), stack.tip("g"), cwd=git_repo) == ""
    assert git("show", f"{stack.branch('g')}:work.txt", cwd=git_repo) == "fixed\n"


def test_item18_a_restack_names_a_branch_that_is_gone(git_repo: Path) -> None:
    stack = _stack(git_repo)
    git("worktree", "remove", "--force", str(stack.worktree("c")), cwd=git_repo)
    git("branch", "-q", "-D", stack.branch("c"), cwd=git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        notes = restack_children(stack.settings(), ledger, "p", stack.old_p)

    left = "is stale (p changed after it started) and its branch is left as it was"
    assert notes == [
        f"c {left}: its branch is gone",
        f"g {left}: cannot start from its dependencies' work: the branch fleet/c-abcd of c is gone: restore "
        "it, or resume the run once it ends to run it again",
    ]


RESTACK = """
import sys
from pathlib import Path
from stellafleet.core.paths import StatePaths
from stellafleet.run.restack import restack_children
from stellafleet.run.steps import RunSettings
from stellafleet.state.ledger import Ledger

root, run_id, base, old = Path(sys.argv[1]), *sys.argv[2:]
with Ledger.open(StatePaths(root).fleet_db) as ledger:
    restack_children(RunSettings(root, run_id, base, default_pipeline="command"), ledger, "p", old)
"""


def _hold_at_branch_moved(root: Path, branch: str, entered: Path) -> None:
    """A reference-transaction hook that holds, once the branch's ref has moved, the process moving it."""
    hook = root / ".git" / "hooks" / "reference-transaction"
    hook.write_text(
        "#!/bin/sh\nlines=$(cat)\n"
        f'if [ "$1" = committed ] && [ ! -e {entered} ]; then\n'
        f'  case "$lines" in *refs/heads/{branch}*) touch {entered}; while :; do sleep 0.02; done;; esac\n'
        "fi\n"
    )
    hook.chmod(0o755)


def test_item5_a_restack_killed_after_moving_a_childs_branch_is_finished_by_the_next_command(
    git_repo: Path, tmp_path: Path
) -> None:
    stack = _stack(git_repo)
    entered = tmp_path / "entered"
    _hold_at_branch_moved(git_repo, stack.branch("c"), entered)
    args = [sys.executable, "-c", RESTACK, str(git_repo), RUN_ID, stack.base, stack.old_p]
    proc = subprocess.Popen(args, start_new_session=True)
    try:
        wait_for(entered, timeout=30, process=proc)
        # every affected child is stale, waiting on a person, before any of them moves
        assert {task: row["stale"] for task, row in _tasks(stack).items() if row["stale"]} == {
            "c": "p changed after it started",
            "g": "p changed after it started",
        }
        assert _stale_requests(stack) == [("c", "needs_you"), ("g", "needs_you")]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # what the kill left: c's branch moved, its checkout not (a staged revert of p's fix), g untouched
    assert git("status", "--porcelain", "--untracked-files=no", cwd=stack.worktree("c")) != ""
    (git_repo / ".git" / "hooks" / "reference-transaction").unlink()

    journal.recover(git_repo)

    for task in ("c", "g"):
        tree = stack.worktree(task)
        assert git("status", "--porcelain", cwd=tree) == "", task
        assert (tree / "work.txt").read_text() == "fixed\n"
        assert git("rev-parse", "HEAD", cwd=tree).strip() == stack.tip(task)
    assert git("merge-base", "--is-ancestor", stack.tip("c"), stack.tip("g"), cwd=git_repo) == ""
    attempts = {a["task_id"]: a for a in stack.record()["attempts"]}  # type: ignore[union-attr]
    assert attempts["c"]["start_commit"] == stack.new_p and attempts["g"]["start_commit"] == stack.tip("c")
    assert {task: row["stale"] for task, row in _tasks(stack).items()} == {"p": None, "c": None, "g": None}
    assert {task for task, _ in _stale_requests(stack)} == {"c", "g"}
    assert {state for _, state in _stale_requests(stack)} == {"dismissed"}  # none waits on a person now
    assert not list(StatePaths(git_repo).journal.glob("restack-*.json"))
