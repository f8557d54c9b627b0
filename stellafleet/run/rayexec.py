"""RayExecutor: isolated tasks as Ray tasks on a cluster; shared tasks stay on this machine.
This process stays the only writer of the ledger and repository; Ray retries nothing (docs/scale-out.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stellafleet.core.config import ENV_KEYS, config_files
from stellafleet.core.errors import EXIT_USAGE, StellaError
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, Stop, StopReason
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import bundle
from stellafleet.proc.tree import Exit
from stellafleet.run.bootstrap import INDEX_VAR, SALVAGE_START_VAR, SetupFailed, pack_included
from stellafleet.run.executor import Attempt, Execution, Executor, LocalExecutor, attempt_end
from stellafleet.run.prepare import Prepared, check_ray_installed
from stellafleet.run.raytask import RemoteSpec, remote_attempt
from stellafleet.state.ledger import Ledger

log = logging.getLogger(__name__)
LOST = Exit(-9, 0.0, 0)  # what a worker whose node or Ray worker went away is recorded as


def connect(address: str | None) -> Any:
    """The ray module, connected to the cluster at address ($RAY_ADDRESS, else one on this machine)."""
    check_ray_installed()
    import ray

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    _cluster_errors_to_stderr()
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's own start-up chatter is not ours to show
    try:
        ray.init(
            address=target,
            log_to_driver=False,  # the workers' output comes back as log events, into the task's log
            logging_level=logging.ERROR,
            ignore_reinit_error=True,
        )
    except Exception as exc:
        raise StellaError(
            f"cannot reach the Ray cluster at {target}: {_first_line(exc)} (start one with "
            "`ray start --head`, or name it with --ray-address HOST:PORT)",
            exit_code=EXIT_USAGE,
        ) from None
    return ray


def _cluster_errors_to_stderr() -> None:
    """Ray's driver prints the cluster's errors on stdout, where `--json` writes its one document: send
    them to stderr."""
    module = sys.modules.get("ray._private.worker")
    original = getattr(module, "print_to_stdstream", None)
    if module is None or original is None or getattr(original, "_stella", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._stella = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr  # type: ignore[attr-defined]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class RayExecutor:
    """Isolated attempts on the Ray cluster, every other one on the local executor."""

    def __init__(self, ray: Any, prepared: Prepared, local: Executor, scratch: Path, base: Any) -> None:
        self._ray = ray
        self._p = prepared
        self._local = local
        self._scratch = scratch
        self._base = base  # the ObjectRef of the base bundle: put once, read by every remote attempt
        self._remote = ray.remote(num_returns="streaming", max_retries=0, num_cpus=0)(remote_attempt)
        self._lock = threading.Lock()
        self._ledger: Ledger | None = None
        files = config_files(prepared.root, config_file=prepared.config_file)
        # the config files this run reads, as text, for the node to read the same way
        self._layers = tuple(
            ("user" if file.kind == "user" else "project", file.path.read_text())
            for file in files
            if file.path.is_file()
        )
        self._checked: set[str] = set()

    @classmethod
    def open(cls, prepared: Prepared, *, local: Executor) -> RayExecutor:
        """Connect, and put the bundle of the pinned base into the object store (closing local on failure)."""
        try:
            ray = connect(prepared.executor.address)
            scratch = Path(tempfile.mkdtemp(prefix="stella-ray-"))
            path = scratch / "base.bundle"
            bundle.create_base(prepared.root, prepared.base_commit, path, tag=prepared.run_id)
            base = ray.put(path.read_bytes())
        except BaseException:
            local.close()
            raise
        return cls(ray, prepared, local, scratch, base)

    def runs_remotely(self, context: WorkerContext) -> bool:
        return context.isolation == "isolated"

    def ledger(self) -> Ledger:
        with self._lock:
            if self._ledger is None:
                self._ledger = Ledger.open(StatePaths(self._p.root).fleet_db)
                self._ledger.runs.set_executor(self._p.run_id, "ray")
            return self._ledger

    def start(self, attempt: Attempt) -> Execution:
        ledger = self.ledger()
        ctx = attempt.context
        if not self.runs_remotely(ctx):
            return self._local.start(attempt)
        resources = self._p.executor.resources_for(ctx.task_id)
        self._check_resources(resources)
        try:  # the `.worktreeinclude` files only when [executor] send_worktreeinclude asks (often secrets)
            included = (
                pack_included(self._p.root, self._p.config.worktree)
                if self._p.executor.send_worktreeinclude
                else ()
            )
        except SetupFailed as exc:  # a file over the limit: refused by name, as for a local worktree
            refused = self._ray.put({"kind": "finished", "end": AttemptEnd.failed(str(exc))})
            return RayExecution(self, [refused], ctx, ledger)
        spec = RemoteSpec(
            context=ctx,
            config_layers=self._layers,
            env={
                **{key: os.environ[key] for key in ENV_KEYS if os.environ.get(key)},
                **{key: attempt.env[key] for key in (INDEX_VAR, SALVAGE_START_VAR) if key in attempt.env},
            },
            stop_grace_s=self._p.config.fleet.stop_grace,
            included=included,
            start=self._start_point(ctx),
        )
        generator = self._remote.options(resources=resources).remote(spec, self._base)
        return RayExecution(self, generator, ctx, ledger)

    def _start_point(self, ctx: WorkerContext) -> bytes | None:
        """A bundle of the commit the task starts from past the base (its parents' work, a salvage commit);
        None: the base."""
        start = ctx.start_commit
        if start is None or start == ctx.base_commit:
            return None
        with self._bundle_file(ctx, "start") as path:
            bundle.create_start(
                self._p.root, start, ctx.base_commit, path, tag=f"{self._p.run_id}-{ctx.attempt_id}"
            )
            return path.read_bytes()

    @contextlib.contextmanager
    def _bundle_file(self, ctx: WorkerContext, kind: str, data: bytes | None = None) -> Iterator[Path]:
        """A scratch file for one attempt's bundle (holding data, if given), deleted after."""
        path = self._scratch / f"{ctx.task_id}-{ctx.attempt_id}.{kind}.bundle"
        if data is not None:
            path.write_bytes(data)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def _check_resources(self, resources: dict[str, float]) -> None:
        """A resource no node has would leave the task waiting forever: refuse it now, by name."""
        missing = [name for name in resources if name not in self._checked]
        if not missing:
            return
        have = self._ray.cluster_resources()
        for name in missing:
            if have.get(name, 0) < resources[name]:
                raise StellaError(
                    f"no node of the Ray cluster has the resource {name} (amount {resources[name]:g}): "
                    f"start nodes with --resources '{{\"{name}\": N}}' (see docs/scale-out.md)"
                )
            self._checked.add(name)

    def fetch_branch(self, bundle_bytes: bytes | None, ctx: WorkerContext) -> None:
        """Create the task's branch here: what the node sent back, or the base when nothing was."""
        assert ctx.branch is not None
        with self._lock:  # one fetch into the repository at a time
            if bundle_bytes is None:
                bundle.fetch_branch(self._p.root, None, ctx.branch, ctx.base_commit)
                return
            with self._bundle_file(ctx, "branch", bundle_bytes) as path:
                bundle.fetch_branch(self._p.root, path, ctx.branch, ctx.base_commit)

    def fetch_salvage(self, salvaged: dict[str, Any], ctx: WorkerContext) -> bool:
        """The node's salvage commit into the repository under its ref; False, logged, when git refuses it."""
        with self._lock, self._bundle_file(ctx, "salvage", salvaged["bundle"]) as path:
            try:
                bundle.fetch_ref(self._p.root, path, str(salvaged["ref"]))
            except StellaError as exc:
                log.warning(
                    "could not keep the salvage of attempt %s of %s: %s", ctx.attempt_id, ctx.task_id, exc
                )
                return False
        return True

    def release(self) -> None:
        self._local.release()

    def close(self) -> None:
        try:
            self._local.close()
        finally:
            if self._ledger is not None:
                self._ledger.close()
            shutil.rmtree(self._scratch, ignore_errors=True)
            with contextlib.suppress(Exception):
                self._ray.shutdown()


class RayExecution:
    """One remote attempt's stream of events, followed by its dispatch thread; stop() cancels it. An attempt
    refused before it was sent streams only its `finished` event."""

    pid: int | None = None

    def __init__(self, executor: RayExecutor, generator: Any, ctx: WorkerContext, ledger: Ledger) -> None:
        self._executor = executor
        self._ray = executor._ray
        self._generator = generator
        self._ctx = ctx
        self._ledger = ledger
        self._stopped = threading.Event()
        self.node: str | None = None
        self._branch_made = False

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(Exception):  # already finished: nothing to cancel
            self._ray.cancel(self._generator, force=True)

    def wait(self) -> AttemptEnd:
        try:
            for ref in self._generator:
                end = self._handle(self._ray.get(ref))
                if end is not None:
                    return end
            return self._lost("the remote task ended without a result")
        except Exception as exc:  # cancelled, or the node / its Ray worker died
            if self._stopped.is_set():
                return attempt_end(LOST, Stop(StopReason.INTERRUPTED), None)
            return self._lost(_first_line(exc))
        finally:
            if not self._branch_made:  # the branch exists whatever happened, as with a local worktree
                with contextlib.suppress(Exception):
                    self._executor.fetch_branch(None, self._ctx)

    def _lost(self, why: str) -> AttemptEnd:
        where = f"node {self.node}" if self.node else "its Ray node"
        return attempt_end(LOST, Stop(StopReason.LOST, f"the worker on {where} was lost ({why})"), None)

    def _handle(self, event: dict[str, Any]) -> AttemptEnd | None:
        ctx, ledger, kind = self._ctx, self._ledger, event.get("kind")
        if kind == "started":
            self.node = str(event["node"])
            ledger.attempts.set_node(ctx.attempt_id, self.node)
        elif kind == "spend":
            fields = {key: event[key] for key in ("seq", "usd", "input_tokens", "output_tokens")}
            ledger.spend.add(ctx.attempt_id, **fields)
        elif kind == "setup" and event.get("seconds") is not None:
            ledger.attempts.set_setup(ctx.attempt_id, float(event["seconds"]))
        elif kind == "log":
            with ctx.log_path.open("ab") as log:
                log.write(event["data"])
        elif kind == "finished":
            return self._finished(event)
        ledger.attempts.set_progress(ctx.attempt_id)  # any event is a sign of life (heartbeats too)
        return None

    def _finished(self, event: dict[str, Any]) -> AttemptEnd:
        """The node's end of the attempt, its result file, transcript, steps and branch brought home."""
        ctx = self._ctx
        if event.get("result") is not None:
            ctx.result_path.write_bytes(event["result"])
        if event.get("transcript") is not None:
            ctx.transcript_path.parent.mkdir(parents=True, exist_ok=True)
            ctx.transcript_path.write_bytes(event["transcript"])
        if event.get("steps"):
            self._ledger.attempts.set_steps(ctx.attempt_id, int(event["steps"]))
        self._executor.fetch_branch(event.get("bundle"), ctx)
        self._branch_made = True
        salvaged = event.get("salvage")
        if salvaged is not None and self._executor.fetch_salvage(salvaged, ctx):
            self._ledger.attempts.set_salvage(ctx.attempt_id, str(salvaged["ref"]), str(salvaged["sha"]))
        end: AttemptEnd = event["end"]
        return end


def open_executor(p: Prepared) -> Executor:
    """The run's executor: a fresh local worker per task; with `--executor ray` the isolated tasks go to
    the cluster and the shared ones stay local."""
    local = LocalExecutor(stop_grace_s=p.config.fleet.stop_grace)
    return RayExecutor.open(p, local=local) if p.executor.kind == "ray" else local
