"""What runs on a Ray node for one isolated attempt: clone, preflight, worker, stream, bundle back.
The worker records into a scratch ledger: the head alone writes the real ledger. Nothing here imports Ray."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import StellaError
from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths, read_regular
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import bundle, gitops, include, nodeclone, salvage, worktrees
from stellafleet.pipelines.base import PipelineResult
from stellafleet.proc import runner, shell
from stellafleet.proc.pids import ProcessIdentity
from stellafleet.proc.tree import Exit
from stellafleet.run import bootstrap, salvaging
from stellafleet.run.executor import Attempt, LocalExecutor, attempt_end, inherited_env
from stellafleet.state.ledger import Ledger
from stellafleet.state.proof import token_digest
from stellafleet.worker.main import write_result

NODE_NAME_ENV = "STELLA_NODE_NAME"  # an operator's name for the node (default: hostname and Ray node id)


@dataclass(frozen=True)
class RemoteSpec:
    """Everything one remote attempt needs besides the base bundle."""

    context: WorkerContext  # as the fleet made it; its paths are rewritten for the node
    config_layers: tuple[tuple[str, str], ...] = ()  # ("user" | "project", TOML text), lowest first
    env: Mapping[str, str] = field(default_factory=dict)  # the fleet's config variables (STELLA_MODEL...)
    stop_grace_s: float = 5.0
    heartbeat_s: float = 5.0
    poll_s: float = 0.1
    included: tuple[include.Packed, ...] = ()  # the `.worktreeinclude` files, when the user sends them
    start: bytes | None = None  # --from-salvage: a bundle of the task's start commit past the base


def node_name() -> str:
    """How the ledger names this node: $STELLA_NODE_NAME, else hostname and the Ray node id."""
    named = os.environ.get(NODE_NAME_ENV, "").strip()
    if named:
        return named
    label = socket.gethostname()
    ray = sys.modules.get("ray")  # loaded in a Ray worker; never imported here (that could start Ray)
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            label += f" {ray.get_runtime_context().get_node_id()[:12]}"
    return label


def remote_attempt(spec: RemoteSpec, base_bundle: bytes) -> Iterator[dict[str, Any]]:
    """The attempt on this node as a stream of events: started, spend, log, setup, heartbeat, finished."""
    scratch = Path(tempfile.mkdtemp(prefix="stella-remote-"))
    clone: Path | None = None
    try:
        try:
            salvaged = bootstrap.starts_on_salvage(spec.env, spec.context.start_commit)
            clone = checkout(spec.context, base_bundle, scratch / "repo", spec.start, fold=salvaged)
        except StellaError as exc:  # git's own words, not a lost worker: nothing was started
            node = node_name()
            yield {"kind": "started", "node": node, "pid": None}
            why = f"could not clone the base on node {node}: {exc}"
            yield finished(_node_context(spec.context, scratch), AttemptEnd.failed(why))
            return
        yield from _attempt(spec, scratch)
    finally:
        if clone is not None and spec.context.branch is not None:
            nodeclone.remove_worktree(clone, scratch / "repo", spec.context.branch)
        shutil.rmtree(scratch, ignore_errors=True)


def checkout(
    home: WorkerContext, base_bundle: bytes, repo: Path, start: bytes | None = None, *, fold: bool = False
) -> Path | None:
    """The task's branch checked out at repo: a worktree of the node's kept clone of the base (returned),
    or a clone of its own where the node cannot keep one (None)."""
    assert home.branch is not None
    start_path: Path | None = None
    if start is not None:
        start_path = repo.parent / "start.bundle"
        start_path.write_bytes(start)
    try:

        def write_bundle(path: Path) -> None:
            path.write_bytes(base_bundle)

        clone = nodeclone.base_clone(write_bundle, home.base_commit)
        nodeclone.add_worktree(clone, repo, home.branch, home.base_commit, start_path)
    except (OSError, StellaError):  # no writable cache on this node: a clone per attempt
        shutil.rmtree(repo, ignore_errors=True)
        (repo.parent / "base.bundle").write_bytes(base_bundle)
        bundle.clone_on_branch(repo.parent / "base.bundle", repo, home.branch)
        if start_path is not None:
            bundle.check_out_start(repo, start_path, home.branch)
        gitops.ensure_excluded(repo, EXCLUDED_DIRS)
        clone = None
    if start_path is not None and fold:  # a salvage commit: its work goes into the task's next commit
        worktrees.fold_start_commit(repo)
    return clone


def _node_context(home: WorkerContext, scratch: Path) -> WorkerContext:
    """The attempt's context with its paths on this node (the checkout at scratch/repo)."""
    repo = scratch / "repo"
    return dataclasses.replace(
        home,
        root=repo,
        workspace=repo,
        result_path=StatePaths(repo).result_file(home.run_id, home.task_id, home.attempt_id),
        log_path=scratch / "worker.log",
        transcript_path=scratch / "transcript.jsonl",
        # the fleet's prompt file is on the fleet's machine: the node writes its own (_attempt)
        prompt_path=scratch / "prompt.txt" if home.prompt_path is not None else None,
    )


def _attempt(spec: RemoteSpec, scratch: Path) -> Iterator[dict[str, Any]]:
    home = spec.context
    node = node_name()
    assert home.branch is not None
    ctx = _node_context(home, scratch)
    if ctx.prompt_path is not None:  # however large, the prompt reaches the worker in a file, as at home
        ctx.prompt_path.write_text(ctx.prompt, encoding="utf-8")
    env = worker_env(spec, ctx, scratch)
    problem, config = preflight(ctx, env)
    yield {"kind": "started", "node": node, "pid": None}
    if problem:
        text = f"preflight on node {node}: {problem}"
        failed = PipelineResult(success=False, summary=text, error=text)
        write_result(ctx.result_path, failed)
        yield finished(ctx, attempt_end(Exit(1, 0.0, 0), None, failed))
        return
    assert config is not None  # preflight read it
    try:  # the checkout readied as a local worktree is
        setup = bootstrap.ready(ctx.workspace, config.worktree, env, ctx.log_path, packed=spec.included)
    except bootstrap.SetupFailed as exc:
        yield {"kind": "setup", "seconds": exc.seconds}
        yield {"kind": "log", "data": _read_from(ctx.log_path, 0)}
        yield finished(ctx, AttemptEnd.failed(f"{exc} (on node {node})"))
        return
    if setup is not None:
        yield {"kind": "setup", "seconds": setup.seconds}
    ctx.result_path.parent.mkdir(parents=True, exist_ok=True)
    with Ledger.open(ctx.paths.fleet_db) as ledger:
        digest = token_digest(ctx.token) if ctx.token else None
        ledger.seed_attempt(
            ctx.run_id, ctx.task_id, ctx.attempt_id, isolation=ctx.isolation, token_sha256=digest
        )
        reaper = kept_reaper(spec.stop_grace_s)  # first: a cancel at any moment finds it watching
        execution = LocalExecutor(stop_grace_s=spec.stop_grace_s).start(Attempt(ctx, env))
        root_file = reaper / f"attempt-{ctx.attempt_id}.pid"
        (reaper / f"attempt-{ctx.attempt_id}.tmp").write_text(f"{execution.pid}\n{scratch}\n")
        (reaper / f"attempt-{ctx.attempt_id}.tmp").replace(root_file)
        box: dict[str, AttemptEnd] = {}
        waiter = threading.Thread(target=lambda: box.setdefault("end", execution.wait()), daemon=True)
        waiter.start()
        try:
            yield from _follow(spec, ctx, ledger, waiter)
        finally:
            if waiter.is_alive():  # the stream was closed early (cancelled) or failed: the worker goes too
                execution.stop()
                waiter.join(spec.stop_grace_s + 5)
            if not waiter.is_alive():  # its tree has ended: nothing of it left for the reaper to stop
                root_file.unlink(missing_ok=True)
        steps = ledger.attempts.steps(ctx.attempt_id)
    end = box["end"].plus_cpu(setup.cpu_seconds if setup else 0.0)  # as at home
    saved = _salvage(ctx, end, scratch) if end.outcome != AttemptOutcome.SUCCEEDED else None
    out = scratch / "out.bundle"
    sent = False
    try:
        sent = bundle.create_range(ctx.workspace, ctx.base_commit, home.branch, out)
    except StellaError as exc:  # the clone's objects are broken: say what git said
        why = f"could not bring the branch home from node {node}: {exc}"
        end = dataclasses.replace(end, outcome=AttemptOutcome.FAILED, summary=end.summary or why, error=why)
    transcript = ctx.transcript_path.read_bytes() if ctx.transcript_path.exists() else None
    yield finished(ctx, end, out.read_bytes() if sent else None, transcript, steps, saved)


def _salvage(ctx: WorkerContext, end: AttemptEnd, scratch: Path) -> dict[str, Any] | None:
    """The unfinished attempt's uncommitted work as a salvage commit, bundled for the head; None when
    there was nothing to keep, or it could not be kept (logged)."""
    saved = salvaging.salvage_workspace(
        ctx.workspace, ctx.run_id, ctx.task_id, ctx.attempt_id, str(end.outcome)
    )
    if saved is None:
        return None
    out = scratch / "salvage.bundle"
    try:
        salvage.bundle_salvage(ctx.workspace, saved, out)
    except StellaError as exc:
        shell.log_line(ctx.log_path, f"could not bring the salvage of this attempt home: {exc}")
        return None
    return {"ref": saved.ref, "sha": saved.sha, "files": saved.files, "bundle": out.read_bytes()}


def _follow(spec: RemoteSpec, ctx: WorkerContext, ledger: Ledger, waiter: threading.Thread) -> Iterator[dict]:
    """Spend, log and heartbeat events until the worker has ended (and once more after, for the rest)."""
    seq, offset = 0, 0
    beat = time.monotonic() + spec.heartbeat_s
    while True:
        done = not waiter.is_alive()
        for event in ledger.spend.after(ctx.attempt_id, seq):
            seq = event.seq
            yield {"kind": "spend", **dataclasses.asdict(event)}
        chunk = _read_from(ctx.log_path, offset)
        if chunk:
            offset += len(chunk)
            yield {"kind": "log", "data": chunk}
        if done:
            return
        if time.monotonic() >= beat:
            beat = time.monotonic() + spec.heartbeat_s
            yield {"kind": "heartbeat"}
        waiter.join(spec.poll_s)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(1 << 20)
    except FileNotFoundError:
        return b""


def worker_env(spec: RemoteSpec, ctx: WorkerContext, scratch: Path) -> dict[str, str]:
    """The node's own environment (its PATH, its keys) with the task's variables and the fleet's config."""
    env = inherited_env(os.environ, "STELLA_CONFIG")
    env.update(spec.env)
    env["XDG_CONFIG_HOME"] = str(scratch / "xdg")
    for kind, text in spec.config_layers:
        path = scratch / "xdg" / "stella" / "config.toml" if kind == "user" else scratch / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if kind != "user":
            env["STELLA_CONFIG"] = str(path)
    env.update(ctx.to_env())
    return env


def preflight(ctx: WorkerContext, env: Mapping[str, str]) -> tuple[str | None, Config | None]:
    """Can the task's pipeline run on this node? (None, the node's config), else (the problem, it or None)."""
    from stellafleet import pipelines

    try:
        config = load_config(ctx.root, env=env)
    except Exception as exc:
        return f"config: {exc}", None
    saved = os.environ.get("PATH")
    os.environ["PATH"] = env.get("PATH", "")  # a CLI is looked up on the worker's PATH
    try:
        use = (ctx.pipeline, ctx.model)
        problems = pipelines.preflight([use], config, spend_limited=ctx.spend_guard_usd is not None)
    finally:
        if saved is not None:
            os.environ["PATH"] = saved
    return "; ".join(problems) or None, config


_REAPERS: dict[float, tuple[Path, ProcessIdentity]] = {}  # stop grace -> this process's kept reaper
_REAPERS_LOCK = threading.Lock()


def kept_reaper(grace_s: float) -> Path:
    """The directory of this process's kept reaper (started again once gone): it stops the workers' trees if
    the Ray worker is killed, one for all its attempts, each a pid file there (proc/reaper.py `reap_all`)."""
    with _REAPERS_LOCK:
        kept = _REAPERS.get(grace_s)
        if kept is not None and kept[0].is_dir() and kept[1].is_alive():
            return kept[0]
        directory = Path(tempfile.mkdtemp(prefix="stella-reaper-"))
        argv = [sys.executable, "-P", "-m", "stellafleet.proc.reaper", "--detach", str(os.getpid())]
        # a detached reaper watching this process, for the trees named in directory: it says its pid
        done = runner.run([*argv, str(directory), str(grace_s)], session=False)
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            raise StellaError(f"the reaper did not start: {done.stderr.strip() or f'exit {done.returncode}'}")
        identity = ProcessIdentity.of(int(done.stdout.strip()))
        if identity is None:
            raise StellaError("the reaper ended as it started")
        _REAPERS[grace_s] = (directory, identity)
        return directory


def finished(
    ctx: WorkerContext,
    end: AttemptEnd,
    branch_bundle: bytes | None = None,
    transcript: bytes | None = None,
    steps: int = 0,
    salvaged: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The last event: the attempt's end and what the head keeps of it (result file, bundles, salvage)."""
    try:
        result: bytes | None = read_regular(ctx.result_path)
    except OSError:  # none, or a FIFO (which would block the node)
        result = None
    fields = {"end": end, "result": result, "bundle": branch_bundle, "transcript": transcript, "steps": steps}
    return {"kind": "finished", **fields, "salvage": salvaged}
