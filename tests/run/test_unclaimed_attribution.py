"""Issue 49 item 7 and item 18's row for run/steps/unclaimed.py: writes are attributed by who could have
made them. Two shared attempts of one fleet (one UnclaimedWrites step, as a fleet has), each writing only
its own claimed file, name nothing whichever ends last; an intruder's write into a file another task claims
is named when the claimant could not have made it (its claim was taken after the write, or it had ended);
directory claims, implicit claims, deletions, an already-changed file rewritten, `released` with or without
`ended` and the summaries are pinned. The step's clock is injected and each write's file time set to match,
so nothing sleeps.

A claimant whose pipeline reports write spans (the engine's writing tool calls, Claude Code's hooked ones)
could write only within them: an intruder writing its file between them while it runs is named, the
claimant's own write within a span stays its own, a span never closed lasts to its end, and the claimant is
told when its file was last changed between its calls while another task ran."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from helpers.fleet import make_attempt
from helpers.repo import git

from stellafleet.core.config import Config
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.plan.model import PlanTask
from stellafleet.run.steps import AttemptState, RunSettings
from stellafleet.run.steps.unclaimed import EDGE_NS, UnclaimedWrites
from stellafleet.state.claims import ClaimStore, Holder
from stellafleet.state.ledger import Ledger

DONE = AttemptEnd(AttemptOutcome.SUCCEEDED, "done")
SECOND = 1_000_000_000


@dataclass
class Clock:
    """The step's clock, in whole seconds from now: each write's file time is set to the same clock."""

    at: int = field(default_factory=time.time_ns)  # after the files _fleet wrote

    def now(self) -> int:
        return self.at

    def tick(self) -> int:
        self.at += SECOND
        return self.at


@dataclass
class Fleet:
    step: UnclaimedWrites
    store: ClaimStore
    repo: Path
    clock: Clock

    def start(self, task_id: str, *claims: str) -> AttemptState:
        """A shared attempt started now: its claims taken (held by this live process), the step told."""
        self.clock.tick()
        ctx = make_attempt(self.repo, task_id)
        if claims:
            holder = Holder.current(ctx.run_id, task_id, "", ctx.attempt_id, pid=os.getpid())
            self.store.acquire(list(claims), holder)
        attempt = AttemptState(PlanTask(task_id, "p", "t", claims=claims), threading.Event(), context=ctx)
        self.step.before_start(attempt)
        return attempt

    def write(self, name: str, text: str = "written\n") -> None:
        """name written now (its file time the clock's)."""
        at = self.clock.tick()
        (self.repo / name).write_text(text)
        os.utime(self.repo / name, ns=(at, at))

    def reports_spans(self, attempt: AttemptState) -> None:
        self.store.report_spans(attempt.ctx.run_id, attempt.ctx.attempt_id)

    def tool_call(self, attempt: AttemptState, *writes: str, closed: bool = True) -> None:
        """One write span of the attempt around its writes (closed: its end reported)."""
        ctx, name = attempt.ctx, f"call-{self.clock.at}"
        self.store.open_span(ctx.run_id, ctx.attempt_id, name, self.clock.tick())
        for path in writes:
            self.write(path, f"{attempt.task.id}'s\n")
        if closed:
            self.store.close_span(ctx.run_id, ctx.attempt_id, name, self.clock.tick())

    def end(self, attempt: AttemptState, end: AttemptEnd = DONE) -> AttemptEnd:
        """Its end as the step sees it now, then its claims released (as the claims step does)."""
        self.clock.tick()
        seen = self.step.ended(attempt, end)
        self.step.released(attempt)
        self.store.release_attempt(attempt.ctx.run_id, attempt.ctx.attempt_id)
        return seen


@contextmanager
def _fleet(repo: Path, *files: str, strict: bool = True) -> Iterator[Fleet]:
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("original\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "files", cwd=repo)
    ctx = make_attempt(repo, "setup")
    config = Config({"fleet": {"strict_claims": strict}})
    settings = RunSettings(repo, ctx.run_id, "0" * 40, "command", config=config)
    clock = Clock()
    with Ledger.open(ctx.paths.fleet_db) as ledger, ClaimStore.open(ctx.paths.store_db) as store:
        yield Fleet(UnclaimedWrites(settings, ledger, store, now_ns=clock.now), store, repo, clock)


def _named(*paths: str) -> str:
    return f"changed files it did not claim: {', '.join(paths)} ([fleet] strict_claims)"


def test_two_tasks_each_writing_its_own_claimed_file_name_nothing_whichever_ends_last(git_repo: Path) -> None:
    with _fleet(git_repo, "a.txt", "b.txt") as fleet:
        a, b = fleet.start("a", "a.txt"), fleet.start("b", "b.txt")
        fleet.write("a.txt")
        fleet.write("b.txt")
        assert fleet.end(a) == DONE  # b.txt: b is running and claims it
        assert fleet.end(b) == DONE  # a.txt: a made it while it ran, though its claim is gone now


def test_a_file_a_running_task_claimed_as_it_wrote_it_is_not_another_tasks(git_repo: Path) -> None:
    """A task with no plan claims whose claim hook (or `stella commit`) claims a file as it writes it; the
    other task, ending while it still runs, is not taken for that write (a real Claude Code pair did)."""
    with _fleet(git_repo, "app.py") as fleet:
        writer, crashed = fleet.start("ok"), fleet.start("boom")
        holder = Holder.current(writer.ctx.run_id, "ok", "", writer.ctx.attempt_id, pid=os.getpid())
        fleet.store.acquire(["app.py"], holder)
        fleet.write("app.py")
        assert fleet.end(crashed) == DONE
        assert fleet.end(writer) == DONE


def test_an_intruders_write_into_a_file_claimed_after_it_is_named(git_repo: Path) -> None:
    with _fleet(git_repo, "b.txt", "x.txt", "stray.txt") as fleet:
        intruder = fleet.start("x", "x.txt")
        fleet.write("b.txt")
        fleet.write("stray.txt")  # nobody claims it
        claimant = fleet.start("b", "b.txt")  # running, its claim live, when x ends
        end = fleet.end(intruder)
        assert end.outcome == AttemptOutcome.FAILED and end.reason == _named("b.txt", "stray.txt")
        assert end.summary == "done; " + _named("b.txt", "stray.txt")
        assert fleet.end(claimant) == DONE  # b.txt changed before it started: not its


def test_a_write_after_the_claimant_ended_is_the_writers(git_repo: Path) -> None:
    with _fleet(git_repo, "a.txt", "y.txt") as fleet:
        later = fleet.start("y", "y.txt")
        assert fleet.end(fleet.start("a", "a.txt")) == DONE
        fleet.write("a.txt")
        fleet.clock.tick()
        assert fleet.end(later).reason == _named("a.txt")


def test_an_attempt_released_without_ending_no_longer_covers_later_writes(git_repo: Path) -> None:
    with _fleet(git_repo, "a.txt", "y.txt") as fleet:
        never = fleet.start("a", "a.txt")
        fleet.step.released(never)  # its worker never started: no ended()
        fleet.store.release_attempt(never.ctx.run_id, never.ctx.attempt_id)
        fleet.step.released(never)  # released twice is harmless
        later = fleet.start("y", "y.txt")
        fleet.write("a.txt")
        fleet.clock.tick()
        assert fleet.end(later).reason == _named("a.txt")


def test_claims_of_every_kind_deletions_and_an_already_changed_file_rewritten(git_repo: Path) -> None:
    files = ("src/app.py", "gone.txt", "old.txt", "touched.txt", "theirs.txt")
    with _fleet(git_repo, *files) as fleet:
        (git_repo / "old.txt").write_text("changed before the attempt\n")
        other = fleet.start("other", "theirs.txt")
        attempt = fleet.start("t", "src/")
        holder = Holder.current(attempt.ctx.run_id, "t", "", attempt.ctx.attempt_id, pid=os.getpid())
        fleet.store.touch("touched.txt", holder)  # claimed as it wrote it
        fleet.write("touched.txt")
        fleet.write("src/app.py")  # inside its claimed folder
        fleet.write("src/new.py")
        (git_repo / "gone.txt").unlink()
        (git_repo / "theirs.txt").unlink()  # another running task's: it could have
        fleet.write("old.txt", "rewritten by the attempt\n")
        assert fleet.end(attempt).reason == _named("gone.txt", "old.txt")
        # unclaimed changes made while both ran are each's to explain; theirs.txt and t's files are not
        assert fleet.end(other).reason == _named("gone.txt", "old.txt")


def test_an_isolated_attempt_is_not_looked_at_and_a_summary_without_words_is_the_finding(
    git_repo: Path,
) -> None:
    with _fleet(git_repo, "a.txt", strict=False) as fleet:
        ctx = make_attempt(git_repo, "iso")
        isolated = AttemptState(
            PlanTask("iso", "p", "t", isolation="isolated"), threading.Event(), context=ctx
        )
        assert fleet.step.ended(isolated, DONE) == DONE  # no before_start for it: nothing to compare
        fleet.step.released(isolated)  # nor a window to close
        attempt = fleet.start("t")
        fleet.write("a.txt")
        end = fleet.end(attempt, AttemptEnd(AttemptOutcome.SUCCEEDED, ""))
        assert (
            end.outcome == AttemptOutcome.SUCCEEDED and end.summary == "changed files it did not claim: a.txt"
        )


def test_a_claimants_window_reaches_an_edge_past_its_start_and_end(git_repo: Path) -> None:
    """File times are coarse: a write up to EDGE_NS before a claimant's start or after its end is its own,
    a write after that is the writer's; a deletion counts for a claimant that ended up to EDGE_NS before
    the writer started."""
    with _fleet(git_repo, "early.txt", "late.txt", "later.txt", "w.txt") as fleet:
        writer = fleet.start("w", "w.txt")
        claimant = fleet.start("c", "early.txt", "late.txt", "later.txt")
        started = fleet.clock.now()
        ended = fleet.clock.now() + SECOND
        assert fleet.end(claimant) == DONE
        for name, at in (("early.txt", started - EDGE_NS), ("late.txt", ended + EDGE_NS)):
            fleet.write(name)
            os.utime(git_repo / name, ns=(at, at))
        fleet.write("later.txt")
        os.utime(git_repo / "later.txt", ns=(ended + EDGE_NS + 1,) * 2)
        assert fleet.end(writer).reason == _named("later.txt")

    with _fleet(git_repo, "kept.txt", "v.txt") as fleet:
        claimant = fleet.start("c", "kept.txt")
        fleet.end(claimant)
        fleet.clock.at += EDGE_NS - SECOND  # the writer starts EDGE_NS after the claimant ended
        writer = fleet.start("v", "v.txt")
        (git_repo / "kept.txt").unlink()
        assert fleet.end(writer) == DONE


def _outside(path: str, *ran: str) -> str:
    return f"{path} was last changed outside this task's tool calls (while {', '.join(ran)} ran)"


def test_an_intruder_writing_a_running_claimants_file_between_its_tool_calls_is_named(git_repo: Path) -> None:
    """Item 7: the claimant still runs when the intruder ends; its spans show it could not have written."""
    with _fleet(git_repo, "c.txt", "x.txt") as fleet:
        claimant = fleet.start("c", "c.txt")
        fleet.reports_spans(claimant)
        intruder = fleet.start("x", "x.txt")  # a command task: no spans, its window is its whole run
        fleet.tool_call(claimant, "c.txt")
        fleet.write("c.txt", "the intruder's sed\n")  # a second after the claimant's call closed
        end = fleet.end(intruder)
        assert end.outcome == AttemptOutcome.FAILED and end.reason == _named("c.txt")
        # the claimant is not blamed, and is told its file holds a change it may not have made
        claimant_end = fleet.end(claimant)
        assert claimant_end.outcome == AttemptOutcome.SUCCEEDED
        assert claimant_end.summary == "done; " + _outside("c.txt", "x")


def test_a_write_within_the_claimants_tool_call_stays_the_claimants(git_repo: Path) -> None:
    with _fleet(git_repo, "c.txt", "d.txt", "x.txt") as fleet:
        claimant = fleet.start("c", "c.txt", "d.txt")
        fleet.reports_spans(claimant)
        other = fleet.start("x", "x.txt")
        fleet.tool_call(claimant, "c.txt")
        fleet.tool_call(claimant, "d.txt", closed=False)  # never closed (the tool was stopped): to its end
        fleet.clock.tick()
        os.utime(git_repo / "d.txt", ns=(fleet.clock.now(),) * 2)  # a write much later in that call
        assert fleet.end(other) == DONE
        assert fleet.end(claimant) == DONE  # nothing of its own was changed between its calls


def test_a_claimant_that_reports_no_spans_is_covered_for_its_whole_run(git_repo: Path) -> None:
    with _fleet(git_repo, "c.txt", "x.txt") as fleet:
        claimant, intruder = fleet.start("c", "c.txt"), fleet.start("x", "x.txt")
        fleet.write("c.txt")
        assert fleet.end(intruder) == DONE  # either could have: the intruder is not named
        assert fleet.end(claimant) == DONE


def test_a_span_edges_and_deletions_and_an_ended_claimants_spans(git_repo: Path) -> None:
    """A write up to EDGE_NS past either end of a span is the claimant's; a deletion is when a span ended
    after the writer started; an ended claimant keeps its spans (dropped from the store once released)."""
    files = ("early.txt", "before.txt", "edge.txt", "past.txt", "gone.txt")
    with _fleet(git_repo, *files, "y.txt") as fleet:
        claimant = fleet.start("c", *files)
        fleet.reports_spans(claimant)
        writer = fleet.start("y", "y.txt")
        fleet.clock.tick()
        fleet.tool_call(claimant)
        ((start, end),) = fleet.store.write_spans(claimant.ctx.run_id, claimant.ctx.attempt_id) or []
        assert end is not None
        edges = {"early.txt": start - EDGE_NS, "before.txt": start - EDGE_NS - 1}
        edges.update({"edge.txt": end + EDGE_NS, "past.txt": end + EDGE_NS + 1})
        for name, at in edges.items():
            fleet.write(name)
            os.utime(git_repo / name, ns=(at, at))
        (git_repo / "gone.txt").unlink()  # the writer started before the span ended: the claimant could have
        outside = f"{_outside('before.txt', 'y')}; {_outside('past.txt', 'y')}"
        assert fleet.end(claimant).summary == f"done; {outside}"
        assert fleet.store.write_spans(claimant.ctx.run_id, claimant.ctx.attempt_id) is None  # released
        assert fleet.end(writer).reason == _named("before.txt", "past.txt")

    with _fleet(git_repo, "gone.txt", "z.txt") as fleet:
        claimant = fleet.start("c", "gone.txt")
        fleet.reports_spans(claimant)
        fleet.tool_call(claimant)
        fleet.clock.tick()
        writer = fleet.start("z", "z.txt")  # after the claimant's only call
        (git_repo / "gone.txt").unlink()
        assert fleet.end(writer).reason == _named("gone.txt")
        assert fleet.end(claimant) == DONE  # a deletion has no time to tell of


def test_the_claimant_is_told_of_a_change_between_its_calls_in_a_file_it_committed(git_repo: Path) -> None:
    """Also of a new file in a folder it claims; a claimed file unchanged since it started, one that does
    not exist and the folder itself are not told of."""
    with _fleet(git_repo, "c.txt", "x.txt", "untouched.txt", "src/app.py") as fleet:
        claimant = fleet.start("c", "c.txt", "untouched.txt", "gone.txt", "src/")
        fleet.reports_spans(claimant)
        intruder = fleet.start("x", "x.txt")
        fleet.tool_call(claimant, "c.txt")
        fleet.write("c.txt", "the intruder's\n")
        fleet.write("src/new.py", "the intruder's\n")
        os.utime(git_repo / "src", ns=(fleet.clock.now(),) * 2)  # the folder changed then too
        fleet.end(intruder)
        fleet.clock.tick()
        git("commit", "-q", "-m", "the claimant's commit", "c.txt", cwd=git_repo)  # its file equals HEAD now
        end = fleet.end(claimant)
        assert end.summary == f"done; {_outside('c.txt', 'x')}; {_outside('src/new.py', 'x')}"


def test_the_claimant_is_told_every_task_that_ran_then_and_no_task_that_had_ended(git_repo: Path) -> None:
    """Each task whose window covers the change is named, an earlier ended one is not; a summary without
    words is the note alone."""
    with _fleet(git_repo, "c.txt", "a.txt", "x.txt", "y.txt", strict=False) as fleet:
        claimant = fleet.start("c", "c.txt")
        fleet.reports_spans(claimant)
        early = fleet.start("a", "a.txt")
        fleet.end(early)
        first, second = fleet.start("x", "x.txt"), fleet.start("y", "y.txt")
        fleet.tool_call(claimant, "c.txt")
        fleet.write("c.txt", "one of them\n")
        fleet.end(first)
        fleet.end(second)
        end = fleet.end(claimant, AttemptEnd(AttemptOutcome.SUCCEEDED, ""))
        assert end.summary == _outside("c.txt", "x", "y")
