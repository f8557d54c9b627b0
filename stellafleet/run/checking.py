"""A task's check (docs/plans.md#checks): a shell command run on one commit, in a tree that holds that
commit and nothing uncommitted, under the child subreaper in its own group, so a hang, a daemon or a
double fork ends with it; only the tail of what it prints is kept."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import GitError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import CheckPhase
from stellafleet.git import checkedtree, gitops, hookstash, worktrees
from stellafleet.proc import runner, shell
from stellafleet.proc.group import stop_group
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.proc.subreaper import reaped_argv
from stellafleet.run import bootstrap
from stellafleet.state import journal
from stellafleet.state.ledger import Ledger

STOP_GRACE_S = 2.0
POLL_S = 0.02  # how often a running check is looked at for its end, its timeout or the run's stop
LOG_KEEP_BYTES = 1_000_000  # a check's log is cut to its last MB once it ends: megabytes of output stay out
NO_COMMITS = "no commits: the task committed nothing for its check"
RECORD = "check"  # its journal record: the scratch tree and the check's process, for a killed fleet's repair
# what a worker is told that a check is not: it cannot commit as the attempt, nor pass for its worker
_KEPT_STELLA = ("STELLA_ROOT", "STELLA_RUN_ID", "STELLA_TASK_ID", bootstrap.INDEX_VAR, *bootstrap.PORT_VARS)
# terminal colour and cursor codes (CSI), and titles and links (OSC): kept in the log, out of the ledger
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# a line that says a test or a build failed: its marker first (jest/vitest FAIL, ×, pytest's E, go's
# --- FAIL, an `Error:`, `error[E0308]:`), else those words anywhere in it
_FAILURE_START = re.compile(
    r"^(?:FAIL(?:ED)?\b|--- FAIL\b|[×✗✕✘]|not ok\b|E\s|\w*(?:Error|Exception)\b|error\b"
    r"|Traceback\b|fatal\b|panic)"
)
_FAILURE_WORD = re.compile(r"\b(?:fail(?:s|ed|ure|ing)?|errors?|panicked)\b", re.IGNORECASE)
HEAD_BYTES = 64_000  # of a long output, where the line that says why it failed is looked for too


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
    reason_line: str = ""  # the line of its output that says why it failed (or its last one)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.problem is None

    def failure(self) -> str:
        """The task's reason when it is red: `check failed (exit 1): FIRST LINE`."""
        if self.problem is not None:
            return f"check failed: {self.problem}"
        return f"check failed (exit {self.exit_code})" + (f": {self.reason_line}" if self.reason_line else "")


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a check and its tree's setup run with (a task's, `stella merge`'s): env without the git guard (a
    check's git is the real one) nor what only a worker may hold (its token, its prompt)."""
    kept = gitops.unguarded(env).items()
    return {k: v for k, v in kept if not k.startswith("STELLA_") or k in _KEPT_STELLA}


def plain(text: str) -> str:
    """text without terminal colour codes."""
    return _ANSI.sub("", text)


def reason_line(output: str) -> str:
    """The line of a check's output that says why it failed: the first that starts as a failure does, else
    the first that names one, else the last non-empty line."""
    lines = [line.strip() for line in plain(output).splitlines() if line.strip()]
    for looks_failed in (_FAILURE_START.match, _FAILURE_WORD.search):
        found = next((line for line in lines if looks_failed(line)), None)
        if found is not None:
            return found
    return lines[-1] if lines else ""


def _read_back(log_path: Path, keep: int) -> tuple[str, str]:
    """(the line that says why it failed, the last keep bytes) of the log as text without colour codes; the
    log itself cut to its last LOG_KEEP_BYTES."""
    size = log_path.stat().st_size
    with log_path.open("rb") as log:
        head = log.read(HEAD_BYTES) if size > LOG_KEEP_BYTES else b""
        log.seek(max(0, size - max(keep, LOG_KEEP_BYTES)))
        end = log.read()
    if size > LOG_KEEP_BYTES:
        cut = f"[stella] the check printed {size} bytes: its first {size - len(end)} were cut\n"
        log_path.write_bytes(cut.encode() + end)
    said = (head + b"\n" + end).decode("utf-8", "replace")
    said = "\n".join(line for line in said.splitlines() if not line.startswith("[stella] "))
    return reason_line(said), plain(end[-keep:].decode("utf-8", "replace"))


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
        _say(
            log_path,
            f"warning: the main tree changed while the check ran (by it or by another process; it runs in "
            f"{cwd}): {shown}",
        )
    reason, tail = _read_back(log_path, tail_bytes)
    return CheckRun(command, code, seconds, commit, tail, log_path, problem, reason)


def _say(log_path: Path, text: str) -> None:
    """A line of stella's own at the end of a check's log, even after output with no newline."""
    with log_path.open("rb+") as log:
        log.seek(max(log_path.stat().st_size - 1, 0))
        ended = log.read(1) in (b"", b"\n")
        log.write(("" if ended else "\n").encode() + f"[stella] {text}\n".encode())


def _noted(run: CheckRun, text: str) -> CheckRun:
    """run with a line of stella's own at the end of its log and of its tail (its ledger row's)."""
    if run.log_path is not None:
        _say(run.log_path, text)
    newline = "" if not run.tail or run.tail.endswith("\n") else "\n"
    return replace(run, tail=f"{run.tail}{newline}[stella] {text}\n")


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


@dataclass(frozen=True)
class CheckRow:
    """Whose check it is, as its row of the ledger's checks names it: an attempt's, or a merge step's."""

    run_id: str
    task_id: str
    phase: CheckPhase
    attempt_id: int | None = None
    merge_id: int | None = None


@dataclass(frozen=True)
class Command:
    """One check command to run: its timeout, and the log it prints into."""

    command: str
    timeout: float
    log_path: Path
    notes: Sequence[str] = field(default_factory=tuple)  # lines of stella's own its record ends with


@dataclass(frozen=True)
class FreshTree:
    """A fresh check tree, readied as every new worktree is (run/bootstrap.py): `[worktree]`, `[fleet]
    init_submodules` and the environment its setup runs with."""

    config: WorktreeConfig
    submodules: bool  # [fleet] init_submodules
    setup_env: Mapping[str, str]

    def add(self, root: Path, path: Path, commit: str, log_path: Path, stop: threading.Event | None) -> None:
        """The check tree at path: detached at commit, readied (bootstrap.SetupFailed if it cannot be)."""
        worktrees.worktree_add(root, path, None, commit)
        bootstrap.ready(
            path, self.config, self.setup_env, log_path, stop, root=root, init_submodules=self.submodules
        )


def recorded(ledger: Ledger, row: CheckRow, run: CheckRun, said_in: Path) -> CheckRun:
    """run as its row of the ledger's checks, and said in a line of said_in (the task's or merge's log)."""
    how = "passed" if run.passed else run.failure().removeprefix("check ")
    on = f" on {run.commit[:12]}" if run.commit else ""
    shell.log_line(said_in, f"check ({row.phase}){on}: {how} in {run.seconds:.1f} s; its log: {run.log_path}")
    ledger.checks.add(
        run_id=row.run_id,
        task_id=row.task_id,
        attempt_id=row.attempt_id,
        merge_id=row.merge_id,
        phase=row.phase,
        command=run.command,
        exit_code=run.exit_code,
        duration_ms=round(run.seconds * 1000),
        commit=run.commit,
        output_tail=run.tail,
        log_path=str(run.log_path) if run.log_path else None,
        passed=run.passed,
    )
    return run


def run_and_record(
    ledger: Ledger,
    row: CheckRow,
    commands: Sequence[Command],
    commit: str,
    *,
    tree: Path | FreshTree,
    root: Path,
    env: Mapping[str, str],
    log_path: Path,
    tail_bytes: int,
    stop: threading.Event | None = None,
) -> list[CheckRun]:
    """Each command in turn on commit, up to the first red one, in tree (one that holds commit) or a fresh
    detached worktree of root at commit, readied as every worktree is and removed afterwards (one that
    cannot be readied fails the first command). Each run is recorded: a ledger row, a line of log_path
    (the task's or the merge's log, where a fresh tree's setup writes too)."""
    runs: list[CheckRun] = []
    # a merge's check holds its task's locks and sees its ports, as the task's own check did in its attempt
    leases = bootstrap.task_leases(ledger, row.run_id, row.task_id, root, stop) if row.merge_id else None
    with tracked(root) as record, leases or contextlib.nullcontext({}) as leased:
        env = {**env, **leased}
        if isinstance(tree, FreshTree):
            tree = replace(tree, setup_env={**tree.setup_env, **leased})
        where = tree if isinstance(tree, Path) else _scratch(root, record)
        try:
            if isinstance(tree, FreshTree):
                tree.add(root, where, commit, log_path, stop)
            for check in commands:
                run = _guarded_run(
                    check, where, root, env=env, tail_bytes=tail_bytes, commit=commit, stop=stop,
                    record=record, in_place=isinstance(tree, Path),
                )  # fmt: skip
                runs.append(recorded(ledger, row, run, log_path))
                if not run.passed:
                    break
        except bootstrap.SetupFailed as exc:
            failed = not_run(commands[0].command, f"its check tree: {exc}", commit)
            runs.append(recorded(ledger, row, failed, log_path))
        finally:
            if isinstance(tree, FreshTree):
                _remove_tree(root, where)
    return runs


def _guarded_run(
    check: Command,
    where: Path,
    root: Path,
    *,
    env: Mapping[str, str],
    tail_bytes: int,
    commit: str,
    stop: threading.Event | None,
    record: Tracked,
    in_place: bool,
) -> CheckRun:
    """check run in where, the stash kept as it was; a task's own worktree (in_place, not a fresh tree) also
    put back as the check found it: a change to it fails the check by name (git/checkedtree.py)."""
    was = checkedtree.state_of(where) if in_place else None
    if was is not None:  # a killed fleet's repair puts it back too
        record.note(tree=str(where), branch=was.branch, commit=was.commit)
    lock = StatePaths(root).private / hookstash.LOCK_NAME
    stash = checkedtree.stash_list(root, lock, where)
    run = run_check(
        check.command, where, env=env, timeout=check.timeout, log_path=check.log_path,
        tail_bytes=tail_bytes, commit=commit, stop=stop, on_start=record.started, main_tree=root,
    )  # fmt: skip
    for note in check.notes:
        run = _noted(run, note)
    if checkedtree.stash_put_back(root, lock, stash, where):
        run = _noted(
            run, "the check changed the stash list (every worktree's, yours too): put back as it was"
        )
    if was is None:
        return run
    try:
        put = checkedtree.put_back(root, was)
    except GitError as exc:  # a lock it left, a tree git cannot read: said, and the task fails
        put = checkedtree.PutBack([f"stella could not put back what the check changed: {exc}"], [])
    if put.removed:
        shown = " ".join(put.removed[:5]) + (
            f" and {len(put.removed) - 5} more" if len(put.removed) > 5 else ""
        )
        run = _noted(run, f"removed what the check left untracked: {shown}")
    if not put.changed:
        return run
    named = "; ".join(put.changed)
    run = _noted(run, f"{named}: put back")
    return replace(run, problem=named if run.problem is None else f"{named}; {run.problem}")


def _scratch(root: Path, record: Tracked) -> Path:
    """A new folder for a check tree, named in the check's journal record (a killed stella's goes too)."""
    base = StatePaths(root).private / "checks"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="tree-", dir=base))
    record.note(path=str(path))
    return path


def _remove_tree(root: Path, path: Path) -> None:
    with contextlib.suppress(GitError):  # what git does not remove goes below in any case
        worktrees.worktree_remove(root, path, force=True)
    shutil.rmtree(path, ignore_errors=True)


def _worktree_put_back(root: Path, data: dict[str, Any]) -> list[str]:
    """The task's worktree a killed check ran in, as the check found it (what it left untracked stays:
    which files were there before is not known)."""
    tree, commit, branch = data.get("tree"), data.get("commit"), data.get("branch")
    if not isinstance(tree, str) or not isinstance(commit, str):
        return []
    try:
        left = checkedtree.untracked_files(Path(tree)) if (Path(tree) / ".git").exists() else set()
        was = checkedtree.TreeState(Path(tree), branch, commit, frozenset(), frozenset(left))
        changed = checkedtree.put_back(root, was).changed
    except GitError as exc:
        return [f"its worktree {tree} could not be put back: {exc}"]
    return [f"{'; '.join(changed)}: put back"] if changed else []


def repair(root: Path, records: list[journal.Record]) -> bool:
    """A killed fleet's or merge's check: its process stopped, its scratch tree removed, the task's worktree
    it ran in put back."""
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
        said += _worktree_put_back(root, record.data)
        if said:
            print(
                f"stella: a killed stella process (pid {record.data.get('pid')}): {'; '.join(said)}",
                file=sys.stderr,
            )
    return True
