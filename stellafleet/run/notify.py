"""`[notify] command`: tell the user's command (a JSON event on stdin) of a run's notable events."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stellafleet.core import jsontext
from stellafleet.core.spend import spend_stop_text
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.terminal import single_line
from stellafleet.pipelines.sessions import PARKED
from stellafleet.proc import runner
from stellafleet.proc.subreaper import reaped_argv
from stellafleet.run.events import AttemptEnded, Emit, Event, EventSink
from stellafleet.run.steps.park import answer_command

STOP_GRACE_S = 1.0
TAIL_CHARS = 300


def fan_out(*sinks: Emit | None) -> Emit:
    """One Emit that hands each event to every sink given (None: left out)."""
    targets = [sink for sink in sinks if sink is not None]

    def emit(event: Event) -> None:
        for sink in targets:
            sink(event)

    return emit


def _warn(text: str) -> None:
    print(f"stella fleet: warning: {text}", file=sys.stderr, flush=True)


class Notifier(EventSink):
    def __init__(self, command: str, *, run_id: str, root: Path, timeout_s: float) -> None:
        super().__init__()
        self.command = command
        self.run_id = run_id
        self.root = root
        self.timeout_s = timeout_s
        self._threads: list[threading.Thread] = []
        self._spend_told = False

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        end = event.end
        if end.outcome == AttemptOutcome.PARKED:
            parked = end.facts.get(PARKED)
            if not (isinstance(parked, dict) and parked.get("again")):  # one event per park
                self.send_later(parked_event(event))
            return
        if end.outcome not in (AttemptOutcome.FAILED, AttemptOutcome.STALLED):
            return
        kind = "task_stalled" if end.outcome == AttemptOutcome.STALLED else "task_failed"
        self.send_later(
            {
                "event": kind,
                "task": event.task,
                "attempt": event.attempt,
                "outcome": str(end.outcome),
                "summary": end.summary,
                "error": end.error,
                "spend_usd": round(event.spend_usd, 6),
                "text": f"task {event.task} {end.outcome}: {end.error or end.summary}",
            }
        )

    def spend_limit_reached(self, spent_usd: float, limit_usd: float) -> None:
        """Once per run: the run's spend reached its limit and no new task starts."""
        with self._lock:
            if self._spend_told:
                return
            self._spend_told = True
        self.send_later(
            {
                "event": "spend_limit",
                "spend_usd": round(spent_usd, 6),
                "spend_limit_usd": limit_usd,
                "text": spend_stop_text(spent_usd, limit_usd) + "; no new task starts",
            }
        )

    def run_ended(self, status: str, exit_code: int, reason: str | None, tasks: Mapping[str, int]) -> None:
        """The run is over: told now (bounded by the timeout), after every earlier event was sent."""
        self.close()
        self.send(
            {
                "event": "run_ended",
                "status": status,
                "exit_code": exit_code,
                "reason": reason,
                "tasks": dict(tasks),
                "text": f"run {self.run_id} {status}" + (f": {reason}" if reason else ""),
            }
        )

    def send_later(self, fields: Mapping[str, Any]) -> None:
        thread = threading.Thread(target=self.send, args=(fields,), name="stella-notify", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def send(self, fields: Mapping[str, Any]) -> bool:
        """Run the command with the event on stdin; False (and a warning) when it did not succeed."""
        document = {"run_id": self.run_id, "root": str(self.root), "at_ms": int(time.time() * 1000), **fields}
        payload = jsontext.dumps(document) + "\n"
        try:
            done = runner.run(
                reaped_argv(["/bin/sh", "-c", self.command]),  # what it leaves running ends with it
                cwd=self.root,
                input=payload,
                timeout=self.timeout_s,
                grace_s=STOP_GRACE_S,
                stdout=runner.DEVNULL,
            )
        except OSError as exc:
            _warn(f"notify command could not start: {single_line(str(exc))}")
            return False
        if done.timed_out:
            _warn(f"notify command stopped after {self.timeout_s:g}s ({fields['event']})")
            return False
        if done.returncode != 0:
            tail = single_line(done.stderr[-TAIL_CHARS * 4 :])[-TAIL_CHARS:]  # its words, never its escapes
            said = f": {tail}" if tail else ""
            _warn(f"notify command exited {done.returncode} ({fields['event']}){said}")
            return False
        return True

    def close(self) -> None:
        """Wait (bounded) for the task events still being sent."""
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(self.timeout_s + STOP_GRACE_S + 1.0)


def parked_event(event: AttemptEnded) -> dict[str, Any]:
    """One `parked` event per park: the task, what it waits on and how to answer."""
    parked = event.end.facts.get(PARKED)
    parked = parked if isinstance(parked, dict) else {}
    item = parked.get("item")
    how = answer_command(item, parked)
    return {
        "event": "parked",
        "task": event.task,
        "attempt": event.attempt,
        "item": item,
        "kind": parked.get("kind"),
        "question": parked.get("question"),
        "tool": parked.get("tool"),
        "input": parked.get("input"),
        "last_words": parked.get("last_words"),
        "answer": how,
        "text": f"task {event.task} {event.end.summary}; answer: {how}",
    }


def notifier_for(command: str | None, timeout_s: float, run_id: str, root: Path) -> Notifier | None:
    """The run's notifier (None: no `[notify] command` configured)."""
    if command is None or not command.strip():
        return None
    return Notifier(command, run_id=run_id, root=root, timeout_s=timeout_s)
