"""The ledger's `merges` table: one row per branch `stella merge` took through its queue.

A row is written when a branch's step starts (status `planned`) and closed with its outcome, so an
interrupted merge leaves a visible `planned` row behind rather than nothing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from stellafleet.core.status import MergeStatus
from stellafleet.state.ledger_reads import LedgerReads

MERGE_STATUSES = tuple(MergeStatus)


class LedgerMerges(LedgerReads):
    """The merges table's writes and reads; Ledger supplies the write transaction and the clock."""

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    _now_ms: Callable[[], int]

    def start_merge(
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
    ) -> int:
        """A `planned` row for one branch's step; returns its id."""
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO merges (run_id, task_id, branch, position, strategy, onto_ref, before_sha,"
                " status, check_command, started_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    task_id,
                    branch,
                    position,
                    strategy,
                    onto_ref,
                    before_sha,
                    str(MergeStatus.PLANNED),
                    check_command,
                    self._now_ms(),
                ),
            )
            merge_id = cursor.lastrowid
        assert merge_id is not None
        return int(merge_id)

    def finish_merge(
        self,
        merge_id: int,
        status: MergeStatus,
        *,
        after_sha: str | None = None,
        reason: str | None = None,
        files: Sequence[str] = (),
        check_tail: str | None = None,
    ) -> None:
        if status not in MERGE_STATUSES:
            raise ValueError(
                f"unknown merge status {str(status)!r}: expected one of {', '.join(MERGE_STATUSES)}"
            )
        with self._write() as conn:
            conn.execute(
                "UPDATE merges SET status = ?, after_sha = ?, reason = ?, files_json = ?, check_tail = ?,"
                " finished_at_ms = ? WHERE id = ?",
                (
                    str(status),
                    after_sha,
                    reason,
                    json.dumps(list(files)),
                    check_tail,
                    self._now_ms(),
                    merge_id,
                ),
            )

    def merged_branches(self) -> dict[str, str]:
        """branch -> the commit its last successful `stella merge` step put on the target branch."""
        rows = self._read(
            "SELECT branch, after_sha FROM merges WHERE status = ? AND after_sha IS NOT NULL ORDER BY id",
            (str(MergeStatus.MERGED),),
        )
        return {str(row[0]): str(row[1]) for row in rows}
