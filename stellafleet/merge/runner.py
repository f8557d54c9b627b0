"""`stella merge`: land a run's green branches on the current branch as a train of batches (docs/merge.md,
merge/batch.py); each result is checked in a scratch worktree before the ref moves (compare-and-swap): HEAD
never points at unchecked work."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from stellafleet.ci.openprs import open_pull_requests
from stellafleet.core.errors import EXIT_USAGE, GitError, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CheckPhase, MergeStatus
from stellafleet.core.words import files_named, plural
from stellafleet.git import gitops, mergeops, salvage, worktrees
from stellafleet.git.keptree import KeptTree
from stellafleet.merge import journal as merge_journal
from stellafleet.merge.batch import Fixing, Train
from stellafleet.merge.journal import Journal
from stellafleet.merge.options import MergeOptions, MergeResult, Progress, Resolving, Say
from stellafleet.merge.queue import MergeItem, plan_queue
from stellafleet.run import bootstrap, checking
from stellafleet.run.checking import CheckRun
from stellafleet.state.journal import recover
from stellafleet.state.ledger import Ledger

STRATEGIES = ("rebase", "merge")
MERGE_TAIL_BYTES = 8000  # of each check's output, kept in the ledger


def _refuse_unless_ready(root: Path, options: MergeOptions) -> str:
    """The checked-out branch to land on; StellaError (exit 2) when there is none or the tree is dirty."""
    if options.strategy not in STRATEGIES:
        raise StellaError(
            f"unknown merge strategy {options.strategy!r}: use rebase or merge", exit_code=EXIT_USAGE
        )
    branch = gitops.current_branch(root)
    if branch is None:
        raise StellaError(
            "stella merge lands branches on the checked-out branch, but HEAD is detached: "
            "check out a branch first",
            exit_code=EXIT_USAGE,
        )
    refusal = None if options.dry_run else dirty_refusal(root)  # a dry run says it (MergeResult.refusal)
    if refusal is not None:
        raise StellaError(refusal, exit_code=EXIT_USAGE)
    return branch


def dirty_refusal(root: Path) -> str | None:
    """Why stella merge refuses this work tree (its uncommitted changes: the user's, or what a failed
    task left, which `stella restore` puts back); None: it does not."""
    dirty = [line[3:] for line in gitops.status_porcelain(root, untracked="no")]
    left = salvage.leftovers(root, dirty)
    yours = [path for path in dirty if path not in left]
    said = []
    if yours:
        said.append(f"your work tree has uncommitted changes ({files_named(yours)}): commit or stash them")
    if left:
        named = salvage.leftovers_said(left)
        said.append(
            f"your work tree holds a failed task's leftovers, not changes of yours ({named}): "
            "`stella restore` puts them back to HEAD (their salvage refs keep them)"
        )
    return "; ".join(said) + " before stella merge" if said else None


def merge_run(
    root: Path,
    options: MergeOptions,
    *,
    progress: Progress | None = None,
    make_resolver: Callable[[Ledger, str], Resolving] | None = None,
    make_fixer: Callable[[Ledger, str], Fixing] | None = None,
    say: Say | None = None,
) -> MergeResult:
    """Run the merge queue (or, with dry_run, say what it would do) for one run of the ledger."""
    recover(root)  # a killed merge's half-done step first: it decides what is clean
    onto = _refuse_unless_ready(root, options)
    db = StatePaths(root).fleet_db
    if not db.exists():
        raise StellaError(f"no fleet has run in {root} yet: nothing to merge", exit_code=EXIT_USAGE)
    held = contextlib.nullcontext(None) if options.dry_run else merge_journal.holding(root)
    with held as journal, Ledger.open(db, readonly=options.dry_run) as ledger:
        run_id = ledger.runs.resolve(options.run_ref)
        run = ledger.get_run(run_id)
        tips = gitops.branch_tips(root, [task["branch"] for task in run["tasks"] if task.get("branch")])
        queue, left_out = plan_queue(run, unwatched=options.unwatched, tips=tips)
        tip = gitops.head_commit(root)
        result = MergeResult(run_id, onto, options, tip, tip, queue, left_out)
        resolver = make_resolver(ledger, run_id) if make_resolver and not options.dry_run else None
        queue_run = _Queue(root, ledger, result, progress or (lambda item: None), resolver, journal)
        if options.dry_run:
            result.refusal = dirty_refusal(root)
            queue_run.preview()
        else:
            fixer = make_fixer(ledger, run_id) if make_fixer and options.fix_rounds else None
            Train(queue_run, fixer, say or (lambda line: None)).run_rounds()
            landed = [item.branch for item in queue if item.status == MergeStatus.MERGED]
            result.open_prs = open_pull_requests(run, landed)
    return result


class _Queue:
    """One pass through the queue, holding the tip the next branch lands on."""

    def __init__(
        self,
        root: Path,
        ledger: Ledger,
        result: MergeResult,
        progress: Progress,
        resolver: Resolving | None,
        journal: Journal | None = None,
    ) -> None:
        self.resolver = resolver
        self.journal = journal or Journal(None)  # a dry run changes nothing, so it journals nothing
        self.root = root
        self.ledger = ledger
        self.result = result
        self.options = result.options
        self.progress = progress
        self.tip = result.start_sha
        self.not_landed: set[str] = set()
        self.slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(1, self.options.parallel_checks + 1):
            self.slots.put(slot)

    def _skipped(self, item: MergeItem) -> bool:
        """Whether item cannot be tried at all (gone, its dependency did not land, already in): SKIPPED."""
        item.head = gitops.ref_commit(self.root, item.branch)
        missing = [dep for dep in item.after if dep in self.not_landed]
        if item.head is None:
            item.reason = f"branch {item.branch} no longer exists (cleaned up?)"
        elif missing:
            item.reason = f"depends on {', '.join(missing)}, which did not land"
        elif mergeops.contains(self.root, self.tip, item.head):
            item.status, item.reason = MergeStatus.SKIPPED, f"already in {self.result.onto}"
            return True
        else:
            return False
        item.status = MergeStatus.SKIPPED
        self.not_landed.add(item.task_id)
        return True

    def preview(self) -> None:
        for item in self.result.queue:
            if not self._skipped(item):
                checks = " then ".join(f"`{c}`" for c in (item.check, self.options.check) if c)
                self._predict(item, f" and run {checks}" if checks else " (no check command)")
            self.progress(item)

    def _predict(self, item: MergeItem, check: str) -> None:
        """A dry run's word on one branch: would it conflict (as far as a merge can tell), else what
        would be done; a clean one is merged in the object store only, for the next to build on."""
        assert item.head is not None
        onto = self.result.onto
        own_from = mergeops.landed_as_other_commits(self.root, self.tip, item.head, item.start)
        simulated, files = mergeops.predict_merge(self.root, self.tip, item.head, own_from)
        if files:
            item.files = list(files)
            item.reason = f"would conflict with {onto} in {', '.join(files)}"
            self.not_landed.add(item.task_id)
            return
        commits = plural(gitops.commits_ahead(self.root, own_from or self.tip, item.head), "commit")
        item.reason = f"would {self.options.strategy} {commits} onto {onto}{check}"
        self.tip = simulated or self.tip

    @contextlib.contextmanager
    def scratch_tree(self) -> Iterator[Path]:
        """The detached worktree each batch is built in, removed at the end whatever happened."""
        scratch = Path(tempfile.mkdtemp(prefix="stella-merge-"))
        worktree = scratch / "tree"
        self.journal.note(scratch=str(scratch), worktree=str(worktree))
        worktrees.worktree_add(self.root, worktree, None, self.tip)  # detached: no branch is made
        try:
            yield worktree
        finally:
            with contextlib.suppress(GitError):  # the scratch goes below in any case
                worktrees.worktree_remove(self.root, worktree, force=True)
            shutil.rmtree(scratch, ignore_errors=True)
            self.result.end_sha = self.tip

    def _check(self, members: Sequence[MergeItem], head: str, merge_id: int) -> CheckRun | None:
        """Each member task's own check (each command once, recorded as the first member's whose check it
        is, under that task's leases), then --check (as the last member's), on head in a kept check tree
        (git/keptree.py), each a ledger row of the merge step; the first red one (None: all passed, or none
        to run)."""
        owners: dict[tuple[str, float | None], MergeItem] = {}
        for member in members:
            if member.check:
                owners.setdefault((member.check, member.check_timeout), member)
        item = members[-1]
        planned = [(owner, command, timeout) for (command, timeout), owner in owners.items()]
        planned += [(item, self.options.check, None)] if self.options.check else []
        if not planned:
            return None
        self.result.check_runs += 1
        env = {
            **checking.check_env(os.environ),
            "STELLA_MERGE_BRANCH": item.branch,
            "STELLA_MERGE_TASK": item.task_id,
            "STELLA_MERGE_ROOT": str(self.root),  # the user's tree
        }
        log = StatePaths(self.root).private / "logs" / self.result.run_id / f"merge-{merge_id}.log"
        runs: list[CheckRun] = []
        slot = self.slots.get()  # one kept tree per check running at once
        try:
            kept = self._kept_tree(slot, env, log)
            with kept.held():
                for n, (owner, command, timeout) in enumerate(planned, 1):
                    check = checking.Command(
                        command, timeout or self.options.check_timeout, log.with_suffix(f".check-{n}.log")
                    )
                    row = checking.CheckRow(
                        self.result.run_id,
                        owner.task_id,
                        CheckPhase.MERGE,
                        merge_id=owner.merge_id or merge_id,
                    )
                    try:
                        kept.move_to(head)
                    except bootstrap.SetupFailed as exc:
                        failed = checking.not_run(command, f"its check tree: {exc}", head)
                        runs.append(checking.recorded(self.ledger, row, failed, log))
                        break
                    runs += checking.run_and_record(
                        self.ledger, row, [check], head, tree=kept.path, root=self.root, env=env,
                        log_path=log, tail_bytes=MERGE_TAIL_BYTES,
                    )  # fmt: skip
                    if not runs[-1].passed:
                        break
        finally:
            self.slots.put(slot)
        lines = self.options.check_tail_lines
        tail = "\n".join("\n".join(run.tail.rstrip().splitlines()[-lines:]) for run in runs)
        for member in members:  # each lands (or not) with the output of the check it was in
            member.check_tail = tail
        return None if runs[-1].passed else runs[-1]

    def _kept_tree(self, slot: int, env: dict[str, str], log: Path) -> KeptTree:
        """The check tree of one slot, kept between checks and merges: moved with one checkout, readied
        as every new worktree is when made (and when a `[worktree] setup_inputs` file changed)."""
        config = self.options.worktree

        def ready(path: Path) -> None:
            bootstrap.ready(
                path, config, env, log, None, root=self.root, init_submodules=self.options.init_submodules
            )

        path = StatePaths(self.root).private / "merge-trees" / f"check-{slot}"
        return KeptTree(self.root, path, ready=ready, setup_inputs=config.setup_inputs or ())

    def _apply(self, item: MergeItem, worktree: Path, onto: str) -> mergeops.StepResult:
        """One branch rebased (or merged) onto `onto` in the batch's tree: the new head, or its conflict."""
        assert item.head is not None
        mergeops.checkout_detached(worktree, onto)
        if self.options.strategy == "rebase":
            upstream = mergeops.rebase_upstream(self.root, onto, item.head, item.start)
            return mergeops.rebase_onto(worktree, onto, upstream, item.head)
        message = f"Merge {item.branch} (task {item.task_id}, run {self.result.run_id})"
        own_from = mergeops.landed_as_other_commits(self.root, onto, item.head, item.start)
        if own_from is not None:
            return mergeops.merge_from(worktree, onto, own_from, item.head, message)
        return mergeops.merge_commit(worktree, item.head, message)

    def _advance(self, members: Sequence[MergeItem], new: str) -> None:
        """Move the user's branch to new, after making sure nothing changed under us meanwhile; every member
        recorded merged in one transaction."""
        onto = self.result.onto
        if gitops.current_branch(self.root) != onto or gitops.ref_commit(self.root, onto) != self.tip:
            raise GitError(f"{onto} moved or was switched away from while merging: stopped before landing")
        if gitops.status_porcelain(self.root, untracked="no"):
            raise GitError("the work tree got uncommitted changes while merging: stopped before landing")
        for item in members:
            assert item.head is not None
            if not mergeops.contains(self.root, new, item.head):
                raise GitError(f"the result {new[:12]} does not hold {item.branch}'s commits: not landed")
        self.journal.note(landing={"onto": onto, "old": self.tip, "new": new})
        mergeops.advance_branch(self.root, onto, new, self.tip)
        self.tip = new
        checked = " (check passed)" if self.options.check else ""
        for item in members:
            item.after_sha, item.status = new, MergeStatus.MERGED
            item.reason = f"landed on {onto} at {new[:12]}{checked}" + item.reason
        self.ledger.merges.land(
            [(m.merge_id or 0, m.reason, m.check_tail or None, m.files) for m in members], new
        )
        self.journal.note(landing=None)

    def _start_row(self, item: MergeItem, batch_id: int | None = None) -> int:
        return self.ledger.merges.start(
            run_id=self.result.run_id,
            task_id=item.task_id,
            branch=item.branch,
            position=item.position,
            strategy=self.options.strategy,
            onto_ref=self.result.onto,
            before_sha=item.before_sha or self.tip,
            check_command=self.options.check,
            batch_id=batch_id,
        )

    def _record(self, item: MergeItem, merge_id: int | None) -> None:
        if merge_id is None:
            merge_id = self._start_row(item)
        self.ledger.merges.finish(
            merge_id,
            item.status,
            after_sha=item.after_sha,
            reason=item.reason,
            files=item.files,
            check_tail=item.check_tail or None,  # a passing check's output is kept too
        )
