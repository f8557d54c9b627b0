"""`stella merge`: land a run's green branches on the current branch one at a time (docs/merge.md); each is
checked in a scratch worktree before the ref moves (compare-and-swap): HEAD never points at unchecked work."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stellafleet.ci.openprs import open_pull_requests
from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE, GitError, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CheckPhase, MergeStatus
from stellafleet.core.words import files_named, plural
from stellafleet.git import gitops, mergeops, salvage, worktrees
from stellafleet.merge import journal as merge_journal
from stellafleet.merge.journal import Journal
from stellafleet.merge.queue import MergeItem, plan_queue
from stellafleet.merge.resolve import Resolution
from stellafleet.run import checking
from stellafleet.run.checking import CheckRun
from stellafleet.state.journal import recover
from stellafleet.state.ledger import Ledger

STRATEGIES = ("rebase", "merge")
FAILED = (MergeStatus.CONFLICT, MergeStatus.CHECK_FAILED, MergeStatus.ERROR)
MERGE_TAIL_BYTES = 8000  # of each check's output, kept in the ledger


@dataclass(frozen=True)
class MergeOptions:
    """What `stella merge` was asked to do: the command line over [merge] in the config."""

    run_ref: str | None = None
    dry_run: bool = False
    unwatched: bool = False
    strategy: str = "rebase"
    check: str | None = None
    check_timeout: float = 1800.0
    check_tail_lines: int = 20
    worktree: WorktreeConfig = field(default_factory=WorktreeConfig)  # how each check tree is readied
    init_submodules: bool = True  # [fleet] init_submodules: each check tree gets the main tree's submodules


@dataclass
class MergeResult:
    run_id: str
    onto: str
    options: MergeOptions
    start_sha: str
    end_sha: str
    queue: list[MergeItem] = field(default_factory=list)
    left_out: list[MergeItem] = field(default_factory=list)
    open_prs: dict[str, int] = field(default_factory=dict)  # branch landed here -> the PR --watch opened
    refusal: str | None = None  # --dry-run: why the real merge will refuse to start

    @property
    def exit_code(self) -> int:
        if self.refusal is not None:
            return EXIT_USAGE
        return EXIT_TASK_FAILED if any(item.status in FAILED for item in self.queue) else EXIT_OK

    def count(self, status: MergeStatus) -> int:
        return sum(1 for item in self.queue if item.status == status)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "onto": self.onto,
            "strategy": self.options.strategy,
            "check": self.options.check,
            "dry_run": self.options.dry_run,
            "start_sha": self.start_sha,
            "end_sha": self.end_sha,
            "exit_code": self.exit_code,
            "queue": [item.to_json() for item in self.queue],
            "left_out": [item.to_json() for item in self.left_out],
            "open_prs": [{"branch": branch, "pr_number": n} for branch, n in self.open_prs.items()],
            "refusal": self.refusal,
        }


Progress = Callable[[MergeItem], None]


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


class Resolving(Protocol):
    """--resolve: hands a conflicting branch to a worker (merge/resolve.py's Resolver)."""

    def resolve(
        self, item: MergeItem, onto: str, tip: str, files: tuple[str, ...], diff: str, journal: Journal
    ) -> Resolution: ...


def merge_run(
    root: Path,
    options: MergeOptions,
    *,
    progress: Progress | None = None,
    make_resolver: Callable[[Ledger, str], Resolving] | None = None,
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
        queue, left_out = plan_queue(run, unwatched=options.unwatched)
        tip = gitops.head_commit(root)
        result = MergeResult(run_id, onto, options, tip, tip, queue, left_out)
        resolver = make_resolver(ledger, run_id) if make_resolver and not options.dry_run else None
        queue_run = _Queue(root, ledger, result, progress or (lambda item: None), resolver, journal)
        if options.dry_run:
            result.refusal = dirty_refusal(root)
            queue_run.preview()
        else:
            queue_run.run()
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

    def _skipped(self, item: MergeItem) -> bool:
        """Whether item cannot be tried at all (gone, its dependency did not land, already in): SKIPPED."""
        item.head = gitops.ref_commit(self.root, item.branch)
        missing = [dep for dep in item.after if dep in self.not_landed]
        if item.head is None:
            item.reason = f"branch {item.branch} no longer exists (cleaned up?)"
        elif missing:
            item.reason = f"depends on {', '.join(missing)}, which did not land"
        elif gitops.is_ancestor(self.root, item.head, self.tip) or mergeops.patches_upstream(
            self.root, self.tip, item.head
        ):
            item.status, item.reason = MergeStatus.SKIPPED, f"already in {self.result.onto}"
            return True
        else:
            return False
        item.status = MergeStatus.SKIPPED
        self.not_landed.add(item.task_id)
        return True

    def preview(self) -> None:
        check = f" and run `{self.options.check}`" if self.options.check else " (no check command)"
        for item in self.result.queue:
            if not self._skipped(item):
                self._predict(item, check)
            self.progress(item)

    def _predict(self, item: MergeItem, check: str) -> None:
        """A dry run's word on one branch: would it conflict (as far as a merge can tell), else what
        would be done; a clean one is merged in the object store only, for the next to build on."""
        assert item.head is not None
        onto = self.result.onto
        simulated, files = mergeops.predict_merge(self.root, self.tip, item.head)
        if files:
            item.files = list(files)
            item.reason = f"would conflict with {onto} in {', '.join(files)}"
            self.not_landed.add(item.task_id)
            return
        commits = plural(gitops.commits_ahead(self.root, self.tip, item.head), "commit")
        item.reason = f"would {self.options.strategy} {commits} onto {onto}{check}"
        self.tip = simulated or self.tip

    def run(self) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="stella-merge-"))
        worktree = scratch / "tree"
        self.journal.note(scratch=str(scratch), worktree=str(worktree))
        worktrees.worktree_add(self.root, worktree, None, self.tip)  # detached: no branch is made
        try:
            for item in self.result.queue:
                self._step(item, worktree)
                self.progress(item)
        finally:
            with contextlib.suppress(GitError):  # the scratch goes below in any case
                worktrees.worktree_remove(self.root, worktree, force=True)
            shutil.rmtree(scratch, ignore_errors=True)
        self.result.end_sha = self.tip

    def _step(self, item: MergeItem, worktree: Path) -> None:
        item.before_sha = self.tip
        if self._skipped(item):
            self._record(item, None)
            return
        merge_id = self._start_row(item)
        self.journal.note(merge_id=merge_id, branch=item.branch, head=item.head)
        try:
            self._land(item, worktree, merge_id)
        except GitError as exc:
            item.status, item.reason = MergeStatus.ERROR, exc.message
        if item.status != MergeStatus.MERGED:
            self.not_landed.add(item.task_id)
        self._record(item, merge_id)
        self.journal.note(merge_id=None, branch=None, head=None, landing=None)

    def _check(self, item: MergeItem, head: str, merge_id: int) -> CheckRun | None:
        """The task's own check, then --check, on head in a fresh check tree readied as a worktree is, each a
        ledger row of the merge step; the first red one (None: all passed, or none to run)."""
        commands = [(c, t) for c, t in ((item.check, item.check_timeout), (self.options.check, None)) if c]
        if not commands:
            return None
        env = {
            **checking.check_env(os.environ),
            "STELLA_MERGE_BRANCH": item.branch,
            "STELLA_MERGE_TASK": item.task_id,
            "STELLA_MERGE_ROOT": str(self.root),  # the user's tree
        }
        log = StatePaths(self.root).private / "logs" / self.result.run_id / f"merge-{merge_id}.log"
        checks = [
            checking.Command(
                command, timeout or self.options.check_timeout, log.with_suffix(f".check-{n}.log")
            )
            for n, (command, timeout) in enumerate(commands, 1)
        ]
        runs = checking.run_and_record(
            self.ledger,
            checking.CheckRow(self.result.run_id, item.task_id, CheckPhase.MERGE, merge_id=merge_id),
            checks,
            head,
            tree=checking.FreshTree(self.options.worktree, self.options.init_submodules, env),
            root=self.root,
            env=env,
            log_path=log,
            tail_bytes=MERGE_TAIL_BYTES,
        )
        lines = self.options.check_tail_lines
        item.check_tail = "\n".join("\n".join(run.tail.rstrip().splitlines()[-lines:]) for run in runs)
        return None if runs[-1].passed else runs[-1]

    def _land(self, item: MergeItem, worktree: Path, merge_id: int) -> None:
        assert item.head is not None
        mergeops.checkout_detached(worktree, self.tip)
        if self.options.strategy == "rebase":
            upstream = mergeops.merge_base(self.root, self.tip, item.head) or self.tip
            step = mergeops.rebase_onto(worktree, self.tip, upstream, item.head)
        else:
            message = f"Merge {item.branch} (task {item.task_id}, run {self.result.run_id})"
            step = mergeops.merge_commit(worktree, item.head, message)
        head, resolved = step.head, ""
        if head is None:
            item.status, item.files = MergeStatus.CONFLICT, list(step.conflicts)
            where = ", ".join(step.conflicts) if step.conflicts else step.message
            item.reason = f"conflicts with {self.result.onto} in {where}"
            if self.resolver is None or not step.conflicts:
                return
            fixed = self.resolver.resolve(
                item, self.result.onto, self.tip, step.conflicts, step.conflict_diff, self.journal
            )
            if fixed.head is None:
                item.reason += f"; {fixed.note}"
                return
            head, resolved = fixed.head, fixed.note
            mergeops.checkout_detached(worktree, head)
        red = self._check(item, head, merge_id)
        if red is not None:
            how = "ran out of time" if red.exit_code is None else f"exited {red.exit_code}"
            item.status, item.reason = MergeStatus.CHECK_FAILED, f"check `{red.command}` {how}"
            item.reason += f" ({resolved})" if resolved else ""
            return
        self._advance(item, head)
        item.reason += f"; {resolved}" if resolved else ""

    def _advance(self, item: MergeItem, new: str) -> None:
        """Move the user's branch to new, after making sure nothing changed under us meanwhile."""
        onto = self.result.onto
        if gitops.current_branch(self.root) != onto or gitops.ref_commit(self.root, onto) != self.tip:
            raise GitError(f"{onto} moved or was switched away from while merging: stopped before landing")
        if gitops.status_porcelain(self.root, untracked="no"):
            raise GitError("the work tree got uncommitted changes while merging: stopped before landing")
        assert item.head is not None
        if not mergeops.contains(self.root, new, item.head):
            raise GitError(f"the result {new[:12]} does not hold {item.branch}'s commits: not landed")
        self.journal.note(landing={"onto": onto, "old": self.tip, "new": new})
        mergeops.advance_branch(self.root, onto, new, self.tip)
        self.tip = item.after_sha = new
        item.status = MergeStatus.MERGED
        item.reason = f"landed on {onto} at {new[:12]}" + (" (check passed)" if self.options.check else "")

    def _start_row(self, item: MergeItem) -> int:
        return self.ledger.merges.start(
            run_id=self.result.run_id,
            task_id=item.task_id,
            branch=item.branch,
            position=item.position,
            strategy=self.options.strategy,
            onto_ref=self.result.onto,
            before_sha=item.before_sha or self.tip,
            check_command=self.options.check,
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
