"""The ledger's follow-up tables: `requests` (another attempt of a task, asked for and served) and
`attempt_facts` (what an attempt learned, by key)."""

from __future__ import annotations

import json
from typing import Any

from stellafleet.core import jsontext
from stellafleet.core.status import FollowUpReason, RequestState
from stellafleet.state.ledger_schema import check_choice
from stellafleet.state.sqlitefile import Table


class Requests(Table):
    """The requests table: one row per follow-up asked for; `needs_you` rows are what waits on a person."""

    def ask(
        self,
        run_id: str,
        task_id: str | None,
        reason: FollowUpReason,
        context: str,
        *,
        asked_by: str,
        branch: str | None = None,
        state: RequestState = RequestState.OPEN,
        start_at: str | None = None,
        not_before_ms: int | None = None,
        from_attempt: int | None = None,
    ) -> int:
        """A new request; its id. One waiting on a person replaces the task's earlier ones of that reason."""
        values = (
            run_id, task_id, branch, check_choice("request reason", reason, FollowUpReason), context,
            check_choice("request state", state, RequestState), asked_by, start_at, not_before_ms,
            from_attempt, self._db.now_ms(),
        )  # fmt: skip
        with self._db.write() as conn:
            if state == RequestState.NEEDS_YOU:
                self._end(conn, run_id, task_id, branch, reason, "asked again")
            cursor = conn.execute(
                "INSERT INTO requests (run_id, task_id, branch, reason, context, state, asked_by, start_at,"
                " not_before_ms, from_attempt_id, asked_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            return int(cursor.lastrowid or 0)

    def take(self, request_id: int) -> bool:
        """Take an open request to serve it; False when another process (or call) took it first."""
        cursor = self._db.execute(
            "UPDATE requests SET state = ?, taken_at_ms = ? WHERE id = ? AND state = ?",
            (str(RequestState.SERVED), self._db.now_ms(), request_id, str(RequestState.OPEN)),
        )
        return cursor.rowcount == 1

    def serving(self, request_id: int, attempt_id: int) -> None:
        """The attempt that serves a taken request (set as the attempt opens)."""
        self._db.execute("UPDATE requests SET attempt_id = ? WHERE id = ?", (attempt_id, request_id))

    def finish(self, request_id: int, why: str) -> None:
        """Why a request ended: its attempt's end, or why it was never served."""
        self._db.execute(
            "UPDATE requests SET ended_at_ms = ?, why = ? WHERE id = ? AND ended_at_ms IS NULL",
            (self._db.now_ms(), why, request_id),
        )

    def dismiss(
        self, run_id: str, task_id: str | None, branch: str | None, reason: FollowUpReason, why: str
    ) -> None:
        """The task's (or branch's) requests of this reason that wait on a person no longer do (say, its CI
        went green)."""
        with self._db.write() as conn:
            self._end(conn, run_id, task_id, branch, reason, why)

    def _end(
        self, conn: Any, run_id: str, task_id: str | None, branch: str | None, reason: str, why: str
    ) -> None:
        conn.execute(
            "UPDATE requests SET state = ?, why = ?, ended_at_ms = ? WHERE run_id = ? AND task_id IS ?"
            " AND (branch IS ? OR ? IS NULL) AND reason = ? AND state = ?",
            (str(RequestState.DISMISSED), why, self._db.now_ms(), run_id, task_id, branch, branch,
             str(reason), str(RequestState.NEEDS_YOU)),
        )  # fmt: skip

    def get(self, request_id: int) -> dict[str, Any] | None:
        return self._db.row("SELECT * FROM requests WHERE id = ?", (request_id,))

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        return self._db.rows("SELECT * FROM requests WHERE run_id = ? ORDER BY id", (run_id,))

    def needing_you(self, run_id: str) -> list[dict[str, Any]]:
        """The run's requests no one may serve without a person, oldest first."""
        return self._db.rows(
            "SELECT * FROM requests WHERE run_id = ? AND state = ? ORDER BY id",
            (run_id, str(RequestState.NEEDS_YOU)),
        )

    def answer(self, request_id: int, kind: str, text: str, *, by: str) -> bool:
        """A person's answer to a request that waits on them; False when it no longer waits (answered,
        taken or dismissed meanwhile): exactly one answer is ever recorded."""
        cursor = self._db.execute(
            "UPDATE requests SET state = ?, answer_kind = ?, answer = ?, answered_by = ?, answered_at_ms = ?"
            " WHERE id = ? AND state = ?",
            (str(RequestState.ANSWERED), kind, text, by, self._db.now_ms(), request_id,
             str(RequestState.NEEDS_YOU)),
        )  # fmt: skip
        return cursor.rowcount == 1

    def take_answered(self, request_id: int) -> bool:
        """Take an answered request to serve it (the task goes on with the answer); False: taken elsewhere."""
        cursor = self._db.execute(
            "UPDATE requests SET state = ?, taken_at_ms = ? WHERE id = ? AND state = ?",
            (str(RequestState.SERVED), self._db.now_ms(), request_id, str(RequestState.ANSWERED)),
        )
        return cursor.rowcount == 1

    def answers(self, run_ids: list[str], task_id: str, state: RequestState) -> list[dict[str, Any]]:
        """The task's `answer` requests in this state (answered: not yet served; needs_you: still
        waiting), in the runs given, oldest first."""
        marks = ", ".join("?" * len(run_ids))
        return self._db.rows(
            f"SELECT * FROM requests WHERE run_id IN ({marks}) AND task_id = ? AND reason = ? AND state = ?"
            " ORDER BY id",
            (*run_ids, task_id, str(FollowUpReason.ANSWER), str(state)),
        )

    def allowed(self, run_ids: list[str], task_id: str) -> list[Any]:
        """What a person allowed the task: the `parked` fact of each attempt whose request they answered
        --allow, in the runs given."""
        marks = ", ".join("?" * len(run_ids))
        rows = self._db.read(
            f"SELECT f.value_json FROM requests r JOIN attempt_facts f ON f.attempt_id = r.from_attempt_id"
            f" AND f.key = 'parked' WHERE r.run_id IN ({marks}) AND r.task_id = ? AND r.reason = ?"
            " AND r.answer_kind = 'allow' ORDER BY r.id",
            (*run_ids, task_id, str(FollowUpReason.ANSWER)),
        )
        return [json.loads(row[0]) for row in rows]

    def waiting(self) -> list[dict[str, Any]]:
        """Every request that waits on a person, across runs, oldest first (`stella inbox`)."""
        return self._db.rows(
            "SELECT * FROM requests WHERE state = ? ORDER BY asked_at_ms, id", (str(RequestState.NEEDS_YOU),)
        )

    def count(self, run_id: str, task_id: str, reason: FollowUpReason) -> int:
        """How many follow-ups of this reason the task has been given (its rounds so far)."""
        row = self._db.read(
            "SELECT COUNT(*) FROM requests WHERE run_id = ? AND task_id = ? AND reason = ? AND state = ?",
            (run_id, task_id, str(reason), str(RequestState.SERVED)),
        )
        return int(row[0][0])


class Facts(Table):
    """The attempt_facts table: what an attempt learned (a session id, leased ports), one row per key."""

    def set(self, attempt_id: int, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO attempt_facts (attempt_id, key, value_json, at_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (attempt_id, key) DO UPDATE SET value_json = excluded.value_json,"
            " at_ms = excluded.at_ms",
            (attempt_id, key, jsontext.dumps(value), self._db.now_ms()),
        )

    def of_attempt(self, attempt_id: int) -> dict[str, Any]:
        rows = self._db.read("SELECT key, value_json FROM attempt_facts WHERE attempt_id = ?", (attempt_id,))
        return {str(key): json.loads(value) for key, value in rows}

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        """Every fact of the run's attempts: attempt_id, key, value (decoded)."""
        rows = self._db.read(
            "SELECT f.attempt_id, f.key, f.value_json FROM attempt_facts f"
            " JOIN attempts a ON a.id = f.attempt_id WHERE a.run_id = ? ORDER BY f.attempt_id, f.key",
            (run_id,),
        )
        return [
            {"attempt_id": attempt, "key": str(key), "value": json.loads(value)}
            for attempt, key, value in rows
        ]

    def of_task(self, run_id: str, task_id: str) -> dict[str, Any]:
        """Each key's value from the task's latest attempt that set it (what its next attempt is handed)."""
        rows = self._db.read(
            "SELECT f.key, f.value_json FROM attempt_facts f JOIN attempts a ON a.id = f.attempt_id"
            " WHERE a.run_id = ? AND a.task_id = ? ORDER BY a.id, f.at_ms",
            (run_id, task_id),
        )
        return {str(key): json.loads(value) for key, value in rows}

    def latest(self, run_ids: list[str], task_id: str, key: str) -> tuple[int, str, Any] | None:
        """The task's latest attempt that set key, in the first of run_ids that has one (a run, then the
        runs it resumes): (its attempt id, its pipeline, the value)."""
        for run_id in run_ids:
            row = self._db.row(
                "SELECT a.id, a.pipeline, f.value_json FROM attempt_facts f"
                " JOIN attempts a ON a.id = f.attempt_id WHERE a.run_id = ? AND a.task_id = ? AND f.key = ?"
                " ORDER BY a.id DESC LIMIT 1",
                (run_id, task_id, key),
            )
            if row is not None:
                return int(row["id"]), str(row["pipeline"] or ""), json.loads(row["value_json"])
        return None
