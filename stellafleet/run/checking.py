"""A task's check (docs/plans.md#checks): a shell command run on one commit, in a tree that holds that
commit and nothing uncommitted, under the child subreaper in its own group, so a hang, a daemon or a
double fork ends with it; only the tail of what it prints is kept."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import GitError
from stellafleet.core.paths import StatePaths
from stellafleet.git import gitops, worktrees
from stellafleet.proc import runner
from stellafleet.proc.group import stop_group
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.proc.subreaper import reaped_argv
from stellafleet.run import bootstrap
from stellafleet.state import journal

STOP_GRACE_S = 2.0
POLL_S = 0.02  # how often a running check is looked at for its end, its timeout or the run's stop
LOG_KEEP_BYTES = 1_000_000  # a check's log is cut to its last MB once it ends: megabytes of output stay out
RECORD = "check"  # its journal record: the scratch tree and the check's process, for a killed fleet's repair
# what a worker is told that a check is not: it cannot commit as the attempt, nor pass for its worker
_KEPT_STELLA = ("STELLA_ROOT", "STELLA_RUN_ID", "STELLA_TASK_ID", bootstrap.INDEX_VAR)


@dataclass(frozen=True)
class CheckRun:
    """One run of a check; exit_code None: it did not end by itself (timed out, stopped) or never ran."""

    command: str
    exit_code: int | None
    seconds: float
    commit: str | None
    tail: str  # the end of its output (with stella's own line when it did not end by itself)
    log_path: Path | None
    problem: str | None = None  # why it ran to no exit code, or did not run: the reason the task fails
    first_line: str = ""  # of its output

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.problem is None

    def failure(self) -> str:
        """The task's reason when it is red: `check failed (exit 1): FIRST LINE`."""
        if self.problem is not None:
            return f"check failed: {self.problem}"
        return f"check failed (exit {self.exit_code})" + (f": {self.first_line}" if self.first_line else "")


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a check and its tree's setup run with (a task's, `stella merge`'s): env without the git guard (a
    check's git is the real one) nor what only a worker may hold (its token, its prompt)."""
    kept = gitops.unguarded(env).items()
    return {k: v for k, v in kept if not k.startswith("STELLA_") or k in _KEPT_STELLA}


def _read_back(log_path: Path, keep: int) -> tuple[str, str]:
    """(the first line, the last keep bytes) of the log as text; the log itself cut to its last
    LOG_KEEP_BYTES."""
    size = log_path.stat().st_size
    with log_path.open("rb") as log:
        head = log.read(1000)
        log.seek(max(0, size - max(keep, LOG_KEEP_BYTES)))
        end = log.read()
    if size > LOG_KEEP_BYTES:
        cut = f"[stella] the check printed {size} bytes: its first {size - len(end)} were cut\n"
        log_path.write_bytes(cut.encode() + end)
    first = next((line.strip() for line in head.decode("utf-8", "replace").splitlines() if line.strip()), "")
    return first, end[-keep:].decode("utf-8", "replace")


def run_check(
    command: str,
    cwd: Path,
    *,
    env: Mapping[str, str],
    timeout: float,
    log_path: Path,
    tail_bytes: int,
    commit: str | None = None,
    stop: threading.Event | None = None,
    on_start: Callable[[int], None] | None = None,
    main_tree: Path | None = None,
) -> CheckRun:
    """command run through /bin/sh -c in cwd with exactly env, its output in log_path, until it ends, its
    timeout passes or stop is set; whatever it left running is stopped with its group in any case. What
    it changed in main_tree (the repository's own tree, which it is not checking) is said in its log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    before = set(gitops.status_porcelain(main_tree)) if main_tree is not None else set()
    started = time.monotonic()
    try:
        with log_path.open("wb") as log:
            proc = runner.start(
                reaped_argv(["/bin/sh", "-c", command]), cwd=cwd, env=env, stdout=log, stderr=runner.STDOUT
            )
    except OSError as exc:
        return CheckRun(command, None, 0.0, commit, "", log_path, f"could not start /bin/sh: {exc}")
    with proc:
        try:
            if on_start is not None:
                on_start(proc.pid)
            while proc.poll() is None and not stop.is_set() and time.monotonic() - started < timeout:
                stop.wait(POLL_S)
            code = proc.poll()
        finally:  # its group (a daemon it forked too) goes, when it exited by itself or on Ctrl-C too
            proc.stop(STOP_GRACE_S)
    seconds = time.monotonic() - started
    problem = None
    if code is None:
        why = "the run is being stopped" if stop.is_set() else f"check_timeout is {timeout:g} s"
        problem = f"stopped after {seconds:.1f} s: {why}"
        _say(log_path, problem)
    if main_tree is not None and (wrote := set(gitops.status_porcelain(main_tree)) - before):
        shown = " ".join(sorted(line[3:] for line in wrote)[:5])
        _say(log_path, f"warning: the main tree changed while the check ran (it runs in {cwd}): {shown}")
    first, tail = _read_back(log_path, tail_bytes)
    return CheckRun(command, code, seconds, commit, tail, log_path, problem, first)


def _say(log_path: Path, text: str) -> None:
    """A line of stella's own at the end of a check's log, even after output with no newline."""
    with log_path.open("rb+") as log:
        log.seek(max(log_path.stat().st_size - 1, 0))
        ended = log.read(1) in (b"", b"\n")
        log.write(("" if ended else "\n").encode() + f"[stella] {text}\n".encode())


def not_run(command: str, problem: str, commit: str | None = None) -> CheckRun:
    """A check that could not count, said as its failure (`uncommitted changes: a.txt`)."""
    return CheckRun(command, None, 0.0, commit, problem, None, problem)


class Tracked:
    """The journal record of one check: its scratch tree (if any) and its process, while it runs."""

    def __init__(self, root: Path) -> None:
        self.owner = journal.owner(root)
        self.name = f"{RECORD}-{os.urandom(4).hex()}"
        self.fields: dict[str, Any] = {}

    def note(self, **fields: Any) -> None:
        self.fields.update(fields)
        self.owner.write(self.name, RECORD, **self.fields)

    def started(self, pid: int) -> None:
        who = ProcessIdentity.of(pid)
        self.note(check=None if who is None else [who.pid, who.started_at])

    def drop(self) -> None:
        self.owner.drop(self.name)


@contextlib.contextmanager
def tracked(root: Path) -> Iterator[Tracked]:
    record = Tracked(root)
    record.note()
    try:
        yield record
    finally:
        record.drop()


@contextlib.contextmanager
def check_tree(
    root: Path,
    commit: str,
    config: WorktreeConfig,
    env: Mapping[str, str],
    log_path: Path,
    record: Tracked,
    stop: threading.Event | None = None,
) -> Iterator[Path]:
    """A fresh detached worktree at commit, readied as every worktree is (`.worktreeinclude`, then
    `[worktree] setup`: bootstrap.SetupFailed if it cannot be); removed once the body is done."""
    base = StatePaths(root).private / "checks"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="tree-", dir=base))
    record.note(path=str(path))
    try:
        worktrees.worktree_add(root, path, None, commit)
        bootstrap.ready(path, config, env, log_path, stop, root=root)
        yield path
    finally:
        _remove_tree(root, path)


def _remove_tree(root: Path, path: Path) -> None:
    with contextlib.suppress(GitError):  # what git does not remove goes below in any case
        worktrees.worktree_remove(root, path, force=True)
    shutil.rmtree(path, ignore_errors=True)


def repair(root: Path, records: list[journal.Record]) -> bool:
    """A killed fleet's or merge's check: its process stopped, its scratch tree removed."""
    for record in records:
        check, path, said = record.data.get("check"), record.data.get("path"), []
        if check:
            who = ProcessIdentity(int(check[0]), float(check[1]))
            if who.is_alive():
                stop_group(who.pid, STOP_GRACE_S)  # in a session of its own: its group is its pid
                said.append(f"its check (pid {who.pid}) stopped")
        if isinstance(path, str) and Path(path).is_absolute():
            _remove_tree(root, Path(path))
            said.append(f"its check tree {path} removed")
        if said:
            print(
                f"stella: a killed stella process (pid {record.data.get('pid')}): {'; '.join(said)}",
                file=sys.stderr,
            )
    return True
