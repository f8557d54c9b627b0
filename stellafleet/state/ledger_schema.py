"""The fleet ledger's DDL and forward migrations, which only ever add tables or columns."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from stellafleet.state.sqlitefile import Schema

_V1 = (
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER,
        status TEXT NOT NULL DEFAULT 'running',
        plan_path TEXT,
        plan_sha256 TEXT,
        base_ref TEXT,
        base_commit TEXT,
        max_concurrency INTEGER,
        spend_limit_usd REAL,
        spend_usd REAL NOT NULL DEFAULT 0,
        pipeline TEXT,
        argv TEXT,
        root TEXT,
        pid INTEGER,
        exit_code INTEGER,
        reason TEXT
    )""",
    "CREATE INDEX runs_by_created ON runs(created_at_ms, id)",
    """CREATE TABLE tasks (
        run_id TEXT NOT NULL,
        id TEXT NOT NULL,
        title TEXT,
        prompt TEXT,
        depends_on_json TEXT NOT NULL DEFAULT '[]',
        claims_json TEXT NOT NULL DEFAULT '[]',
        isolation TEXT NOT NULL DEFAULT 'shared',
        wave INTEGER,
        status TEXT NOT NULL DEFAULT 'pending',
        reason TEXT,
        pipeline TEXT,
        model TEXT,
        timeout_s REAL,
        branch TEXT,
        worktree TEXT,
        PRIMARY KEY (run_id, id)
    )""",
    """CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER,
        success INTEGER,
        outcome TEXT NOT NULL DEFAULT 'running',
        branch TEXT,
        worktree TEXT,
        pid INTEGER,
        exit_code INTEGER,
        spend_usd REAL NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        summary TEXT,
        error TEXT,
        cpu_seconds REAL,
        peak_rss_bytes INTEGER,
        pipeline TEXT,
        log_path TEXT,
        transcript_path TEXT
    )""",
    "CREATE INDEX attempts_by_run ON attempts(run_id, task_id)",
    """CREATE TABLE commits (
        sha TEXT NOT NULL,
        run_id TEXT NOT NULL,
        task_id TEXT,
        attempt_id INTEGER,
        branch TEXT,
        message TEXT,
        committed_at_ms INTEGER,
        PRIMARY KEY (run_id, sha)
    )""",
    """CREATE TABLE ci (
        run_id TEXT NOT NULL,
        branch TEXT NOT NULL,
        task_id TEXT,
        head_sha TEXT,
        pr_url TEXT,
        pr_number INTEGER,
        state TEXT,
        conclusion TEXT,
        reason TEXT,
        run_urls_json TEXT NOT NULL DEFAULT '[]',
        updated_at_ms INTEGER,
        PRIMARY KEY (run_id, branch)
    )""",
    """CREATE TABLE cleanups (
        id INTEGER PRIMARY KEY,
        run_id TEXT,
        task_id TEXT,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT,
        at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX cleanups_by_run ON cleanups(run_id)",
    """CREATE TABLE spend_events (
        id INTEGER PRIMARY KEY,
        attempt_id INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        usd REAL NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX spend_events_by_attempt ON spend_events(attempt_id)",
    "CREATE INDEX spend_events_by_run ON spend_events(run_id)",
)

_V2 = (
    "ALTER TABLE runs ADD COLUMN schedule TEXT",
    "ALTER TABLE runs ADD COLUMN resumed_from TEXT",
    "ALTER TABLE runs ADD COLUMN executor TEXT",
    "ALTER TABLE attempts ADD COLUMN node TEXT",
    "ALTER TABLE attempts ADD COLUMN reason TEXT",
    "ALTER TABLE attempts ADD COLUMN token_sha256 TEXT",
    "ALTER TABLE attempts ADD COLUMN last_progress_ms INTEGER",
    "ALTER TABLE spend_events ADD COLUMN seq INTEGER",
    "CREATE UNIQUE INDEX spend_events_by_seq ON spend_events(attempt_id, seq) WHERE seq IS NOT NULL",
    """CREATE TABLE merges (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task_id TEXT,
        branch TEXT NOT NULL,
        position INTEGER,
        strategy TEXT,
        onto_ref TEXT,
        before_sha TEXT,
        after_sha TEXT,
        status TEXT NOT NULL,
        reason TEXT,
        files_json TEXT NOT NULL DEFAULT '[]',
        check_command TEXT,
        check_tail TEXT,
        started_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER
    )""",
    "CREATE INDEX merges_by_run ON merges(run_id, branch)",
)

_V3 = (
    """CREATE TABLE limit_events (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt_id INTEGER,
        task_id TEXT,
        at_ms INTEGER NOT NULL,
        source TEXT NOT NULL,
        kind TEXT NOT NULL,
        status INTEGER,
        reset_at_ms INTEGER,
        message TEXT,
        concurrency INTEGER
    )""",
    "CREATE INDEX limit_events_by_run ON limit_events(run_id, id)",
    "ALTER TABLE attempts ADD COLUMN guard_usd REAL",
    "ALTER TABLE attempts ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE attempts ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE spend_events ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE spend_events ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0",
)

_V4 = (
    "ALTER TABLE tasks ADD COLUMN expands INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE tasks ADD COLUMN parent_id TEXT",
    "ALTER TABLE tasks ADD COLUMN fragment_path TEXT",
)

_V5 = (
    "ALTER TABLE attempts ADD COLUMN setup_ms INTEGER",
    "ALTER TABLE attempts ADD COLUMN salvage_ref TEXT",
    "ALTER TABLE attempts ADD COLUMN salvage_sha TEXT",
)

_V6 = (
    "ALTER TABLE tasks ADD COLUMN base TEXT NOT NULL DEFAULT 'pinned'",
    "ALTER TABLE tasks ADD COLUMN stale TEXT",
    "ALTER TABLE attempts ADD COLUMN start_commit TEXT",
    "ALTER TABLE attempts ADD COLUMN start_parents_json TEXT NOT NULL DEFAULT '[]'",
)

_V7 = (
    """CREATE TABLE checks (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        attempt_id INTEGER,
        merge_id INTEGER,
        phase TEXT NOT NULL,
        command TEXT NOT NULL,
        exit_code INTEGER,
        passed INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL,
        commit_sha TEXT,
        output_tail TEXT,
        log_path TEXT,
        at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX checks_by_run ON checks(run_id, attempt_id)",
    "ALTER TABLE tasks ADD COLUMN check_command TEXT",
    "ALTER TABLE tasks ADD COLUMN check_timeout_s REAL",
)

_V8 = ("ALTER TABLE attempts ADD COLUMN unclaimed_writes TEXT",)

_V9 = ("ALTER TABLE attempts ADD COLUMN worktree_index INTEGER",)  # its STELLA_WORKTREE_INDEX, for teardown

_V10 = ("ALTER TABLE attempts ADD COLUMN setup_started_ms INTEGER",)  # a setup runs until setup_ms is set

# Follow-ups are requests, what an attempt learns is a fact (docs/ledger.md). A ledger that predates them
# gets a needs_you request for each task that failed and each branch whose CI ended red. And a worker's
# start time beside its pid.
_V11 = (
    """CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        task_id TEXT,
        branch TEXT,
        reason TEXT NOT NULL,
        context TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        asked_by TEXT NOT NULL,
        asked_at_ms INTEGER NOT NULL,
        from_attempt_id INTEGER,
        start_at TEXT,
        not_before_ms INTEGER,
        taken_at_ms INTEGER,
        attempt_id INTEGER,
        ended_at_ms INTEGER,
        why TEXT
    )""",
    "CREATE INDEX requests_by_run ON requests(run_id, task_id, id)",
    """CREATE TABLE attempt_facts (
        attempt_id INTEGER NOT NULL,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        PRIMARY KEY (attempt_id, key)
    )""",
    """INSERT INTO requests (run_id, task_id, reason, context, state, asked_by, asked_at_ms, from_attempt_id)
        SELECT t.run_id, t.id, 'retry', COALESCE(t.reason, ''), 'needs_you', 'ledger upgrade',
               COALESCE(a.finished_at_ms, a.started_at_ms, 0), a.id
          FROM tasks t LEFT JOIN attempts a ON a.id = (
               SELECT MAX(id) FROM attempts WHERE run_id = t.run_id AND task_id = t.id)
         WHERE t.status IN ('failed', 'interrupted', 'stalled', 'abandoned')""",
    """INSERT INTO requests (run_id, task_id, branch, reason, context, state, asked_by, asked_at_ms)
        SELECT run_id, task_id, branch, 'ci-fix', COALESCE(conclusion, reason, ''), 'needs_you',
               'ledger upgrade', COALESCE(updated_at_ms, 0)
          FROM ci WHERE state = 'red'""",
    # the worker's start time, so a reused pid is never taken for it (an older row: its attempt's start)
    "ALTER TABLE attempts ADD COLUMN pid_started_ms INTEGER",
    "UPDATE attempts SET pid_started_ms = started_at_ms WHERE pid IS NOT NULL",
)

# the merge train (docs/merge.md#the-train): one row per batch, and each merges row names its batch
_V12 = (
    """CREATE TABLE merge_batches (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        number INTEGER NOT NULL,
        window INTEGER NOT NULL,
        members_json TEXT NOT NULL DEFAULT '[]',
        onto_ref TEXT,
        before_sha TEXT,
        combined_sha TEXT,
        after_sha TEXT,
        steps_json TEXT NOT NULL DEFAULT '[]',
        outcome TEXT,
        started_at_ms INTEGER NOT NULL,
        finished_at_ms INTEGER
    )""",
    "CREATE INDEX merge_batches_by_run ON merge_batches(run_id, id)",
    "ALTER TABLE merges ADD COLUMN batch_id INTEGER",
)

# A person's answer to a parked task's request (`stella answer`): what (allow, deny or text), who, when.
_V13 = (
    "ALTER TABLE requests ADD COLUMN answer_kind TEXT",
    "ALTER TABLE requests ADD COLUMN answer TEXT",
    "ALTER TABLE requests ADD COLUMN answered_by TEXT",
    "ALTER TABLE requests ADD COLUMN answered_at_ms INTEGER",
)

# MIGRATIONS[n] takes a ledger from user_version n to n + 1. Append, never edit.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V10,
    _V11,
    _V12,
    _V13,
)

LEDGER_SCHEMA = Schema(label="fleet ledger", application_id=0x53544C46, migrations=MIGRATIONS)  # "STLF"


def check_choice(kind: str, value: str, allowed: Iterable[str]) -> str:
    """value as the plain text the ledger stores; ValueError unless it is one of allowed (a status type:
    its values are what the status column accepts, as docs/ledger.md lists them)."""
    choices = [str(choice) for choice in allowed]
    if value not in choices:
        raise ValueError(f"unknown {kind} {str(value)!r}: expected one of {', '.join(choices)}")
    return str(value)


def json_column(row: dict[str, Any], column: str, key: str) -> dict[str, Any]:
    """row with its JSON list column decoded under key (the column itself stays)."""
    row[key] = json.loads(row[column] or "[]")
    return row
