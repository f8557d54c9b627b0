"""Readying a new tree, the one way for all of them (a task's worktree, a check tree, `stella merge`'s check
tree, a Ray node's checkout): the main tree's submodules, `.worktreeinclude`, then `[worktree] setup`; a
failure is the attempt's reason, and no worker starts."""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from stellafleet.core.clock import SystemClock
from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import StellaError
from stellafleet.git import hooks, include, submodules
from stellafleet.proc import shell
from stellafleet.state.leases import PORT_VARS, LeaseHolder, LeaseStore, port_env

__all__ = ["PORT_VARS", "port_env"]  # what every tree's readying hands on
from stellafleet.state.ledger import Ledger

INDEX_VAR = "STELLA_WORKTREE_INDEX"
SALVAGE_START_VAR = "STELLA_SALVAGE_START"  # the salvage commit an isolated worktree starts from
LOCKS_FACT, PORTS_FACT = "locks", "ports"  # the attempt facts of its leases (run/steps/leases.py)


@contextlib.contextmanager
def task_leases(
    ledger: Ledger, run_id: str, task_id: str, root: Path, stop: threading.Event | None
) -> Iterator[dict[str, str]]:
    """What a check of a task's work outside its attempt (`stella merge`'s) runs with: the task's ports
    (its worktree's) in the environment yielded, its locks held (waited for) meanwhile."""
    facts = ledger.facts.of_task(run_id, task_id)
    locks, ports = facts.get(LOCKS_FACT) or [], facts.get(PORTS_FACT) or []
    if not locks:
        yield port_env(ports)
        return
    with LeaseStore.open() as store:
        holder = LeaseHolder.here(secrets.token_hex(8), root, run_id, task_id)
        if store.take(locks, holder, clock=SystemClock(), stop=stop or threading.Event()) is None:
            raise StellaError(f"stopped while waiting for the locks of task {task_id}: {', '.join(locks)}")
        try:
            yield port_env(ports)
        finally:
            store.release(holder.token)


def starts_on_salvage(env: Mapping[str, str], start_commit: str | None) -> bool:
    """Whether a worktree at start_commit starts on its task's salvage commit (--from-salvage), whose work
    then goes, staged, into the task's next commit; a stacked task's parents' commit is kept as it is."""
    return start_commit is not None and env.get(SALVAGE_START_VAR) == start_commit


class SetupFailed(StellaError):
    """The worktree could not be readied; the message is the attempt's reason, seconds how long the setup
    command ran (None: it never ran)."""

    def __init__(self, message: str, seconds: float | None = None, cpu_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.seconds = seconds
        self.cpu_seconds = cpu_seconds  # of the setup's whole tree, as far as it ran


class WorktreeIndexes:
    """Hands out the smallest number (from 1) no live worktree of the run holds; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # task id -> its number

    def take(self, task_id: str) -> int:
        with self._lock:
            if task_id in self._held:
                return self._held[task_id]
            used = set(self._held.values())
            number = next(n for n in range(1, len(used) + 2) if n not in used)
            self._held[task_id] = number
            return number

    def release(self, task_id: str) -> None:
        with self._lock:
            self._held.pop(task_id, None)


def _included(root: Path, config: WorktreeConfig) -> list[str]:
    """The `.worktreeinclude` files of root; SetupFailed naming any file over the limit."""
    paths = include.included_files(root)
    try:
        include.check_sizes(root, paths, int(config.include_max_mb * 1_000_000))
    except StellaError as exc:
        raise SetupFailed(f"setup failed: {exc}") from None
    return paths


def pack_included(root: Path, config: WorktreeConfig) -> tuple[include.Packed, ...]:
    """The `.worktreeinclude` files read to travel to a Ray node; SetupFailed before any is read."""
    return include.pack(root, _included(root, config))


def ready(
    worktree: Path,
    config: WorktreeConfig,
    env: Mapping[str, str],
    log_path: Path,
    stop: threading.Event | None = None,
    *,
    root: Path | None = None,
    init_submodules: bool = False,
    packed: tuple[include.Packed, ...] = (),
) -> shell.ShellRun | None:
    """A new worktree of root readied: the submodules root has checked out initialised in it (with
    init_submodules, `[fleet] init_submodules`), its ignored hooks folder shared, root's included files
    copied (a Ray node's checkout, with no root: the files packed for it); then the setup command (if any)
    run to its end: how it ran (None: no setup); SetupFailed with the reason (also when stop is set)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if root is not None:
            if init_submodules:
                submodules.init_in_worktree(root, worktree)
            hooks.share_relative_folder(root, worktree)
            copied = include.copy_into(root, worktree, _included(root, config))
        else:
            copied = include.unpack(packed, worktree)
    except SetupFailed:
        raise
    except StellaError as exc:  # an included file refused (a symlinked folder in the worktree)
        raise SetupFailed(f"setup failed: {exc}") from None
    if copied.files:
        shell.log_line(
            log_path, f"{include.INCLUDE_FILE}: copied {copied.files} files ({copied.bytes / 1e6:.1f} MB)"
        )
    if config.setup is None:
        return None
    timeout = config.setup_timeout
    done = shell.run_logged(
        "setup", config.setup, cwd=worktree, env=env, log_path=log_path, timeout=timeout, stop=stop
    )
    if not done.ok:
        raise SetupFailed(
            f"setup failed: {done.describe(timeout)}; see the log", done.seconds, done.cpu_seconds
        )
    return done
