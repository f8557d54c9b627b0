"""The worker process, `python -m stellafleet.worker.main`: one task, one pipeline, one result file.

It learns everything from its environment (WorkerContext), reports dollars as they are spent to the
ledger, and always leaves a result JSON behind unless it is killed. Imports stay lean: a fleet starts one
of these per task, so its start-up time is the fleet's per-task overhead.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from stellafleet.core import jsontext
from stellafleet.core.errors import StellaError
from stellafleet.core.spend import SpendTally
from stellafleet.core.status import AttemptOutcome
from stellafleet.core.workercontext import WorkerContext
from stellafleet.pipelines.base import PipelineResult
from stellafleet.proc.orphan import end_when_orphaned

if TYPE_CHECKING:
    from stellafleet.core.config import Config
    from stellafleet.pipelines.base import Pipeline
    from stellafleet.state.ledger import Ledger

# Set by the fleet to the entry point's "module:attr" so the worker skips scanning installed metadata.
PIPELINE_ENTRY_ENV = "STELLA_PIPELINE_ENTRY"


class LedgerSpend(SpendTally):
    """The worker's tally: every report lands in the ledger for this attempt as it happens."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__()
        self._ctx = ctx
        self._ledger: Ledger | None = None

    def record(self, usd: float, input_tokens: int, output_tokens: int, steps: int) -> None:
        if self._ledger is None:
            from stellafleet.state.ledger import Ledger

            self._ledger = Ledger.open(self._ctx.paths.fleet_db)
        self._ledger.spend.add(
            self._ctx.attempt_id, usd, input_tokens=input_tokens, output_tokens=output_tokens, steps=steps
        )

    def close(self) -> None:
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None


def load_pipeline(name: str) -> Pipeline:
    entry = os.environ.get(PIPELINE_ENTRY_ENV, "")
    if ":" in entry:
        module_name, _, attr = entry.partition(":")
        factory = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
        pipeline: Pipeline = factory()  # type: ignore[operator]
        return pipeline
    from stellafleet import pipelines

    return pipelines.load(name)


# --- the config, loaded once by the warm launcher ---
#
# A forked worker pays for every page it writes, and parsing the TOML config was a tenth of a no-op
# worker's cost. So the launcher loads the config in its own process just before it forks a worker
# (preload_config), reloading only when the worker's environment or a config file changed, and the worker
# it forks uses that copy. A fresh interpreter loads the config itself. The check runs in the launcher
# after it has forked other workers, so it, too, pays for what it writes: it compares plain strings and
# two stat results, and builds paths only when the variables change.

_preloaded: Config | None = None
_preloaded_for: tuple[object, ...] | None = None
_layer_files: tuple[tuple[str | None, ...], tuple[str, ...] | None] = ((), None)


def _config_variables() -> tuple[str, ...]:
    from stellafleet.core.config import ENV_KEYS

    return ("STELLA_ROOT", "HOME", "XDG_CONFIG_HOME", "STELLA_CONFIG", *ENV_KEYS)


def _layers(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The files load_config reads for env (the user file, then STELLA_CONFIG or the repository's own);
    None when one is relative (to the worker's directory, not the launcher's: the worker loads it)."""
    from stellafleet.core.config import config_files

    root = env.get("STELLA_ROOT")
    if not root:
        return None
    files = [file.path for file in config_files(Path(root), env=env)]
    return tuple(str(path) for path in files) if all(path.is_absolute() for path in files) else None


def _file_identity(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def preload_config(env: Mapping[str, str]) -> None:
    """In the launcher, right before forking a worker with env: load the config that worker would load."""
    global _preloaded, _preloaded_for, _layer_files
    try:
        variables = tuple(env.get(name) for name in _config_variables())
        if variables != _layer_files[0]:
            _layer_files = (variables, _layers(env))
        files = _layer_files[1]
        if files is None:
            _preloaded = _preloaded_for = None
            return
        identity = (variables, tuple(_file_identity(path) for path in files))
        if identity != _preloaded_for:
            from stellafleet.core.config import load_config

            _preloaded_for = None
            _preloaded = load_config(Path(env["STELLA_ROOT"]), env=env)
            _preloaded_for = identity
    except Exception:  # the worker loads it again itself and reports what is wrong
        _preloaded = _preloaded_for = None


def run_task(ctx: WorkerContext, spend: LedgerSpend, config: Config | None = None) -> PipelineResult:
    """Run ctx's pipeline; any exception becomes a failed result carrying its text."""
    try:
        if config is None:
            config = _preloaded if _preloaded_for is not None else None
        if config is None:
            from stellafleet.core.config import load_config

            config = load_config(ctx.root)
        pipeline = load_pipeline(ctx.pipeline)
        result = pipeline.run(ctx, config, spend)
    except Exception as exc:
        text = str(exc) if isinstance(exc, StellaError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, StellaError):
            import traceback

            traceback.print_exc()
        result = PipelineResult(success=False, summary=f"worker error: {text}", error=text)
    try:
        spend.settle(result)
    except Exception as exc:  # the ledger refusing is worth saying, not worth losing the result
        print(f"stella worker: could not record spend: {exc}", file=sys.stderr)
    return result


def write_result(path: Path, result: PipelineResult) -> None:
    """Write the result JSON atomically: the fleet sees the whole file or none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = jsontext.dumps(result.to_json()).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except FileNotFoundError:  # the fleet makes the directory; a worker run by hand may not have it
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def main() -> int:
    try:
        ctx = WorkerContext.from_env()
    except StellaError as exc:
        print(f"stella worker: {exc}", file=sys.stderr)
        return 2
    if os.getpgrp() == os.getpid():  # a worker the fleet started (its own group): it dies with the fleet
        end_when_orphaned()
    print(
        f"stella worker: run {ctx.run_id} task {ctx.task_id} attempt {ctx.attempt_id} "
        f"pipeline {ctx.pipeline} in {ctx.workspace}",
        flush=True,
    )
    spend = LedgerSpend(ctx)
    try:
        result = run_task(ctx, spend)
    finally:
        spend.close()
    write_result(ctx.result_path, result)
    outcome = AttemptOutcome.SUCCEEDED if result.success else AttemptOutcome.FAILED
    print(f"stella worker: {outcome}: {result.summary}", flush=True)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
