"""What `stella run` shows: a reporter for a fleet of one task that reads like the engine run by hand."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, cast

from stellafleet.core import jsontext
from stellafleet.core.spend import money
from stellafleet.core.status import RunStatus
from stellafleet.core.terminal import printable
from stellafleet.pipelines.base import PipelineResult
from stellafleet.run.events import AttemptEnded, AttemptStarted, EventSink, RunStarted
from stellafleet.run.executor import read_result
from stellafleet.run.reporter import LossyStream

# The worker's own first and last lines (worker/main.py): the lines printed here say the same.
WORKER_FRAME = "stella worker: "
# A worker's warnings to its stderr (e.g. a model without a price): they go to ours.
DIAGNOSTIC = "stella: "
FOLLOW_INTERVAL_S = 0.1


class LogFollower:
    """Hands each complete line of a growing log to on_line, from a thread started now, until stop()."""

    def __init__(self, path: Path, on_line: Callable[[str], None]) -> None:
        self.path = path
        self._on_line = on_line
        self._offset = 0
        self._partial = b""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="stella-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stopping.set()
            self._thread.join()

    def _follow(self) -> None:
        while not self._stopping.wait(FOLLOW_INTERVAL_S):
            self._read()
        self._read()
        if self._partial:
            self._on_line(self._partial.decode("utf-8", "replace"))

    def _read(self) -> None:
        try:
            with self.path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:  # not there yet
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._on_line(line.decode("utf-8", "replace"))


class OneTaskReporter(EventSink):
    def __init__(self, *, json_mode: bool = False, quiet: bool = False) -> None:
        super().__init__()
        self.json_mode = json_mode
        self.quiet = quiet or json_mode
        self.out = cast(IO[str], LossyStream(sys.stdout))
        self.err = cast(IO[str], LossyStream(sys.stderr))
        self._guard: float | None = None
        self._run_id = ""
        self._result_path: Path | None = None
        self._follower: LogFollower | None = None

    def on_run_started(self, event: RunStarted) -> None:
        self._run_id, self._guard = event.run_id, event.spend_guard_usd

    def on_attempt_started(self, event: AttemptStarted) -> None:
        self._result_path = event.result_path
        if not self.quiet:
            guard = f", spend guard {money(self._guard)}" if self._guard is not None else ""
            self._say(f"stella run {self._run_id}: task {event.task} ({event.title}){guard}")
        self._follower = LogFollower(event.log_path, self._worker_line)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        self.abort()

    def abort(self) -> None:
        """Stop following the worker's log (the attempt ended, or the run ended without a result)."""
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    def _say(self, text: str) -> None:
        print(printable(text), file=self.out, flush=True)

    def _worker_line(self, line: str) -> None:
        if line.startswith(DIAGNOSTIC):
            print(printable(line), file=self.err, flush=True)
        elif not self.quiet and not line.startswith(WORKER_FRAME):
            print(printable(line), file=self.out, flush=True)

    def finish(self, doc: Mapping[str, Any]) -> None:
        if doc["status"] == RunStatus.INTERRUPTED:
            print("stella: interrupted", file=self.err, flush=True)
            return
        (task,) = doc["tasks"]
        attempt = task["attempts"][-1] if task["attempts"] else None
        result = self._result(task, attempt)
        spent = doc["spend_usd"]
        if self.json_mode:
            document = {
                "run_id": doc["run_id"],
                "task_id": task["id"],
                "attempt_id": attempt["id"] if attempt else None,
                **result.to_json(),
                "spend_usd": spent,
            }
            print(jsontext.dumps(document, indent=2), file=self.out, flush=True)
            return
        outcome = attempt["outcome"] if attempt else task["status"]
        self._say(
            f"{outcome} in {result.steps} steps, {money(spent)}, "
            f"{result.input_tokens:,} input / {result.output_tokens:,} output tokens (run {doc['run_id']})"
        )
        self._say("summary:")
        for line in result.summary.splitlines() or [""]:
            self._say(f"  {line}")

    def _result(self, task: Mapping[str, Any], attempt: Mapping[str, Any] | None) -> PipelineResult:
        """What the worker reported; what the ledger knows when it reported nothing (it was stopped)."""
        result = read_result(self._result_path) if self._result_path is not None else None
        if result is not None:
            return result
        if attempt is None:
            return PipelineResult(False, task["reason"] or task["status"], error=task["reason"])
        return PipelineResult(
            False,
            attempt["summary"] or "",
            error=attempt["error"],
            spend_usd=attempt["spend_usd"] or 0.0,
            input_tokens=attempt["input_tokens"] or 0,
            output_tokens=attempt["output_tokens"] or 0,
            steps=attempt["steps"] or 0,
        )
