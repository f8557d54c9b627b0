"""The check: the task's own `check`, run by stella on its committed result once its worker succeeds
(run/checking.py), each run a ledger row; red fails the task, or gives it up to `check_rounds` follow-up
attempts (reason `check`). With `check_fails_first` it must fail on the start commit first."""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Sequence
from dataclasses import replace

from stellafleet.core.errors import GitError
from stellafleet.core.status import AttemptEnd, AttemptOutcome, CheckPhase, FollowUpReason, Stop, StopReason
from stellafleet.git import gitops
from stellafleet.run import checking
from stellafleet.run.checking import CheckRun
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, FollowUp, RunSettings
from stellafleet.state.ledger import Ledger

VACUOUS = "check passes before the change: it proves nothing"
_EXITS = {126: "its command cannot run", 127: "its command was not found"}


def no_verdict(run: CheckRun, codes: Sequence[int]) -> str | None:
    """Why a red check at the start commit is not the check's own verdict (`[fleet] check_fail_codes`), or
    None when it is: a crash, a missing command, a timeout prove nothing either."""
    if run.exit_code in codes and run.problem is None:
        return None
    if run.problem is not None or run.exit_code is None:
        got = run.problem or "it gave no exit code"
    else:
        got = f"it exited {run.exit_code}"
        if run.exit_code in _EXITS:
            got += f" ({_EXITS[run.exit_code]})"
        elif run.exit_code > 128 and run.exit_code - 128 in signal.valid_signals():
            got += f" ({signal.Signals(run.exit_code - 128).name})"
        got += f": {run.reason_line}" if run.reason_line else ""
    wanted = " or ".join(str(code) for code in codes)
    return f"check_fails_first: the check must fail on the start commit by its verdict (exit {wanted}); {got}"


def runs_changed(command: str, changed: Sequence[str]) -> str | None:
    """The note that the task changed a file its check command names (the test it runs: `sh test.sh`,
    `--file=t.sh`, `pytest tests/t.py::test_a`), or None. A folder it names is not counted: a task that
    adds tests below it does what it should."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    named = {word.partition("=")[2] if word.startswith("-") else word for word in words}
    files = {word.partition("::")[0].removeprefix("./") for word in named}
    hit = [path for path in changed if path in files]
    return f"the task changed {', '.join(hit)}, which its check runs" if hit else None


def told(command: str, isolated: bool) -> str:
    """What a worker's first prompt says of its check."""
    where = "your branch's tip" if isolated else "the shared branch right after your last commit"
    return (
        f"\n\n---\nWhen you are done, stella runs this check on your committed work ({where}), in a "
        f"clean checkout: `{command}`. Uncommitted changes do not count: commit everything it needs.\n"
    )


def round_context(red: CheckRun, number: int, rounds: int) -> str:
    """What a check round's prompt carries after the task's: the red check and the end of its output."""
    on = f" on commit {red.commit[:12]}" if red.commit else ""
    return (
        f"stella ran your check `{red.command}`{on} and it is red "
        f"({red.failure()}). This is check round {number} of at most {rounds}. Find the cause in its output "
        "below, fix it in this workspace and commit the fix; the check runs again on your committed work.\n\n"
        f"The check's output (its end):\n```\n{red.tail}\n```\n"
    )


def red_context(red: CheckRun) -> str:
    """What a red check with no round left leaves for a person."""
    return f"check `{red.command}` is red ({red.failure()}); its output's end:\n```\n{red.tail}\n```\n"


class Check(AttemptStep):
    def __init__(self, settings: RunSettings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        self._lock = threading.Lock()
        self._red: dict[int, CheckRun] = {}  # attempt id -> the red check that failed it, until released

    def admit(self, attempt: AttemptState) -> None:
        task = attempt.task
        if task.check is None:
            return
        attempt.prompt += told(task.check, task.isolation == "isolated")

    def before_start(self, attempt: AttemptState) -> None:
        """check_fails_first: the check on the start commit; AttemptFailed when it passes there."""
        task, ctx = attempt.task, attempt.ctx
        if task.check is None or not task.check_fails_first or attempt.follow_up:
            return
        here = ctx.branch is not None and not attempt.remote
        if ctx.branch is not None and attempt.remote:  # its worktree is on another machine: where it starts
            start = ctx.start_commit or ctx.base_commit
        else:
            start = gitops.head_commit(ctx.workspace if here else ctx.root)
        run = self._run(attempt, CheckPhase.BEFORE, start, in_place=here)
        if attempt.stopping.is_set():
            text = "interrupted in its check"
            raise AttemptFailed(AttemptEnd(AttemptOutcome.INTERRUPTED, text, StopReason.INTERRUPTED.value))
        if run.passed:
            raise AttemptFailed(AttemptEnd.failed(VACUOUS))
        if why := no_verdict(run, self.settings.config.fleet.check_fail_codes):
            raise AttemptFailed(AttemptEnd.failed(why))

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
            self._red[ctx.attempt_id] = run
        return replace(end, outcome=AttemptOutcome.FAILED, error=run.failure())

    def released(self, attempt: AttemptState) -> FollowUp | None:
        """A red check: another round with its output while rounds are left (under the spend guard as
        ever), else it waits on a person."""
        if attempt.context is None:
            return None
        with self._lock:
            red = self._red.pop(attempt.ctx.attempt_id, None)
        if red is None or attempt.stopping.is_set():
            return None
        task, ctx = attempt.task, attempt.ctx
        number = self.ledger.requests.count(ctx.run_id, ctx.task_id, FollowUpReason.CHECK) + 1
        if number > task.check_rounds:
            return FollowUp(FollowUpReason.CHECK, red_context(red), needs_you=True)
        return FollowUp(FollowUpReason.CHECK, round_context(red, number, task.check_rounds))

    def _run(
        self, attempt: AttemptState, phase: CheckPhase, commit: str | None, *, in_place: bool
    ) -> CheckRun:
        """The check on commit, in the task's own worktree (in_place) or a fresh check tree; its row."""
        task, ctx, settings = attempt.task, attempt.ctx, self.settings
        assert task.check is not None
        row = checking.CheckRow(ctx.run_id, ctx.task_id, phase, attempt_id=ctx.attempt_id)
        dirty = gitops.changed_paths(ctx.workspace) if in_place and phase == CheckPhase.AFTER else []
        if commit is None or dirty:
            shown = " ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
            why = f"uncommitted changes: {shown}" if dirty else checking.NO_COMMITS
            return checking.recorded(
                self.ledger, row, checking.not_run(task.check, why, commit), ctx.log_path
            )
        log = settings.paths.check_log(ctx.run_id, ctx.task_id, ctx.attempt_id, phase)
        note = runs_changed(task.check, self._changed(attempt, commit)) if phase == CheckPhase.AFTER else None
        env = checking.check_env(attempt.env)  # its tree's setup too: the real git, no worker's secrets
        fresh = checking.FreshTree(settings.config.worktree, settings.config.fleet.init_submodules, env)
        [run] = checking.run_and_record(
            self.ledger,
            row,
            [checking.Command(task.check, task.check_timeout, log, notes=(note,) if note else ())],
            commit,
            tree=ctx.workspace if in_place else fresh,  # a fresh one's setup lines go to the task's log
            root=settings.root,
            env=env,
            log_path=ctx.log_path,
            tail_bytes=settings.config.fleet.check_log_bytes,
            stop=attempt.stopping,
        )
        return run

    def _changed(self, attempt: AttemptState, commit: str) -> list[str]:
        """The files the task's commits up to commit change: its branch's own, or its shared commits."""
        ctx, root = attempt.ctx, self.settings.root
        if ctx.branch is None:
            return gitops.files_of_commits(root, self.ledger.commits.of_task(ctx.run_id, ctx.task_id))
        stacked = attempt.task.base == "parents"  # its parents' work is not its own
        since = ctx.start_commit if stacked and ctx.start_commit else ctx.base_commit
        try:
            own = [info.sha for info in gitops.commits_between(root, since, commit)]
        except GitError:  # a start git no longer knows: nothing to name
            return []
        return gitops.files_of_commits(root, own)
