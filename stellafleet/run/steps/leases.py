"""Leases: what an attempt holds of the machine (state/leases.py). Its task's named locks (`locks`), all at
once or it waits, oldest first, until its attempt is released, so they cover its worker and its check (each
check round is an attempt that takes them again); its ports (`ports`, `[resources] ports`), an isolated
task's for its worktree's life, in STELLA_PORT and STELLA_PORTS; and a private TMPDIR. Before the worktree
is readied, so its setup sees them too. Both are attempt facts (`locks`, `ports`), which `stella merge`'s
check of the branch reads (run/checking.py)."""

from __future__ import annotations

import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stellafleet.core.clock import Clock, SystemClock
from stellafleet.core.errors import StellaError
from stellafleet.core.status import AttemptEnd, AttemptOutcome, StopReason
from stellafleet.run.bootstrap import LOCKS_FACT, PORTS_FACT, port_env
from stellafleet.run.events import Emit, LockWaiting
from stellafleet.run.steps import AttemptFailed, AttemptState, AttemptStep, BeforeRun, Preflight, RunSettings
from stellafleet.state.leases import Blocked, LeaseHolder, LeaseStore, PortAsk, parse_range
from stellafleet.state.ledger import Ledger


class Leases(AttemptStep):
    def __init__(
        self, settings: RunSettings, ledger: Ledger, emit: Emit | None = None, clock: Clock | None = None
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.emit = emit  # a wait for a lock is shown while it lasts
        self.clock = clock or SystemClock()
        self._opening = threading.Lock()
        self._store: LeaseStore | None = None  # opened by the first attempt that needs it
        self._tokens: dict[int, str] = {}  # attempt id -> its leases' token, until released

    @classmethod
    def preflight(cls, before: BeforeRun) -> Preflight:
        """A bad `[resources] port_range` when ports are asked for; --dry-run's `leases`."""
        default = before.config.resources.ports
        ports = {
            task.id: n
            for task in before.plan.tasks
            if (n := task.ports if task.ports is not None else default)
        }
        locks = {task.id: list(task.locks) for task in before.plan.tasks if task.locks}
        problems: tuple[str, ...] = ()
        if ports:
            try:
                parse_range(before.config.resources.port_range)
            except ValueError as exc:
                problems = (f"config: resources: {exc}",)
        preview: dict[str, Any] = {}
        if before.dry_run:
            preview["leases"] = {
                "locks": locks,
                "ports": ports,
                "port_range": before.config.resources.port_range,
            }
        return Preflight(problems=problems, preview=preview)

    def store(self) -> LeaseStore:
        with self._opening:
            if self._store is None:
                self._store = LeaseStore.open()
            return self._store

    def before_start(self, attempt: AttemptState) -> None:
        """A private TMPDIR; the task's locks (waiting for them: AttemptFailed when the run stops first);
        its ports."""
        ctx, task = attempt.ctx, attempt.task
        if not attempt.remote:  # a node's worker has a temporary directory of its own there
            tmp = self._tmpdir(ctx.attempt_id)
            tmp.mkdir(parents=True, exist_ok=True)
            attempt.env["TMPDIR"] = str(tmp)
        count = task.ports if task.ports is not None else self.settings.config.resources.ports
        if not task.locks and not count:
            return
        token = secrets.token_hex(8)
        self._tokens[ctx.attempt_id] = token
        holder = LeaseHolder.here(token, self.settings.root, ctx.run_id, ctx.task_id)
        worktree = ctx.workspace if ctx.branch is not None and not attempt.remote else None
        ask = PortAsk(count, self._span(), worktree) if count else None
        ports = self.store().take(
            task.locks,
            holder,
            ask,
            clock=self.clock,
            stop=attempt.stopping,
            on_wait=self._waiting(ctx.task_id),
        )
        if ports is None:
            stop = "interrupted while waiting for its locks"
            raise AttemptFailed(AttemptEnd(AttemptOutcome.INTERRUPTED, stop, StopReason.INTERRUPTED.value))
        if task.locks:
            self.ledger.facts.set(ctx.attempt_id, LOCKS_FACT, list(task.locks))
        if ports:
            attempt.env.update(port_env(ports))
            self.ledger.facts.set(ctx.attempt_id, PORTS_FACT, ports)

    def _span(self) -> tuple[int, int]:
        try:
            return parse_range(self.settings.config.resources.port_range)
        except ValueError as exc:
            raise StellaError(f"config: resources: {exc}") from None

    def _waiting(self, task_id: str) -> Callable[[Blocked], None]:
        def said(blocked: Blocked) -> None:
            if self.emit is not None:
                who = blocked.holder.describe(self.settings.root, self.settings.run_id)
                self.emit(LockWaiting(task_id, blocked.lock, who, blocked.waiting))

        return said

    def _tmpdir(self, attempt_id: int) -> Path:
        return self.settings.paths.private / "tmp" / str(attempt_id)  # short: sockets made in it fit

    def released(self, attempt: AttemptState) -> None:
        """Its locks and a shared task's ports go back (a worktree keeps its own); its TMPDIR goes."""
        if attempt.context is None:
            return
        attempt_id = attempt.ctx.attempt_id
        token = self._tokens.pop(attempt_id, None)
        if token is not None:
            self.store().release(token)
        shutil.rmtree(self._tmpdir(attempt_id), ignore_errors=True)
