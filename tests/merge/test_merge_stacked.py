"""`stella merge` of stacked branches (base = "parents") in process: each lands from its recorded start, and
a green CI row counts only for the commit it names (issue 49, items 4 and 6)."""

from __future__ import annotations

from pathlib import Path

from helpers.repo import git

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CIState, MergeStatus
from stellafleet.merge.runner import MergeOptions, merge_run
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, sample_task

RUN_ID = "r-20261207-040000-abcd"
CHAIN = ("c1", "c2", "c3")


def _append_on(root: Path, branch: str, start: str, line: str) -> str:
    """A branch from start with one commit appending line to chain.txt; its tip."""
    git("switch", "-q", "-c", branch, start, cwd=root)
    with (root / "chain.txt").open("a") as chain:
        chain.write(f"{line}\n")
    git("commit", "-qam", f"{branch}: {line}", cwd=root)
    tip = git("rev-parse", "HEAD", cwd=root).strip()
    git("switch", "-q", "main", cwd=root)
    return tip


def _chain_run(root: Path) -> dict[str, str]:
    """c1 <- c2 <- c3 as a stacked fleet leaves them (each started at its parent's tip), CI green on each
    tip; their heads."""
    (root / "chain.txt").write_text("start\n")
    git("add", "chain.txt", cwd=root)
    git("commit", "-qm", "chain", cwd=root)
    base = git("rev-parse", "HEAD", cwd=root).strip()
    heads: dict[str, str] = {}
    start = base
    for task in CHAIN:
        heads[task] = _append_on(root, f"fleet/{task}-abcd", start, task)
        start = heads[task]
    tasks = [
        sample_task(t, isolation="isolated", base="parents", depends_on=(p,) if p else ())
        for t, p in zip(CHAIN, (None, *CHAIN[:-1]), strict=True)
    ]
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        add_run(ledger, RUN_ID, base_commit=base, root=str(root))
        ledger.tasks.add(RUN_ID, tasks, {t.id: n for n, t in enumerate(tasks, 1)})
        for task, parent in zip(CHAIN, (None, *CHAIN[:-1]), strict=True):
            branch = f"fleet/{task}-abcd"
            ledger.tasks.set_workspace(RUN_ID, task, branch, None)
            attempt = ledger.attempts.start(RUN_ID, task, pipeline="command", branch=branch)
            started = heads[parent] if parent else base
            ledger.attempts.set_start(attempt, started, [(parent, started)] if parent else [])
            ledger.tasks.set_status(RUN_ID, task, "succeeded")
            ledger.ci.upsert(
                run_id=RUN_ID, branch=branch, task_id=task, head_sha=heads[task], pr_url=None,
                pr_number=None, state=CIState.GREEN, conclusion=None, reason=None, run_urls=[],
            )  # fmt: skip
        ledger.runs.finish(RUN_ID, "succeeded", exit_code=0)
    return heads


def test_item4_a_stacked_chain_lands_whole_after_main_moved(git_repo: Path) -> None:
    _chain_run(git_repo)
    (git_repo / "other.txt").write_text("unrelated\n")
    git("add", "other.txt", cwd=git_repo)
    git("commit", "-qm", "an unrelated commit on main", cwd=git_repo)

    result = merge_run(git_repo, MergeOptions())

    assert [(item.task_id, item.status) for item in result.queue] == [
        (task, MergeStatus.MERGED) for task in CHAIN
    ], [item.reason for item in result.queue]
    assert (git_repo / "chain.txt").read_text() == "start\nc1\nc2\nc3\n"
    # each task's own commit, once: the copies of its parents' work dropped out
    assert git("log", "--format=%s", "-4", cwd=git_repo).split("\n")[:4] == [
        "fleet/c3-abcd: c3",
        "fleet/c2-abcd: c2",
        "fleet/c1-abcd: c1",
        "an unrelated commit on main",
    ]


def test_item4_a_stacked_branch_whose_parent_did_not_land_brings_its_parents_work(git_repo: Path) -> None:
    """Its recorded start is not in main: it is rebased from its merge base, its parent's commits with it."""
    _chain_run(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        ledger.ci.upsert(
            run_id=RUN_ID, branch="fleet/c2-abcd", task_id="c2", head_sha=None, pr_url=None,
            pr_number=None, state=CIState.RED, conclusion="failure", reason=None, run_urls=[],
        )  # fmt: skip

    result = merge_run(git_repo, MergeOptions())

    assert [(item.task_id, item.status) for item in result.queue] == [
        ("c1", MergeStatus.MERGED),
        ("c3", MergeStatus.MERGED),
    ]
    assert (git_repo / "chain.txt").read_text() == "start\nc1\nc2\nc3\n"


def test_item6_green_ci_counts_only_for_the_commit_it_names(git_repo: Path) -> None:
    heads = _chain_run(git_repo)
    git("switch", "-q", "fleet/c3-abcd", cwd=git_repo)
    (git_repo / "later.txt").write_text("a commit after CI passed\n")
    git("add", "later.txt", cwd=git_repo)
    git("commit", "-qm", "later", cwd=git_repo)
    tip = git("rev-parse", "HEAD", cwd=git_repo).strip()
    git("switch", "-q", "main", cwd=git_repo)

    result = merge_run(git_repo, MergeOptions())

    assert [item.task_id for item in result.queue] == ["c1", "c2"]
    assert result.count(MergeStatus.MERGED) == 2
    assert [(item.task_id, item.reason) for item in result.left_out] == [
        ("c3", f"CI passed on {heads['c3'][:7]}, not on the tip {tip[:7]}: watch it again")
    ]
    assert not (git_repo / "later.txt").exists()


def test_item5_a_stale_stacked_branch_is_left_out(git_repo: Path) -> None:
    """A child a restack left stale (its parent moved, its branch did not follow) is not landed."""
    _chain_run(git_repo)
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        ledger.tasks.set_stale(RUN_ID, "c3", "c2 changed after it started")

    result = merge_run(git_repo, MergeOptions(unwatched=True))

    assert [item.task_id for item in result.queue] == ["c1", "c2"]
    assert [(item.task_id, item.reason) for item in result.left_out] == [
        (
            "c3",
            "stale: c2 changed after it started, its branch was not restacked onto that "
            "(`stella runs` says why)",
        )
    ]


def _ci(root: Path, heads: dict[str, str], state: CIState, *tasks: str) -> None:
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        for task in tasks:
            ledger.ci.upsert(
                run_id=RUN_ID, branch=f"fleet/{task}-abcd", task_id=task, head_sha=heads[task], pr_url=None,
                pr_number=None, state=state, conclusion=None, reason=None, run_urls=[],
            )  # fmt: skip


def test_a_stacked_chain_whose_parent_landed_rebased_lands_by_merge_commits(git_repo: Path) -> None:
    """c1 landed rebased (main had moved) while c2 and c3 waited on CI; `--strategy merge` merges only their
    own work, not c1's original commit again (which conflicted in chain.txt), and the dry run says so."""
    heads = _chain_run(git_repo)
    (git_repo / "other.txt").write_text("unrelated\n")
    git("add", "other.txt", cwd=git_repo)
    git("commit", "-qm", "an unrelated commit on main", cwd=git_repo)
    _ci(git_repo, heads, CIState.PENDING, "c2", "c3")
    assert [item.task_id for item in merge_run(git_repo, MergeOptions()).queue] == ["c1"]
    _ci(git_repo, heads, CIState.GREEN, "c2", "c3")

    dry = merge_run(git_repo, MergeOptions(strategy="merge", dry_run=True))
    assert [item.reason for item in dry.queue][1:] == [
        "would merge 1 commit onto main (no check command)",
        "would merge 1 commit onto main (no check command)",
    ]
    result = merge_run(git_repo, MergeOptions(strategy="merge"))

    assert [(item.task_id, item.status) for item in result.queue][1:] == [
        ("c2", MergeStatus.MERGED),
        ("c3", MergeStatus.MERGED),
    ], [item.reason for item in result.queue]
    assert (git_repo / "chain.txt").read_text() == "start\nc1\nc2\nc3\n"
    assert git("rev-parse", "HEAD^2", cwd=git_repo).strip() == heads["c3"]  # merge commits of the branches
