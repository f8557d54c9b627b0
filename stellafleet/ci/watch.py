"""Watch: push each branch with successful work, keep its PR's CI status current, report green or red
(a line per branch change and a table at the end); the branches it watches, their states and its result."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TextIO

from stellafleet.ci.gh import (
    CiRun,
    GhError,
    GhRunner,
    GitHub,
    Retry,
    SystemGh,
    ci_phase,
    fingerprint,
    latest_attempts,
    red_label,
    repo_with_port,
    status_block,
    with_status,
)
from stellafleet.ci.prtext import TaskWork, failure_excerpt, task_section
from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.config import PROJECT_CONFIG, Config
from stellafleet.core.configsections import WatchConfig
from stellafleet.core.errors import EXIT_OK, EXIT_USAGE, EXIT_WATCH_RED, GitError, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptOutcome, CIState, FollowUpReason, RequestState, TaskStatus
from stellafleet.core.terminal import aligned, styled
from stellafleet.core.words import duration_text, plural
from stellafleet.git import gitops
from stellafleet.state.ledger import Ledger


@dataclass(frozen=True)
class Target:
    branch: str
    kind: str  # "isolated" | "shared"
    tasks: tuple[TaskWork, ...]
    stacked_on: str | None = None  # the branch of the one isolated task it started from (base = "parents")

    @property
    def task_id(self) -> str | None:
        return self.tasks[0].id if len(self.tasks) == 1 else None

    def title(self, run_id: str) -> str:
        if len(self.tasks) == 1:
            return self.tasks[0].title
        return f"stella fleet {run_id}: {len(self.tasks)} tasks"


def branches_to_watch(run: dict[str, Any]) -> list[Target]:
    """Branches of succeeded isolated tasks with commits, then branches that succeeded shared tasks used."""
    commits = run["commits"]
    attempts = run["attempts"]

    def work(task: dict[str, Any], on_branch: str | None) -> TaskWork:
        own = [c for c in attempts if c["task_id"] == task["id"]]
        done = [a for a in own if a.get("outcome") == AttemptOutcome.SUCCEEDED or a.get("success") == 1]
        summary = (done[-1].get("summary") if done else None) or ""
        task_commits = tuple(
            (c["sha"], c["message"] or "")
            for c in commits
            if c["task_id"] == task["id"] and (on_branch is None or c["branch"] == on_branch)
        )
        return TaskWork(
            task["id"],
            task["title"] or task["id"],
            summary.strip(),
            float(sum(a.get("spend_usd") or 0.0 for a in own)),
            task_commits,
            tuple(c for c in run.get("checks", ()) if c["task_id"] == task["id"]),
        )

    targets: list[Target] = []
    shared: dict[str, list[TaskWork]] = {}
    by_id = {task["id"]: task for task in run["tasks"]}
    for task in run["tasks"]:
        if task["status"] != TaskStatus.SUCCEEDED:
            continue
        if task["isolation"] == "isolated":
            item = work(task, None)
            if task["branch"] and item.commits:
                targets.append(Target(task["branch"], "isolated", (item,), _stacked_on(task, by_id)))
            continue
        for branch in dict.fromkeys(
            c["branch"] for c in commits if c["task_id"] == task["id"] and c["branch"]
        ):
            shared.setdefault(branch, []).append(work(task, branch))
    targets.extend(Target(branch, "shared", tuple(items)) for branch, items in shared.items())
    return targets


def _stacked_on(task: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> str | None:
    """The branch a stacked task's one isolated parent works on (None: it is no stack of one)."""
    parents = [by_id.get(dependency) for dependency in task.get("depends_on") or ()]
    if task.get("base") != "parents" or len(parents) != 1 or parents[0] is None:
        return None
    return parents[0]["branch"] if parents[0]["isolation"] == "isolated" else None


@dataclass
class BranchWatch:
    """One watched branch, from push to its final CI state."""

    target: Target
    head_sha: str | None = None
    pr_url: str | None = None
    pr_number: int | None = None
    pr_body: str | None = None
    state: CIState = CIState.PENDING
    conclusion: str | None = None
    reason: str | None = None
    phase: str = "starting"
    runs: list[CiRun] = field(default_factory=list)
    since: float = 0.0
    last_change: float = 0.0
    ended_at: float | None = None
    seen: tuple[Any, ...] | None = None
    gh_trouble: str | None = None
    fix_rounds: int = 0  # --fix-ci rounds run for this branch
    fix_note: str | None = None  # why the last round left it red
    # its task's branch no longer starts from its parents' work (ledger: tasks.stale)
    stale: str | None = None

    @property
    def branch(self) -> str:
        return self.target.branch

    @property
    def done(self) -> bool:
        return self.state.settled

    @property
    def run_urls(self) -> list[str]:
        return [r.url for r in self.runs if r.url]

    def to_json(self, start: float) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "kind": self.target.kind,
            "task_id": self.target.task_id,
            "tasks": [t.id for t in self.target.tasks],
            "head_sha": self.head_sha,
            "pr_number": self.pr_number,
            "pr_url": self.pr_url,
            "state": str(self.state),
            "conclusion": self.conclusion,
            "reason": self.reason,
            "run_urls": self.run_urls,
            "fix_rounds": self.fix_rounds,
            "stale": self.stale,
            "runs": [r.to_json() for r in self.runs],
            "elapsed_s": None if self.ended_at is None else round(self.ended_at - start, 3),
        }


@dataclass
class WatchResult:
    run_id: str
    remote: str | None
    branches: list[BranchWatch]
    message: str | None = None
    start: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(b.state == CIState.GREEN for b in self.branches) else EXIT_WATCH_RED

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "remote": self.remote,
            "exit_code": self.exit_code,
            "message": self.message,
            "branches": [b.to_json(self.start) for b in self.branches],
        }


class WatchReporter(Protocol):
    """Where watch tells what happens: an event sink, so the fleet can fold it into its own output."""

    def note(self, message: str) -> None: ...

    def changed(self, watch: BranchWatch) -> None:
        """A branch's state or phase changed (called once per change)."""
        ...

    def finished(self, result: WatchResult) -> None: ...


@dataclass(frozen=True)
class FixRequest:
    """One fix-up round for a red branch."""

    branch: str
    task_id: str
    round: int  # 1-based
    max_rounds: int
    head_sha: str
    reason: str  # the watch's verdict: "failure: CI / build"
    failure: str  # the failing jobs' log excerpt


@dataclass(frozen=True)
class FixOutcome:
    new_head: str | None  # None: nothing new to push; the branch stays red
    note: str


class CiFixer(Protocol):
    max_rounds: int

    def fix(self, request: FixRequest) -> FixOutcome:
        """Run one follow-up attempt for request's task; the branch's new head, or why there is none."""
        ...


@dataclass
class Watcher:
    """Pushes, opens PRs, polls CI and records outcomes for one run's targets."""

    root: Path
    run_id: str
    watches: list[BranchWatch]
    _: KW_ONLY
    settings: WatchConfig
    github: GitHub
    ledger: Ledger
    clock: Clock
    out: WatchReporter
    default_branch: str | None
    fixer: CiFixer | None = None

    def run(self) -> WatchResult:
        start = self.clock.now()
        try:
            for watch in self.watches:
                self._start(watch)
            self._poll_until_done(start)
            stale = {
                task["id"]: task.get("stale")
                for task in self.ledger.tasks.of_run(self.run_id, "id, stale, depends_on_json")
            }
            for watch in self.watches:
                watch.stale = stale.get(watch.target.task_id or "")
        except KeyboardInterrupt:
            for watch in self.watches:
                if not watch.done:
                    watch.reason = "watch interrupted"
                    self._record(watch)
            raise
        return WatchResult(self.run_id, self.settings.remote, self.watches, start=start)

    def _start(self, watch: BranchWatch) -> None:
        watch.head_sha = gitops.ref_commit(self.root, watch.branch)
        try:
            if watch.head_sha is None:
                raise GitError(f"branch {watch.branch} no longer exists here (cleaned up?)")
            gitops.push(self.root, self.settings.remote, watch.branch, force=self.settings.force_push)
            watch.phase = f"pushed {watch.head_sha[:12]} to {self.settings.remote}"
            if watch.branch != self.default_branch:
                self._open_pr(watch)
        except (GitError, GhError) as exc:
            self._finish(watch, CIState.ERROR, None, exc.message)
            return
        watch.since = watch.last_change = self.clock.now()
        self._changed(watch)

    def _status(self, watch: BranchWatch) -> str:
        text = watch.reason or (ci_phase(watch.runs) if watch.runs else "waiting for CI runs to appear")
        return status_block(watch.state, text, watch.runs, run_id=self.run_id, head_sha=watch.head_sha)

    def _open_pr(self, watch: BranchWatch) -> None:
        found = self.github.find_open_pr(watch.branch)
        if found is None:
            sections = [task_section(task, self.run_id) for task in watch.target.tasks]
            onto, parent = self.default_branch, self._parent_pr(watch)
            if parent is not None:  # its PR shows its own work alone, and lands after its parent's
                onto = parent.branch
                sections.insert(0, f"This pull request is stacked on #{parent.pr_number} ({parent.branch}).")
            body = "\n\n".join([*sections, self._status(watch)])
            title = watch.target.title(self.run_id)
            created = self.github.create_pr(watch.branch, onto, title, body)
            watch.pr_number, watch.pr_url, watch.pr_body = created.number, created.url, body
            watch.phase += f"; opened PR #{created.number}"
        else:
            watch.pr_number, watch.pr_url, watch.pr_body = found.number, found.url, found.body
            watch.phase += f"; PR #{found.number} is open"

    def _parent_pr(self, watch: BranchWatch) -> BranchWatch | None:
        """The watch of the branch a stacked task started from, when it has a pull request."""
        parent = watch.target.stacked_on
        return next((w for w in self.watches if w.branch == parent and w.pr_number is not None), None)

    def _update_pr(self, watch: BranchWatch) -> None:
        if watch.pr_number is None or watch.pr_body is None:
            return
        body = with_status(watch.pr_body, self._status(watch))
        if body == watch.pr_body:
            return
        try:
            self.github.edit_pr_body(watch.pr_number, body)
            watch.pr_body = body
        except GhError as exc:  # the CI verdict still stands; say the PR lags behind
            self.out.note(f"{watch.branch}: could not update PR #{watch.pr_number}: {exc.message}")

    def _poll_until_done(self, start: float) -> None:
        s = self.settings
        while True:
            for watch in self.watches:
                if not watch.done:
                    self._poll(watch)
            if all(w.done for w in self.watches):
                return
            now = self.clock.now()
            if now - start >= s.total_timeout:
                after = duration_text(s.total_timeout, as_set=True)
                for watch in self.watches:
                    if not watch.done:
                        reason = f"CI still running when watching stopped after {after}"
                        self._finish(watch, CIState.RED, "timeout", reason)
                return
            self.clock.sleep(min(s.poll_interval, start + s.total_timeout - now))

    def _poll(self, watch: BranchWatch) -> None:
        assert watch.head_sha is not None
        now = self.clock.now()
        try:
            runs = latest_attempts(self.github.list_runs(watch.head_sha))
            watch.gh_trouble = None
        except GhError as exc:  # a blip is no progress; it does not end the branch on its own
            if watch.gh_trouble != exc.message:
                watch.gh_trouble = exc.message
                self.out.note(f"{watch.branch}: {exc.message} (will retry)")
            runs = watch.runs
        seen = fingerprint(runs)
        if seen != watch.seen:
            watch.seen, watch.last_change, watch.runs = seen, now, list(runs)
        s = self.settings
        if not runs:
            if now - watch.since >= s.appear_timeout:
                within = duration_text(s.appear_timeout, as_set=True)
                reason = f"no CI run appeared for {watch.head_sha[:12]} within {within}"
                if watch.gh_trouble:
                    reason += f" (gh kept failing: {watch.gh_trouble})"
                self._finish(watch, CIState.NO_CI, None, reason)
            else:
                self._set_phase(watch, "waiting for CI runs to appear")
            return
        if all(r.status == "completed" for r in runs):
            label = red_label(runs)
            gone = self._withdrawn(watch) if label is None else None
            if gone is not None:  # what passed is no longer up for review: never green
                self._finish(watch, CIState.ERROR, None, f"{gone} while its CI ran: not green")
            elif label is None:
                self._finish(watch, CIState.GREEN, "success", f"all {len(runs)} CI runs passed")
            else:
                reason = f"{label}: {', '.join(r.label for r in runs if r.conclusion == label)}"
                if not self._fix(watch, reason):  # no fix-ci round to hand it to: it ends red
                    note = f"; {watch.fix_note}" if watch.fix_note else ""
                    self._finish(watch, CIState.RED, label, reason + note)
            return
        if now - watch.last_change >= s.stall_timeout:
            known_red = red_label(runs)
            reason = f"no CI progress for {duration_text(s.stall_timeout, as_set=True)} ({ci_phase(runs)})"
            if watch.gh_trouble:
                reason += f" (gh kept failing: {watch.gh_trouble})"
            self._finish(watch, CIState.STALLED, known_red, reason)
            return
        self._set_phase(watch, ci_phase(runs))

    def _withdrawn(self, watch: BranchWatch) -> str | None:
        """Why a branch whose CI passed is no longer there to land: its PR closed, its remote branch
        deleted (None: neither, or gh or the remote cannot say)."""
        if watch.pr_number is not None:
            try:
                state = str(self.github.pr_fields(watch.pr_number, "state").get("state") or "")
            except GhError:
                state = ""
            if state.upper() == "CLOSED":
                return f"PR #{watch.pr_number} was closed"
        if gitops.remote_branch_exists(self.root, self.settings.remote, watch.branch) is False:
            return f"branch {watch.branch} was deleted from {self.settings.remote}"
        return None

    def _fix(self, watch: BranchWatch, reason: str) -> bool:
        """One --fix-ci round for a red isolated branch; True when its new head is being watched."""
        fixer, task_id = self.fixer, watch.target.task_id
        if fixer is None or fixer.max_rounds < 1 or watch.target.kind != "isolated" or task_id is None:
            return False
        if watch.fix_rounds >= fixer.max_rounds:
            watch.fix_note = f"still red after {plural(fixer.max_rounds, 'fix-ci round')}"
            return False
        watch.fix_rounds += 1
        n, limit = watch.fix_rounds, fixer.max_rounds
        self._set_phase(watch, f"{reason}; fix-ci round {n}/{limit}: a follow-up attempt of task {task_id}")
        assert watch.head_sha is not None
        request = FixRequest(
            branch=watch.branch,
            task_id=task_id,
            round=n,
            max_rounds=limit,
            head_sha=watch.head_sha,
            reason=reason,
            failure=failure_excerpt(self.github, watch.runs, self.settings.fix_ci_log_bytes),
        )
        outcome = fixer.fix(request)
        self.out.note(f"{watch.branch}: fix-ci round {n}/{limit}: {outcome.note}")
        if outcome.new_head is None:
            watch.fix_note = f"fix-ci round {n}: {outcome.note}"
            return False
        try:
            gitops.push(self.root, self.settings.remote, watch.branch, force=self.settings.force_push)
        except GitError as exc:
            self._finish(watch, CIState.ERROR, None, f"fix-ci round {n}: {exc.message}")
            return True
        watch.head_sha, watch.runs, watch.seen, watch.fix_note = outcome.new_head, [], None, None
        watch.since = watch.last_change = self.clock.now()
        watch.phase = f"fix-ci round {n}/{limit}: pushed {outcome.new_head[:12]}"
        self._changed(watch)
        return True

    def _set_phase(self, watch: BranchWatch, phase: str) -> None:
        if phase != watch.phase:
            watch.phase = phase
            self._changed(watch)

    def _finish(self, watch: BranchWatch, state: CIState, conclusion: str | None, reason: str) -> None:
        watch.state, watch.conclusion, watch.reason = state, conclusion, reason
        watch.phase = reason
        watch.ended_at = self.clock.now()
        self._changed(watch)
        task_id, requests = watch.target.task_id, self.ledger.requests
        if state == CIState.RED:  # no fix-ci round is left to hand it to: a person decides
            requests.ask(self.run_id, task_id, FollowUpReason.CI_FIX, reason, asked_by="watch",
                         branch=watch.branch, state=RequestState.NEEDS_YOU)  # fmt: skip
        elif state == CIState.GREEN:
            requests.dismiss(self.run_id, task_id, watch.branch, FollowUpReason.CI_FIX, "its CI went green")

    def _changed(self, watch: BranchWatch) -> None:
        self._update_pr(watch)
        self._record(watch)
        self.out.changed(watch)

    def _record(self, watch: BranchWatch) -> None:
        self.ledger.ci.upsert(
            run_id=self.run_id,
            branch=watch.branch,
            task_id=watch.target.task_id,
            head_sha=watch.head_sha,
            pr_url=watch.pr_url,
            pr_number=watch.pr_number,
            state=watch.state,
            conclusion=watch.conclusion,
            reason=watch.reason or (None if watch.done else watch.phase),
            run_urls=watch.run_urls,
        )


def preflight(root: Path, github: GitHub, settings: WatchConfig, settings_file: str = PROJECT_CONFIG) -> None:
    """Everything that must hold before the first push; StellaError (exit 2) saying what to do."""
    github.check_auth()
    remotes = gitops.remote_names(root)
    if settings.remote not in remotes:
        have = f" (this repository has: {', '.join(remotes)})" if remotes else ""
        raise StellaError(
            f"no git remote named {settings.remote!r} to push to{have}: add one with "
            f"`git remote add {settings.remote} URL`, or name another one with "
            f'`remote = "NAME"` under [watch] in {settings_file}',
            exit_code=EXIT_USAGE,
        )


def gh_repo(root: Path, settings: WatchConfig) -> str | None:
    """What gh is told with --repo: `[watch] repo`, else HOST:PORT/OWNER/NAME when the remote's host has
    a port (gh cannot find that one from the remotes itself)."""
    return settings.repo or repo_with_port(gitops.remote_url(root, settings.remote))


def shared_push_notes(root: Path, run_id: str, targets: Sequence[Target], remote: str) -> list[str]:
    """Say before pushing it that a branch shared tasks committed on (the local default branch, often)
    goes to the remote, and when its tip now holds commits made after the run's, that they go too."""
    notes = []
    for target in targets:
        shas = [sha for task in target.tasks for sha, _ in task.commits]
        tip = gitops.ref_commit(root, target.branch)
        if target.kind != "shared" or not shas or tip is None:
            continue  # a branch gone is the watch's own error, said when it would push it
        notes.append(f"will push {target.branch} to {remote}: shared tasks of run {run_id} committed on it")
        later = min(gitops.commits_ahead(root, sha, tip) for sha in shas)
        if later:
            notes.append(
                f"{target.branch}'s tip {tip[:12]} holds {plural(later, 'commit')} made after run {run_id}'s:"
                " they are pushed with it"
            )
    return notes


def watch_run(
    root: Path,
    run_id: str,
    *,
    config: Config,
    clock: Clock | None = None,
    gh: GhRunner | None = None,
    out: WatchReporter | None = None,
    json_mode: bool = False,
    fixer: CiFixer | None = None,
) -> WatchResult:
    """Watch the CI of every branch of run_id that holds successful work; exit_code 0 all green, else 4."""
    settings = config.watch
    reporter: WatchReporter = out or ConsoleReporter(
        sys.stderr if json_mode else sys.stdout, table=not json_mode
    )
    with Ledger.open(StatePaths(root).fleet_db) as ledger:
        targets = branches_to_watch(ledger.get_run(run_id))
        if not targets:
            message = f"nothing to watch: no branch of run {run_id} holds committed work of a succeeded task"
            reporter.note(message)
            return WatchResult(run_id, None, [], message=message)
        clock = clock or SystemClock()
        retry = Retry(settings.poll_interval, settings.stall_timeout, clock, reporter.note)
        github = GitHub(gh or SystemGh(), root, repo=settings.repo, retry=retry)
        preflight(root, github, settings, config.settings_file)
        github.repo = gh_repo(root, settings)  # once gh and the remote are known to be there
        for line in shared_push_notes(root, run_id, targets, settings.remote):
            reporter.note(line)
        watcher = Watcher(
            root,
            run_id,
            [BranchWatch(t) for t in targets],
            settings=settings,
            github=github,
            ledger=ledger,
            clock=clock,
            out=reporter,
            default_branch=gitops.default_branch(root, settings.remote),
            fixer=fixer,
        )
        result = watcher.run()
    reporter.finished(result)
    return result


def _reason(watch: BranchWatch) -> str:
    stale = f"stale: {watch.stale}" if watch.stale else None
    return "; ".join(part for part in (watch.reason, stale) if part) or "-"


class ConsoleReporter:
    def __init__(self, stream: TextIO, *, table: bool = True) -> None:
        from rich.console import Console

        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.table = table

    _STYLE: ClassVar[dict[CIState, str]] = {
        CIState.GREEN: "green",
        CIState.RED: "bold red",
        CIState.ERROR: "bold red",
    }

    def note(self, message: str) -> None:
        self.console.print(styled(("watch:", "dim"), f" {message}"))

    def changed(self, watch: BranchWatch) -> None:
        pr = f" PR #{watch.pr_number}" if watch.pr_number is not None else ""
        if self.console.is_terminal:
            state = (watch.state, self._STYLE.get(watch.state, "cyan"))
            self.console.print(styled((watch.branch, "bold"), f"{pr} ", state, f" {watch.phase}"))
        else:
            self.console.print(styled(f"watch: {watch.branch}{pr}: {watch.state}: {watch.phase}"))

    def finished(self, result: WatchResult) -> None:
        if not self.table or not result.branches:
            return
        from rich.table import Table

        rows = [
            (b.branch, b.pr_url or "-", str(b.state), b.conclusion or "-", _reason(b))
            for b in result.branches
        ]
        headers = ("branch", "PR", "state", "conclusion", "reason")
        if not self.console.is_terminal:
            for line in aligned([headers, *rows]):
                self.console.print(styled(line))
            return
        table = Table(*headers, title=f"watch: run {result.run_id}")
        for row in rows:
            table.add_row(*map(styled, row))
        self.console.print(table)
