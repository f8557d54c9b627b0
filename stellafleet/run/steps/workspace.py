"""The workspace: an isolated task's new worktree, its submodules, readied (run/bootstrap.py). --dry-run
names what readies each: the `[worktree] setup` command and the `.worktreeinclude` files copied in."""

from __future__ import annotations

from stellafleet.core.status import AttemptEnd, AttemptOutcome, StopReason
from stellafleet.git import include, worktrees
from stellafleet.run import bootstrap
from stellafleet.run.events import Emit, SetupStarted
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, BeforeRun, Preflight, RunSettings
from stellafleet.state.ledger import Ledger


class Workspaces(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger, emit: Emit | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.emit = emit  # a setup is shown while it runs
        self.indexes = bootstrap.WorktreeIndexes()  # STELLA_WORKTREE_INDEX of the live worktrees
        self.setup_cpu: dict[int, float] = {}  # attempt id -> its setup's CPU seconds, until it ends

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """--dry-run's `worktree`: the setup command and its timeout, and the `.worktreeinclude` files
        copied in (None: the plan has no isolated task)."""
        if not before.dry_run:
            return Preflight()
        if not any(task.isolation == "isolated" for task in before.plan.tasks):
            return Preflight(preview={"worktree": None})
        wt, root = before.config.worktree, before.root
        files = include.included_files(root)
        readying = {
            "setup": wt.setup,
            "setup_timeout": wt.setup_timeout,
            "include_files": len(files),
            "include_bytes": sum((root / path).lstat().st_size for path in files),
        }
        return Preflight(preview={"worktree": readying})

    def admit(self, attempt: AttemptState) -> None:
        """A task whose worktree starts from a salvage commit is told so first."""
        start = self.settings.start_points.get(attempt.task.id)
        if start is not None and attempt.task.isolation == "isolated":
            attempt.prompt = (
                "Your worktree holds, staged, the work an earlier attempt of this task left uncommitted when "
                f"it stopped (salvaged by stella in commit {start[:12]}): review it and continue from there "
                "rather than starting over; it goes into your next commit.\n\n"
            ) + attempt.prompt

    def before_start(self, attempt: AttemptState) -> None:
        """A new worktree, readied (a follow-up reuses the task's); AttemptFailed if it cannot be."""
        ctx = attempt.ctx
        if ctx.branch is None:
            return
        start = self.settings.start_points.get(ctx.task_id)
        if start is not None:  # --from-salvage: a command worker is told too, as an agent is in its prompt
            attempt.env[bootstrap.SALVAGE_START_VAR] = start
        index = self.indexes.take(ctx.task_id)
        attempt.env[bootstrap.INDEX_VAR] = str(index)
        self.ledger.attempts.set_worktree_index(ctx.attempt_id, index)
        if attempt.follow_up:
            return
        if attempt.remote:  # it works in a clone on another machine; its branch comes back from there
            self.ledger.tasks.set_workspace(ctx.run_id, ctx.task_id, ctx.branch, None)
            return
        settings = self.settings
        asked = attempt.request.follow_up.start_at if attempt.request is not None else None
        start = asked or ctx.start_commit or settings.base_commit
        worktrees.worktree_add(settings.root, ctx.workspace, ctx.branch, start)
        if bootstrap.starts_on_salvage(attempt.env, ctx.start_commit):
            worktrees.fold_start_commit(ctx.workspace)
        self.ledger.tasks.set_workspace(ctx.run_id, ctx.task_id, ctx.branch, str(ctx.workspace))
        if settings.config.worktree.setup is not None:
            self.ledger.attempts.set_setup_started(ctx.attempt_id)
            if self.emit is not None:
                self.emit(SetupStarted(ctx.task_id, ctx.log_path))
        try:
            setup = bootstrap.ready(
                ctx.workspace,
                settings.config.worktree,
                attempt.env,
                ctx.log_path,
                attempt.stopping,
                root=settings.root,
                init_submodules=settings.config.fleet.init_submodules,
            )
        except bootstrap.SetupFailed as exc:
            if exc.seconds is not None:
                self.ledger.attempts.set_setup(ctx.attempt_id, exc.seconds)
            if attempt.stopping.is_set():
                raise AttemptFailed(
                    AttemptEnd(AttemptOutcome.INTERRUPTED, str(exc), StopReason.INTERRUPTED.value)
                ) from None
            raise AttemptFailed(AttemptEnd.failed(str(exc)).plus_cpu(exc.cpu_seconds)) from None
        if setup is not None:
            self.ledger.attempts.set_setup(ctx.attempt_id, setup.seconds)
            self.setup_cpu[ctx.attempt_id] = setup.cpu_seconds

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """The setup's CPU counts in the attempt's: it is part of what the attempt cost the machine."""
        return end.plus_cpu(self.setup_cpu.pop(attempt.ctx.attempt_id, 0.0))

    def released(self, attempt: AttemptState) -> None:
        self.indexes.release(attempt.task.id)
        if attempt.context is not None:
            self.setup_cpu.pop(attempt.context.attempt_id, None)
