"""The one user-facing error type and the exit codes every command returns."""

from __future__ import annotations

import errno
import sqlite3

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_USAGE = 2
EXIT_SPEND_LIMIT = 3
EXIT_WATCH_RED = 4
EXIT_PARKED = 5  # only tasks waiting on a person (and their dependents) remain
EXIT_INTERRUPTED = 130


class StellaError(Exception):
    """An error the user can act on: printed as one line, never as a traceback."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class PlanError(StellaError):
    """A plan that cannot run; carries every problem found, each a full line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ClaimConflict(StellaError):
    """A path is held by another live attempt (the message names it and its holder)."""

    exit_code = EXIT_TASK_FAILED


class GitError(StellaError):
    """A git command failed; the message carries git's own words."""


class DiskFull(StellaError):
    """The file system under a path stella writes is full: the run stops and says so, never a bug."""

    def __init__(self, path: object, run_id: str | None = None) -> None:
        then = f"stella fleet --resume {run_id}" if run_id else "run the command again"
        super().__init__(f"disk full at {path}: free space, then {then}")
        self.path = path


SQLITE_FULL = 13


def is_disk_full(exc: BaseException) -> bool:
    """Whether exc is a full disk: SQLite's "database or disk is full", ENOSPC, or git's words for it."""
    if isinstance(exc, DiskFull):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "disk is full" in str(exc)
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return isinstance(exc, GitError) and "No space left on device" in exc.message
