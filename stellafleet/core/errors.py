"""The one user-facing error type and the exit codes every command returns."""

from __future__ import annotations

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
