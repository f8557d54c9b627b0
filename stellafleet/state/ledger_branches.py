"""The ledger's tables about branches: `commits`, `checks`, `ci`, `cleanups`, `merges` and `merge_batches`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from stellafleet.core.status import CheckPhase, CIState, MergeStatus
from stellafleet.state.ledger_schema import check_choice, json_column
from stellafleet.state.sqlitefile import Table

IN_COMMIT_ORDER = "ORDER BY committed_at_ms, rowid"


class Commits(Table):
    """The commits table: every commit a task's attempt made, once per run."""

    def record(
        self,
        commits: Iterable[tuple[str, str, int]],
        *,
        run_id: str,
        task_id: str,
        attempt_id: int | None,
        branch: str | None,
    ) -> int:
        """Record a task's commits on branch, each (sha, message, committed_at_ms), in one transaction: how
        many were new (one this run already has is left as it was). The one way commits are recorded."""
        with self._db.write() as conn:
            return sum(
                conn.execute(
                    "INSERT OR IGNORE INTO commits (sha, run_id, task_id, attempt_id, branch, message,"
                    " committed_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (sha, run_id, task_id, attempt_id, branch, message, committed_at_ms),
                ).rowcount
                for sha, message, committed_at_ms in commits
            )

    def of_run(self, run_id: str, columns: str = "*") -> list[dict[str, Any]]:
        return self._db.rows(f"SELECT {columns} FROM commits WHERE run_id = ? {IN_COMMIT_ORDER}", (run_id,))

    def of_task(self, run_id: str, task_id: str) -> list[str]:
        """The SHAs of the task's commits in the run, in the order they were made."""
        query = f"SELECT sha FROM commits WHERE run_id = ? AND task_id = ? {IN_COMMIT_ORDER}"
        return [str(row[0]) for row in self._db.read(query, (run_id, task_id))]

    def last_of_task(self, run_id: str, task_id: str) -> str | None:
        """The SHA of the task's latest commit in the run (None: it made none)."""
        row = self._db.row(
            "SELECT sha FROM commits WHERE run_id = ? AND task_id = ?"
            " ORDER BY committed_at_ms DESC, rowid DESC LIMIT 1",
            (run_id, task_id),
        )
        return None if row is None else str(row["sha"])

    def of_attempt(self, run_id: str, attempt_id: int) -> list[dict[str, Any]]:
        return self._db.rows(
            f"SELECT sha, branch, message, committed_at_ms FROM commits WHERE run_id = ? AND attempt_id = ?"
            f" {IN_COMMIT_ORDER}",
            (run_id, attempt_id),
        )


class Checks(Table):
    """The checks table: every run of a task's check, on the commit it ran on (run/checking.py)."""

    def add(
        self,
        *,
        run_id: str,
        task_id: str,
        phase: CheckPhase,
        command: str,
        exit_code: int | None,
        duration_ms: int,
        commit: str | None,
        output_tail: str,
        log_path: str | None,
        attempt_id: int | None = None,
        merge_id: int | None = None,
        passed: bool | None = None,
    ) -> int:
        """One check run (exit_code None: it never finished, or never ran; passed None: exit_code 0 passes,
        False: it exited 0 and still failed, as a check that moved its branch does); its row id."""
        stored = check_choice("check phase", phase, CheckPhase)
        green = exit_code == 0 if passed is None else passed
        ran = (exit_code, int(green), duration_ms, commit, output_tail, log_path, self._db.now_ms())
        return self._db.insert(
            "INSERT INTO checks (run_id, task_id, attempt_id, merge_id, phase, command, exit_code, passed,"
            " duration_ms, commit_sha, output_tail, log_path, at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, task_id, attempt_id, merge_id, stored, command, *ran),
        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        return self._db.rows("SELECT * FROM checks WHERE run_id = ? ORDER BY id", (run_id,))

    def of_attempt(self, attempt_id: int) -> list[dict[str, Any]]:
        return self._db.rows("SELECT * FROM checks WHERE attempt_id = ? ORDER BY id", (attempt_id,))


class CI(Table):
    """The ci table: the latest CI state of each branch a run pushed."""

    def upsert(
        self,
        *,
        run_id: str,
        branch: str,
        task_id: str | None,
        head_sha: str | None,
        pr_url: str | None,
        pr_number: int | None,
        state: CIState,
        conclusion: str | None,
        reason: str | None,
        run_urls: list[str],
    ) -> None:
        stored = check_choice("CI state", state, CIState)
        values = (run_id, branch, task_id, head_sha, pr_url, pr_number, stored, conclusion, reason)
        self._db.execute(
            "INSERT INTO ci (run_id, branch, task_id, head_sha, pr_url, pr_number, state, conclusion,"
            " reason, run_urls_json, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id, branch) DO UPDATE SET task_id = excluded.task_id,"
            " head_sha = excluded.head_sha, pr_url = excluded.pr_url, pr_number = excluded.pr_number,"
            " state = excluded.state, conclusion = excluded.conclusion, reason = excluded.reason,"
            " run_urls_json = excluded.run_urls_json, updated_at_ms = excluded.updated_at_ms",
            (*values, json.dumps(list(run_urls)), self._db.now_ms()),
        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._db.rows("SELECT * FROM ci WHERE run_id = ? ORDER BY branch", (run_id,))
        return [json_column(row, "run_urls_json", "run_urls") for row in rows]

    def of_branch(self, run_id: str, branch: str) -> dict[str, Any] | None:
        row = self._db.row("SELECT * FROM ci WHERE run_id = ? AND branch = ?", (run_id, branch))
        return json_column(row, "run_urls_json", "run_urls") if row else None


class Cleanups(Table):
    """The cleanups table: each worktree or branch `stella clean` (or a run's end) removed or kept."""

    def record(
        self,
        *,
        run_id: str | None,
        task_id: str | None,
        kind: str,
        target: str,
        action: str,
        reason: str | None,
    ) -> None:
        check_choice("cleanup kind", kind, ("worktree", "branch", "salvage"))
        check_choice("cleanup action", action, ("removed", "kept"))
        self._db.execute(
            "INSERT INTO cleanups (run_id, task_id, kind, target, action, reason, at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, task_id, kind, target, action, reason, self._db.now_ms()),
        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        return self._db.rows("SELECT * FROM cleanups WHERE run_id = ? ORDER BY id", (run_id,))


class Merges(Table):
    """The merges table: one row per branch `stella merge` took through its queue."""

    def start(
        self,
        *,
        run_id: str,
        task_id: str | None,
        branch: str,
        position: int,
        strategy: str,
        onto_ref: str,
        before_sha: str,
        check_command: str | None,
        batch_id: int | None = None,
    ) -> int:
        """A `planned` row for one branch's step (in batch_id of the train); returns its id."""
        where = (branch, position, strategy, onto_ref, before_sha, str(MergeStatus.PLANNED), check_command)
        return self._db.insert(
            "INSERT INTO merges (run_id, task_id, branch, position, strategy, onto_ref, before_sha,"
            " status, check_command, started_at_ms, batch_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, task_id, *where, self._db.now_ms(), batch_id),
        )

    def land(self, landed: Sequence[tuple[int, str, str | None, Sequence[str]]], after_sha: str) -> None:
        """Every (merge id, reason, check tail, files) of a batch recorded `merged` at after_sha, in one
        transaction."""
        merged, now = str(MergeStatus.MERGED), self._db.now_ms()
        with self._db.write() as conn:
            for merge_id, reason, tail, files in landed:
                conn.execute(
                    "UPDATE merges SET status = ?, after_sha = ?, reason = ?, check_tail = ?, files_json = ?,"
                    " finished_at_ms = ? WHERE id = ?",
                    (merged, after_sha, reason, tail, json.dumps(list(files)), now, merge_id),
                )

    def finish(
        self,
        merge_id: int,
        status: MergeStatus,
        *,
        after_sha: str | None = None,
        reason: str | None = None,
        files: Sequence[str] = (),
        check_tail: str | None = None,
    ) -> None:
        stored = check_choice("merge status", status, MergeStatus)
        self._db.execute(
            "UPDATE merges SET status = ?, after_sha = ?, reason = ?, files_json = ?, check_tail = ?,"
            " finished_at_ms = ? WHERE id = ?",
            (stored, after_sha, reason, json.dumps(list(files)), check_tail, self._db.now_ms(), merge_id),
        )

    def merged_branches(self) -> dict[str, str]:
        """branch -> the commit its last successful `stella merge` step put on the target branch."""
        rows = self._db.read(
            "SELECT branch, after_sha FROM merges WHERE status = ? AND after_sha IS NOT NULL ORDER BY id",
            (str(MergeStatus.MERGED),),
        )
        return {str(row[0]): str(row[1]) for row in rows}

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._db.rows("SELECT * FROM merges WHERE run_id = ? ORDER BY id", (run_id,))
        return [json_column(row, "files_json", "files") for row in rows]


class MergeBatches(Table):
    """The merge_batches table: one row per batch of `stella merge`'s train (docs/merge.md#the-train)."""

    def start(
        self, *, run_id: str, number: int, window: int, members: Sequence[str], onto_ref: str, before_sha: str
    ) -> int:
        return self._db.insert(
            "INSERT INTO merge_batches (run_id, number, window, members_json, onto_ref, before_sha,"
            " started_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, number, window, json.dumps(list(members)), onto_ref, before_sha, self._db.now_ms()),
        )

    def finish(
        self,
        batch_id: int,
        *,
        outcome: str,
        combined_sha: str | None,
        after_sha: str | None,
        steps: Sequence[dict[str, Any]],
    ) -> None:
        """The batch's end: its outcome (landed, bisected, evicted, error), its combined commit, the tip it
        left, and each step (a check run, a bisection split, a landing, an eviction) in order."""
        self._db.execute(
            "UPDATE merge_batches SET outcome = ?, combined_sha = ?, after_sha = ?, steps_json = ?,"
            " finished_at_ms = ? WHERE id = ?",
            (outcome, combined_sha, after_sha, json.dumps(list(steps)), self._db.now_ms(), batch_id),
        )

    def interrupted(self, batch_id: int) -> None:
        """A killed merge's batch, settled by the next command (its steps so far are not known)."""
        self._db.execute(
            "UPDATE merge_batches SET outcome = 'interrupted', finished_at_ms = ?"
            " WHERE id = ? AND outcome IS NULL",
            (self._db.now_ms(), batch_id),
        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._db.rows("SELECT * FROM merge_batches WHERE run_id = ? ORDER BY id", (run_id,))
        return [
            json_column(json_column(row, "members_json", "members"), "steps_json", "steps") for row in rows
        ]
