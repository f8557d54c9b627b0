"""The check: the task's own `check`, run by stella on its committed result once its worker succeeds
(run/checking.py), each run a ledger row; red fails the task, or gives it up to `check_rounds` follow-up
attempts (reason `check`). With `check_fails_first` it must fail on the start commit first."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from stellafleet.core.status import AttemptEnd, AttemptOutcome, CheckPhase, Stop, StopReason
from stellafleet.git import gitops
from stellafleet.proc import shell
from stellafleet.run import bootstrap, checking
from stellafleet.run.checking import CheckRun
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, RunAgain, RunSettings
from stellafleet.state.ledger import Ledger

CHECK_REASON = "check"
VACUOUS = "check passes before the change: it proves nothing"


def told(command: str, isolated: bool) -> str:
    """What a worker's first prompt says of its check."""
    where = "your branch's tip" if isolated else "the shared branch right after your last commit"
    return (
        f"\n\n---\nWhen you are done, stella runs this check on your committed work ({where}), in a "
        f"clean checkout: `{command}`. Uncommitted changes do not count: commit everything it needs.\n"
    )


def round_prompt(prompt: str, red: CheckRun, number: int, rounds: int) -> str:
    """A check round's prompt: the task's, then the red check and the end of its output."""
    on = f" on commit {red.commit[:12]}" if red.commit else ""
    return (
        f"{prompt.rstrip()}\n\n---\nstella ran your check `{red.command}`{on} and it is red "
        f"({red.failure()}). This is check round {number} of at most {rounds}. Find the cause in its output "
        "below, fix it in this workspace and commit the fix; the check runs again on your committed work.\n\n"
        f"The check's output (its end):\n```\n{red.tail}\n```\n"
    )


class Check(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        self._lock = threading.Lock()
        self._red: dict[str, CheckRun] = {}  # task id -> its last red check, for its next round
        self._rounds: dict[str, int] = {}  # task id -> check rounds it has had
        self._failed: set[int] = set()  # the attempts a red check failed

    def admit(self, attempt: AttemptState) -> None:
        task = attempt.task
        if task.check is None:
            return
        attempt.prompt += told(task.check, task.isolation == "isolated")
        if attempt.reason == CHECK_REASON:
            with self._lock:
                red, number = self._red[task.id], self._rounds[task.id]
            attempt.prompt = round_prompt(attempt.prompt, red, number, task.check_rounds)

    def before_start(self, attempt: AttemptState) -> None:
        """check_fails_first: the check on the start commit; AttemptFailed when it passes there."""
        task, ctx = attempt.task, attempt.ctx
        if task.check is None or not task.check_fails_first or attempt.follow_up:
            return
        here = ctx.branch is not None and not attempt.remote
        start = gitops.head_commit(ctx.workspace if here else ctx.root)
        run = self._run(attempt, CheckPhase.BEFORE, start, in_place=here)
        if attempt.stopping.is_set():
            text = "interrupted in its check"
            raise AttemptFailed(AttemptEnd(AttemptOutcome.INTERRUPTED, text, StopReason.INTERRUPTED.value))
        if run.passed:
            raise AttemptFailed(AttemptEnd.failed(VACUOUS))

    def ended(self, attempt: AttemptState, end: AttemptEnd) -> AttemptEnd:
        """A succeeded worker's result checked: the end unchanged when it passes, failed when it is red."""
        task, ctx = attempt.task, attempt.ctx
        if task.check is None or end.outcome != AttemptOutcome.SUCCEEDED:
            return end
        here = ctx.branch is not None and not attempt.remote
        if here:
            commit: str | None = gitops.head_commit(ctx.workspace)
        elif ctx.branch is not None:
            commit = gitops.ref_commit(ctx.root, ctx.branch)
        else:
            commit = self.ledger.commits.last_of_task(ctx.run_id, ctx.task_id)
        run = self._run(attempt, CheckPhase.AFTER, commit, in_place=here)
        if run.passed:
            return end
        if attempt.stopping.is_set():
            stop = Stop(StopReason.INTERRUPTED, "interrupted in its check")
            return replace(end, outcome=AttemptOutcome.INTERRUPTED, error=stop.text, stop=stop)
        with self._lock:
            self._red[task.id] = run
            self._failed.add(ctx.attempt_id)
        return replace(end, outcome=AttemptOutcome.FAILED, error=run.failure())

    def released(self, attempt: AttemptState) -> None:
        """A red check with rounds left: the task runs again (RunAgain), under its spend guard as ever."""
        task = attempt.task
        if attempt.recorded is None:  # never recorded: it ran no check
            return
        with self._lock:
            number = self._rounds.get(task.id, 0) + 1
            red = attempt.ctx.attempt_id in self._failed
            if not red or number > task.check_rounds or attempt.stopping.is_set():
                return
            self._rounds[task.id] = number
        raise RunAgain(CHECK_REASON)

    def _run(
        self, attempt: AttemptState, phase: CheckPhase, commit: str | None, *, in_place: bool
    ) -> CheckRun:
        """The check on commit, in the task's own worktree (in_place) or a fresh scratch checkout; its row."""
        task, ctx, settings = attempt.task, attempt.ctx, self.settings
        assert task.check is not None
        log = settings.paths.check_log(ctx.run_id, ctx.task_id, ctx.attempt_id, phase)
        env = checking.check_env(attempt.env)

        def run_in(tree: Path, record: checking.Tracked) -> CheckRun:  # in a tree that holds commit
            return checking.run_check(
                task.check or "",
                tree,
                env=env,
                timeout=task.check_timeout,
                log_path=log,
                tail_bytes=settings.config.fleet.check_log_bytes,
                commit=commit,
                stop=attempt.stopping,
                on_start=record.started,
                main_tree=settings.root,
            )

        dirty = gitops.changed_paths(ctx.workspace) if in_place and phase == CheckPhase.AFTER else []
        with checking.tracked(settings.root) as record:
            if commit is None:
                run = checking.not_run(task.check, "no commits: the task committed nothing for its check")
            elif dirty:
                shown = " ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
                run = checking.not_run(task.check, f"uncommitted changes: {shown}", commit)
            elif in_place:
                run = run_in(ctx.workspace, record)
            else:
                run = self._in_scratch(attempt, commit, env, record, run_in)
        self._record(attempt, phase, run)
        return run

    def _in_scratch(
        self,
        attempt: AttemptState,
        commit: str,
        env: dict[str, str],
        record: checking.Tracked,
        run_in: Callable[[Path, checking.Tracked], CheckRun],
    ) -> CheckRun:
        """run_in a fresh checkout of commit, readied as a worktree is, with the check's env (its setup's
        lines in the task log)."""
        settings, ctx = self.settings, attempt.ctx
        try:
            config = settings.config.worktree
            with checking.check_tree(
                settings.root, commit, config, env, ctx.log_path, record, attempt.stopping
            ) as tree:
                return run_in(tree, record)
        except bootstrap.SetupFailed as exc:
            return checking.not_run(attempt.task.check or "", f"its check tree: {exc}", commit)

    def _record(self, attempt: AttemptState, phase: CheckPhase, run: CheckRun) -> None:
        ctx = attempt.ctx
        how = "passed" if run.passed else run.failure().removeprefix("check ")
        on = f" on {run.commit[:12]}" if run.commit else ""
        said = f"check ({phase}){on}: {how} in {run.seconds:.1f} s; its log: {run.log_path}"
        shell.log_line(ctx.log_path, said)
        self.ledger.checks.add(
            run_id=ctx.run_id,
            task_id=ctx.task_id,
            attempt_id=ctx.attempt_id,
            phase=phase,
            command=run.command,
            exit_code=run.exit_code,
            duration_ms=round(run.seconds * 1000),
            commit=run.commit,
            output_tail=run.tail,
            log_path=str(run.log_path) if run.log_path else None,
        )
