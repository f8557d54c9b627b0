"""The one server of follow-up requests: a task's first attempt, then each follow-up its steps, the watch
or `stella merge` ask for, recorded as a row of the ledger's `requests`, taken exactly once, and served by
an attempt built through the one factory. A follow-up no one may serve without a person, and a task
that failed with nothing left to try, are left `needs_you`: what every view reads as waiting on you."""

from __future__ import annotations

import math
import threading
import time

from stellafleet.core.status import AttemptEnd, AttemptOutcome, FollowUpReason, RequestState
from stellafleet.pipelines.sessions import PARKED
from stellafleet.plan.model import PlanTask
from stellafleet.run.background import run_in_background
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.events import SkipTask, TaskParked
from stellafleet.run.steps import FollowUp, Request
from stellafleet.run.steps.park import answered_follow_up

ANSWER_POLL_S = 1.0  # how often a parked task's thread looks for its answer under park_wait


class TaskFailed(Exception):
    """A task's attempt did not succeed; the message is the reason shown and recorded."""


class RequestTaken(Exception):
    """Another process (or call) took the request first: it is served there."""


class Server:
    """Serves one run's tasks and their follow-ups on a Dispatcher; `execute` is thread-safe."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.ledger = dispatcher.ledger
        self.run_id = dispatcher.settings.run_id
        self._stopping = threading.Event()  # set once the run stops: no more waiting for answers

    @property
    def running(self) -> list[str]:
        return self.dispatcher.running

    def stop_workers(self) -> None:
        self._stopping.set()
        self.dispatcher.stop_workers()

    def ask(
        self,
        task_id: str,
        follow_up: FollowUp,
        *,
        asked_by: str,
        from_attempt: int | None = None,
        branch: str | None = None,
    ) -> int:
        """Record a follow-up request; its id (open, or needs_you when no one may serve it unasked)."""
        return self.ledger.requests.ask(
            self.run_id,
            task_id,
            follow_up.reason,
            follow_up.context,
            asked_by=asked_by,
            branch=branch,
            state=RequestState.NEEDS_YOU if follow_up.needs_you else RequestState.OPEN,
            start_at=follow_up.start_at,
            not_before_ms=follow_up.not_before_ms,
            from_attempt=from_attempt,
        )

    def execute(self, task: PlanTask) -> bool:
        """The task's own attempt and every follow-up asked of it; TaskFailed with the last reason."""
        return self._serve_from(task, None)

    def serve(self, request_id: int, task: PlanTask) -> bool:
        """An open request taken and served (then the follow-ups its attempts ask for); TaskFailed with
        the last reason, RequestTaken when another process serves it."""
        row = self.ledger.requests.get(request_id)
        if row is None or not self.ledger.requests.take(request_id):
            raise RequestTaken(f"request {request_id} was taken by another process")
        follow_up = FollowUp(
            FollowUpReason(row["reason"]),
            row["context"],
            start_at=row["start_at"],
            not_before_ms=row["not_before_ms"],
        )
        return self._serve_from(task, Request(request_id, follow_up))

    def serve_waiting(self, request_id: int, task: PlanTask) -> str | None:
        """serve() in a thread while this one waits: Ctrl-C here stops the worker and lets the attempt be
        recorded before it is raised on. Why the task failed (or was skipped), or None."""
        try:
            run_in_background(
                lambda: self.serve(request_id, task), on_interrupt=self.stop_workers, name=f"stella-{task.id}"
            )
        except (
            TaskFailed,
            TaskParked,
            SkipTask,
            RequestTaken,
        ) as failed:  # SkipTask: too little spend is left
            return str(failed)
        return None

    def _serve_from(self, task: PlanTask, request: Request | None) -> bool:
        while True:
            end, attempt_id, follow_up = self.dispatcher.attempt(task, request)
            if request is not None:
                self.ledger.requests.finish(request.id, _end_text(end))
            if end.outcome == AttemptOutcome.PARKED:  # its answer request waits on a person
                answered = self._answer_of(end)
                if answered is None:
                    raise TaskParked(end.reason or "parked")
                request = answered
                continue
            if follow_up is None:
                if end.reason is not None and end.outcome != AttemptOutcome.SUCCEEDED:
                    left = FollowUp(FollowUpReason.RETRY, end.reason, needs_you=True)
                    self.ask(task.id, left, asked_by="fleet", from_attempt=attempt_id)
                break
            request_id = self.ask(task.id, follow_up, asked_by="step", from_attempt=attempt_id)
            if follow_up.needs_you:
                break
            if not self.ledger.requests.take(request_id):  # served elsewhere
                return True
            request = Request(request_id, follow_up)
        if end.reason is not None:
            raise TaskFailed(end.reason)
        self.ledger.requests.dismiss(self.run_id, task.id, None, FollowUpReason.RETRY, "it succeeded")
        return True

    def _answer_of(self, end: AttemptEnd) -> Request | None:
        """The parked attempt's request once answered, taken to serve it, if it is answered within
        `[fleet] park_wait` seconds (0: not waited for; -1: without end) while the run goes on."""
        parked = end.facts.get(PARKED)
        item = parked.get("item") if isinstance(parked, dict) else None
        wait = self.dispatcher.settings.config.fleet.park_wait
        if not isinstance(item, int) or wait == 0:
            return None
        deadline = math.inf if wait < 0 else time.monotonic() + wait
        while time.monotonic() < deadline and not self._stopping.wait(ANSWER_POLL_S):
            row = self.ledger.requests.get(item)
            if row is None or row["state"] not in (RequestState.NEEDS_YOU, RequestState.ANSWERED):
                return None  # dismissed, or served by another process
            if row["state"] == RequestState.ANSWERED and self.ledger.requests.take_answered(item):
                return Request(item, answered_follow_up(self.ledger, row))
        return None


def _end_text(end: AttemptEnd) -> str:
    return f"its attempt {end.outcome}" + (f": {end.reason}" if end.reason else "")
