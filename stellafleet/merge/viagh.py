"""`stella merge --via-gh`: land a run's green pull requests through GitHub in the local merge's queue order;
under a merge queue each is waited for before the next, so dependencies land first (docs/merge.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.ci.gh import GhError, GhRunner, GitHub, Retry, SystemGh
from stellafleet.ci.watch import gh_repo
from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.configsections import WatchConfig
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import MergeStatus
from stellafleet.merge.queue import MergeItem, plan_queue
from stellafleet.merge.runner import MergeOptions, MergeResult, Progress
from stellafleet.state.ledger import Ledger

GH_STRATEGIES = ("merge", "squash", "rebase")
PR_FIELDS = "number,state,baseRefName,headRefOid,mergeCommit,autoMergeRequest"


@dataclass(frozen=True)
class PrState:
    number: int
    state: str  # OPEN | CLOSED | MERGED
    base: str
    head: str
    merge_commit: str | None
    queued: bool  # waiting in a merge queue (or for auto-merge)

    @classmethod
    def from_gh(cls, data: dict[str, Any]) -> PrState:
        commit = data.get("mergeCommit") or {}
        return cls(
            int(data["number"]),
            str(data.get("state") or ""),
            str(data.get("baseRefName") or ""),
            str(data.get("headRefOid") or ""),
            str(commit.get("oid")) if commit.get("oid") else None,
            data.get("autoMergeRequest") is not None,
        )


def merge_via_gh(
    root: Path,
    options: MergeOptions,
    settings: WatchConfig,
    *,
    gh: GhRunner | None = None,
    clock: Clock | None = None,
    progress: Progress | None = None,
) -> MergeResult:
    """Ask GitHub to merge each green pull request of the run, dependencies first."""
    if options.strategy not in GH_STRATEGIES:
        raise StellaError(
            f"unknown merge strategy {options.strategy!r} for --via-gh: use merge, squash or rebase",
            exit_code=EXIT_USAGE,
        )
    db = StatePaths(root).fleet_db
    if not db.exists():
        raise StellaError(f"no fleet has run in {root} yet: nothing to merge", exit_code=EXIT_USAGE)
    clock = clock or SystemClock()
    retry = Retry(settings.poll_interval, settings.stall_timeout, clock)
    github = GitHub(gh or SystemGh(), root, repo=gh_repo(root, settings), retry=retry)
    with Ledger.open(db, readonly=options.dry_run) as ledger:
        run_id = ledger.runs.resolve(options.run_ref)
        run = ledger.get_run(run_id)
        queue, left_out = plan_queue(run, unwatched=options.unwatched)
        numbers = {row["branch"]: row.get("pr_number") for row in run["ci"]}
        if queue and not options.dry_run:
            github.check_auth()
        result = MergeResult(run_id, "GitHub", options, "", "", queue, left_out)
        lander = _Lander(github, ledger, result, settings, clock, progress or (lambda _: None))
        for item in queue:
            lander.step(item, numbers.get(item.branch))
    return result


class _Lander:
    def __init__(
        self,
        github: GitHub,
        ledger: Ledger,
        result: MergeResult,
        settings: WatchConfig,
        clock: Clock,
        progress: Progress,
    ) -> None:
        self.github, self.ledger, self.result = github, ledger, result
        self.settings, self.clock, self.progress = settings, clock, progress
        self.not_landed: set[str] = set()
        self.landed_into: dict[str, str] = {}  # a landed pull request's branch -> the branch it merged into

    def step(self, item: MergeItem, number: int | None) -> None:
        options = self.result.options
        missing = [dep for dep in item.after if dep in self.not_landed]
        if number is None or missing:
            item.status = MergeStatus.SKIPPED
            item.reason = (
                f"depends on {', '.join(missing)}, which did not land"
                if missing
                else "no pull request: `stella watch` opens one for each branch it pushes"
            )
        elif options.dry_run:
            self._would_land(item, number)
        else:
            try:
                self._land(item, number)
            except GhError as exc:
                item.status, item.reason = MergeStatus.ERROR, exc.message
                self._record(item, "", "")
        would = options.dry_run and item.status not in (MergeStatus.SKIPPED, MergeStatus.ERROR)
        if item.status != MergeStatus.MERGED and not item.reason.startswith("already merged") and not would:
            self.not_landed.add(item.task_id)
        self.progress(item)

    def _would_land(self, item: MergeItem, number: int) -> None:
        """--dry-run: what would be asked of GitHub, from the pull request's state now (a closed one would
        not land; when gh cannot tell, what would be asked)."""
        try:
            now = self._state(number)
        except GhError:
            now = None
        if now is not None and now.state == "MERGED":
            item.status, item.reason = MergeStatus.SKIPPED, f"already merged (PR #{number} into {now.base})"
        elif now is not None and now.state != "OPEN":
            item.status = MergeStatus.ERROR
            item.reason = f"PR #{number} is {now.state.lower()}, not open: it would not land"
        else:
            item.reason = f"would ask GitHub to merge PR #{number} ({self.result.options.strategy})"

    def _state(self, number: int) -> PrState:
        return PrState.from_gh(self.github.pr_fields(number, PR_FIELDS))

    def _record(self, item: MergeItem, onto: str, before: str) -> None:
        merge_id = self.ledger.merges.start(
            run_id=self.result.run_id,
            task_id=item.task_id,
            branch=item.branch,
            position=item.position,
            strategy=f"gh {self.result.options.strategy}",
            onto_ref=onto,
            before_sha=before,
            check_command=None,
        )
        self.ledger.merges.finish(merge_id, item.status, after_sha=item.after_sha, reason=item.reason)

    def _land(self, item: MergeItem, number: int) -> None:
        before = self._state(number)
        item.head = before.head
        if before.state == "MERGED":
            item.status, item.after_sha = MergeStatus.SKIPPED, before.merge_commit
            item.reason = f"already merged (PR #{number} into {before.base})"
        elif before.state != "OPEN":
            item.status, item.reason = MergeStatus.ERROR, f"PR #{number} is {before.state.lower()}, not open"
        else:
            stacked_on, onto = before.base, self.landed_into.get(before.base)
            if onto is not None:  # stacked on a pull request that landed: it lands where that one did
                self.github.retarget_pr(number, onto)
                before = dataclasses.replace(before, base=onto)
            said = self.github.merge_pr(number, self.result.options.strategy)
            self._wait_merged(item, number, queued="merge queue" in said.lower())
            if onto is not None:
                item.reason += f" (retargeted from {stacked_on})"
        if item.status == MergeStatus.MERGED:
            self.landed_into[item.branch] = before.base
        self._record(item, before.base, before.head)

    def _wait_merged(self, item: MergeItem, number: int, *, queued: bool) -> None:
        """Until GitHub says the pull request is merged: at once, or when its merge queue gets to it
        (queued: gh said it used the queue; the queue may have merged it before we look)."""
        now = self._state(number)
        start = self.clock.now()
        queued = queued or (now.state == "OPEN" and now.queued)
        while now.state == "OPEN" and now.queued:
            if self.clock.now() - start >= self.settings.stall_timeout:
                item.status = MergeStatus.ERROR
                item.reason = f"PR #{number} still in the merge queue after {self.settings.stall_timeout:g}s"
                return
            self.clock.sleep(self.settings.poll_interval)
            now = self._state(number)
        if now.state != "MERGED":
            item.status = MergeStatus.ERROR
            item.reason = f"GitHub did not merge PR #{number} (it is {now.state.lower()}, not in a queue)"
            return
        how = "through the merge queue" if queued else f"with {self.result.options.strategy}"
        item.status, item.after_sha = MergeStatus.MERGED, now.merge_commit
        item.reason = f"GitHub merged PR #{number} into {now.base} {how} at {(now.merge_commit or '')[:12]}"
