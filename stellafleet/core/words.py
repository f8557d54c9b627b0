"""Counts and durations in the words stella prints them with, one rule each."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """`1 task`, `2 tasks`, `0 tasks`."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def tasks_in_waves(tasks: int, waves: int, *, grows: bool = False) -> str:
    """`8 tasks in 3 waves`, and `, plus waves for emitted tasks` when a task expands at run time: every
    command counts a plan's waves this one way."""
    text = f"{plural(tasks, 'task')} in {plural(waves, 'wave')}"
    return text + (", plus waves for emitted tasks" if grows else "")


def files_named(paths: list[str], most: int = 5) -> str:
    """`1 file: a.txt`, `7 files: a, b, c, d, e and 2 more`: the count, and the first few by name."""
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return f"{plural(len(paths), 'file')}: {', '.join(paths[:most])}{more}"


def duration_text(seconds: float, *, as_set: bool = False, spaced: bool = False) -> str:
    """`2.0s`, `1m05s`, `2h03m`. as_set shows a configured amount under a minute as written (`30s`,
    `1.5s`) rather than as a measurement; spaced (`1m 05s`) is for table columns."""
    if seconds < 60:
        return f"{seconds:g}s" if as_set else f"{seconds:.1f}s"
    sep = " " if spaced else ""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{sep}{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{sep}{minutes % 60:02d}m"
