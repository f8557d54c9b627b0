"""The start commit step (run/steps/startcommit.py) in process: where a stacked task's worktree starts, what
is recorded of it, and what refuses it (issue 49, item 18)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.fleet import RUN, worker_context
from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome, FollowUpReason
from stellafleet.git import gitops
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptFailed, AttemptState, FollowUp, Request, RunSettings
from stellafleet.run.steps.startcommit import StartCommit
from stellafleet.run.steps.workspace import Workspaces
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run


def task(task_id: str, *deps: str, base: str = "parents") -> PlanTask:
    return PlanTask(task_id, "p", task_id, isolation="isolated", depends_on=deps, base=base)


@dataclass
class Fleet:
    root: Path
    ledger: Ledger
    base: str

    def settings(self, **fields: object) -> RunSettings:
        return RunSettings(self.root, RUN, self.base, "command", **fields)  # type: ignore[arg-type]

    def commit(self, tree: Path, name: str, text: str) -> str:
        (tree / name).write_text(text)
        git("add", name, cwd=tree)
        git("commit", "-qm", f"{name}: {text.strip()}", cwd=tree)
        return gitops.head_commit(tree)

    def isolated(self, task_id: str, files: dict[str, str], *, start: str | None = None) -> str:
        """An isolated task that succeeded with one commit of files on its branch; the branch's tip."""
        branch = f"fleet/{task_id}-abcd"
        git("switch", "-q", "-c", branch, start or self.base, cwd=self.root)
        for name, text in files.items():
            tip = self.commit(self.root, name, text)
        git("switch", "-q", "main", cwd=self.root)
        self.succeeded(task_id, branch)
        return tip

    def shared(self, task_id: str, files: dict[str, str]) -> list[str]:
        """A shared task that succeeded with one commit per file on main, recorded as its commits."""
        attempt = self.succeeded(task_id, None)
        shas = [self.commit(self.root, name, text) for name, text in files.items()]
        commits = [(sha, "work", 0) for sha in shas]
        self.ledger.commits.record(commits, run_id=RUN, task_id=task_id, attempt_id=attempt, branch=None)
        return shas

    def succeeded(self, task_id: str, branch: str | None) -> int:
        self.ledger.tasks.set_workspace(RUN, task_id, branch, None)
        attempt = self.ledger.attempts.start(RUN, task_id, pipeline="command", branch=branch)
        self.ledger.attempts.finish(attempt, AttemptEnd(AttemptOutcome.SUCCEEDED, "done"))
        return attempt

    def attempt(self, planned: PlanTask, *, follow_up: FollowUp | None = None) -> AttemptState:
        branch = f"fleet/{planned.id}-abcd"
        attempt_id = self.ledger.attempts.start(RUN, planned.id, pipeline="command", branch=branch)
        ctx = worker_context(
            self.root, task_id=planned.id, attempt_id=attempt_id, isolation="isolated", branch=branch,
            workspace=self.root.parent / f"wt-{planned.id}", base_commit=self.base,
        )  # fmt: skip
        request = Request(1, follow_up) if follow_up is not None else None
        return AttemptState(planned, threading.Event(), request, context=ctx, env=ctx.to_env())

    def start(self, planned: PlanTask, **settings: object) -> AttemptState:
        attempt = self.attempt(planned)
        StartCommit(self.settings(**settings), self.ledger).before_start(attempt)
        return attempt

    def recorded(self, attempt: AttemptState) -> tuple[str | None, list[tuple[str, str]]]:
        row = self.ledger.attempts.get(attempt.ctx.attempt_id)
        assert row is not None
        parents = [(p["task"], p["commit"]) for p in json.loads(row["start_parents_json"])]
        return row["start_commit"], parents


@contextlib.contextmanager
def _fleet(root: Path, tasks: list[PlanTask]) -> Iterator[Fleet]:
    paths = StatePaths(root)
    with Ledger.open(paths.fleet_db) as ledger:
        base = gitops.head_commit(root)
        add_run(ledger, RUN, base_commit=base, root=str(root))
        ledger.tasks.add(RUN, tasks, {t.id: n for n, t in enumerate(tasks, 1)})
        yield Fleet(root, ledger, base)


def files_at(root: Path, commit: str) -> list[str]:
    return git("ls-tree", "--name-only", commit, cwd=root).split()


DIAMOND = [task("a"), task("b", "a"), task("c", "a"), task("child", "b", "c")]


def test_item18_a_worktree_starts_at_the_built_commit_of_transitive_and_diamond_parents(
    git_repo: Path,
) -> None:
    with _fleet(git_repo, DIAMOND) as fleet:
        tips = {"a": fleet.isolated("a", {"a.txt": "a\n"})}
        tips["b"] = fleet.isolated("b", {"b.txt": "b\n"}, start=tips["a"])
        tips["c"] = fleet.isolated("c", {"c.txt": "c\n"}, start=tips["a"])
        attempt = fleet.start(DIAMOND[3])
        Workspaces(fleet.settings(), fleet.ledger).before_start(attempt)

        start = attempt.ctx.start_commit
        assert start is not None and attempt.env["STELLA_START_COMMIT"] == start
        assert files_at(git_repo, start) == ["README.md", "a.txt", "b.txt", "c.txt"]
        assert fleet.recorded(attempt) == (start, [("a", tips["a"]), ("b", tips["b"]), ("c", tips["c"])])
        worktree = attempt.ctx.workspace
        assert gitops.head_commit(worktree) == start and (worktree / "c.txt").read_text() == "c\n"
        assert git("status", "--porcelain", cwd=worktree) == ""


def test_item18_a_chain_starts_at_its_last_link(git_repo: Path) -> None:
    chain = [task("a"), task("b", "a"), task("child", "b")]
    with _fleet(git_repo, chain) as fleet:
        a = fleet.isolated("a", {"a.txt": "a\n"})
        b = fleet.isolated("b", {"b.txt": "b\n"}, start=a)
        attempt = fleet.start(chain[2])
        assert attempt.ctx.start_commit == b
        assert fleet.recorded(attempt) == (b, [("a", a), ("b", b)])


def test_item18_shared_parents_bring_their_own_commits_and_emitted_tasks_count_as_their_emitters(
    git_repo: Path,
) -> None:
    tasks = [
        PlanTask("maker", "p", "maker", expands=True),  # shared, emits "made", commits nothing itself
        PlanTask("made", "p", "made", parent="maker"),
        PlanTask("lone", "p", "lone"),
        task("child", "maker", "lone"),
    ]
    with _fleet(git_repo, tasks) as fleet:
        fleet.shared("maker", {})
        made = fleet.shared("made", {"made.txt": "made\n"})
        fleet.commit(git_repo, "someone.txt", "not a task's\n")
        lone = fleet.shared("lone", {"lone1.txt": "1\n", "lone2.txt": "2\n"})
        attempt = fleet.start(tasks[3])

        start = attempt.ctx.start_commit
        assert start is not None
        assert files_at(git_repo, start) == ["README.md", "lone1.txt", "lone2.txt", "made.txt"]
        assert fleet.recorded(attempt)[1] == [("made", made[0]), ("lone", lone[1])]


def test_item18_from_salvage_puts_the_tasks_own_work_last(git_repo: Path) -> None:
    tasks = [task("a"), task("child", "a"), task("plain", base="pinned")]
    with _fleet(git_repo, tasks) as fleet:
        a = fleet.isolated("a", {"a.txt": "a\n"})
        git("switch", "-q", "-c", "salvage", fleet.base, cwd=git_repo)
        salvaged = fleet.commit(git_repo, "half.txt", "half done\n")
        git("switch", "-q", "main", cwd=git_repo)
        points = {"child": salvaged, "plain": salvaged}

        stacked = fleet.start(tasks[1], start_points=points)
        plain = fleet.start(tasks[2], start_points=points)

        start = stacked.ctx.start_commit
        assert start is not None and files_at(git_repo, start) == ["README.md", "a.txt", "half.txt"]
        assert fleet.recorded(stacked) == (start, [("a", a), ("its salvaged work", salvaged)])
        assert plain.ctx.start_commit == salvaged and fleet.recorded(plain) == (None, [])


def test_item18_a_follow_up_keeps_its_first_start_after_its_parent_moved(git_repo: Path) -> None:
    tasks = [task("a"), task("child", "a"), task("plain", base="pinned")]
    with _fleet(git_repo, tasks) as fleet:
        a = fleet.isolated("a", {"a.txt": "a\n"})
        first = fleet.start(tasks[1])
        git("switch", "-q", "fleet/a-abcd", cwd=git_repo)
        fleet.commit(git_repo, "a.txt", "a moved on\n")
        git("switch", "-q", "main", cwd=git_repo)

        again = fleet.attempt(tasks[1], follow_up=FollowUp(FollowUpReason.CHECK, "red"))
        StartCommit(fleet.settings(), fleet.ledger).before_start(again)
        pinned = fleet.attempt(tasks[2], follow_up=FollowUp(FollowUpReason.CHECK, "red"))
        StartCommit(fleet.settings(start_points={"plain": a}), fleet.ledger).before_start(pinned)

        assert first.ctx.start_commit == a and again.ctx.start_commit == a
        assert fleet.recorded(again) == (None, [])  # the first attempt's start stays the task's
        assert pinned.ctx.start_commit is None  # a pinned task's follow-up: its worktree as it is


@pytest.mark.parametrize("case", ["gone", "conflict"])
def test_item18_a_start_that_cannot_be_built_fails_the_attempt_by_name(git_repo: Path, case: str) -> None:
    with _fleet(git_repo, DIAMOND) as fleet:
        a = fleet.isolated("a", {"a.txt": "a\n"})
        fleet.isolated("b", {"f.txt": "b\n"}, start=a)
        fleet.isolated("c", {"f.txt" if case == "conflict" else "c.txt": "c\n"}, start=a)
        if case == "gone":
            git("branch", "-q", "-D", "fleet/b-abcd", cwd=git_repo)
        with pytest.raises(AttemptFailed) as failed:
            fleet.start(DIAMOND[3])
        said = {
            "gone": "the branch fleet/b-abcd of b is gone: restore it, or resume the run once it ends to run "
            "it again",
            "conflict": "parents b and c both change f.txt",
        }
        assert failed.value.end.reason == f"cannot start from its dependencies' work: {said[case]}"
        assert not (git_repo.parent / "wt-child").exists()
