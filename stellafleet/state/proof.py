"""Proof that a process acts for the attempt its environment names: the secret matches the ledger's
digest and the attempt's worker is this process or an ancestor (when it can tell)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.proc.pids import descends_from, in_pid_namespace_since, pid_alive
from stellafleet.state.ledger import Ledger


def new_token() -> tuple[str, str]:
    """A fresh attempt secret and the digest the ledger keeps of it."""
    token = secrets.token_hex(16)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _refuse(why: str) -> StellaError:
    return StellaError(f"refusing to act for this attempt: {why}", exit_code=EXIT_USAGE)


def prove_attempt(ctx: WorkerContext) -> None:
    """Return when this process acts for ctx's attempt; StellaError (exit 2) saying why not otherwise."""
    named = f"attempt {ctx.attempt_id} of task {ctx.task_id!r} in run {ctx.run_id}"
    if not ctx.paths.fleet_db.exists():
        raise _refuse(f"there is no fleet ledger at {ctx.paths.fleet_db}")
    with Ledger.open(ctx.paths.fleet_db, readonly=True) as ledger:
        row = ledger.attempts.identity(ctx.attempt_id)
    if row is None or row["run_id"] != ctx.run_id or row["task_id"] != ctx.task_id:
        raise _refuse(f"{named} is not in the fleet ledger")
    if row["outcome"] != AttemptOutcome.RUNNING:
        raise _refuse(f"{named} has ended ({row['outcome']})")
    expected = row["token_sha256"]
    if not expected or not ctx.token or not hmac.compare_digest(token_digest(ctx.token), expected):
        raise _refuse(f"STELLA_ATTEMPT_PROOF is not the secret of {named}")
    worker = row["pid"]
    if worker is None or in_pid_namespace_since(row["started_at_ms"]):
        return  # the worker runs elsewhere, or we run in a sandbox made inside the attempt: the secret rules
    if not (pid_alive(worker, row["pid_started_ms"]) and descends_from(worker)):
        raise _refuse(f"this process was not started by the worker of {named} (pid {worker})")
