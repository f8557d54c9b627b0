"""One fleet run, the control: check, plan, pin the base, record the run, run the waves, finish.

The per-task work lives in dispatch.py and everything the user sees in reporter.py; this module decides
the order of things and the run's outcome. Nothing is written (ledger, exclude file, worktrees) until
every check has passed, so a run that exits 2 leaves no trace.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stellafleet.core.config import Config, load_config
from stellafleet.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SPEND_LIMIT,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    StellaError,
)
from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths
from stellafleet.git import gitops
from stellafleet.plan.model import Plan, load_plan, plan_from_prompts
from stellafleet.run.governor import Decision, decide
from stellafleet.run.reporter import Reporter, make_reporter, print_dry_run

if TYPE_CHECKING:
    from stellafleet.worker.launcher import Launcher

DEFAULT_PIPELINE = "plain"
SPEND_STOP_PREFIX = "spend limit reached"
INTERRUPTED = "interrupted"


@dataclass
class FleetOptions:
    prompts: Sequence[str] = ()
    plan_path: str | None = None
    max_concurrency: int | None = None
    base_ref: str | None = None
    pipeline: str | None = None
    watch: bool = False
    dry_run: bool = False
    json_mode: bool = False
    quiet: bool = False
    spend_limit: float | None = None
    config_file: str | None = None
    argv: Sequence[str] = field(default_factory=list)
    cwd: Path | None = None


def new_run_id(now: float | None = None) -> str:
    """`r-YYYYMMDD-HHMMSS-xxxx`: UTC time of the start and 4 random hex digits."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"r-{stamp}-{secrets.token_hex(2)}"


def check_environment(cwd: Path) -> Path:
    """The repository root; StellaError (exit 2) when git is missing, cwd is no repository, or it is empty."""
    root = gitops.repo_root(cwd)  # says so when git is missing or cwd is not in a repository
    if not gitops.has_commits(root):
        raise StellaError(
            f"the repository {root} has no commits yet: a fleet branches from a commit, so make a first "
            "commit (e.g. `git commit --allow-empty -m init`) and run again"
        )
    return root


def build_plan(opts: FleetOptions, root: Path) -> Plan:
    if opts.plan_path and opts.prompts:
        raise StellaError("give either prompts or --plan FILE, not both (put the prompts into the plan)")
    if opts.plan_path:
        return load_plan(opts.plan_path, root=root)
    if not opts.prompts:
        raise StellaError('nothing to run: give prompts (stella fleet "Fix the tests") or --plan FILE')
    return plan_from_prompts(list(opts.prompts))


def pipeline_problems(plan: Plan, default: str, config: Config, spend_limit: float | None) -> list[str]:
    """Everything missing before the plan's pipelines can run (empty: ready): each pipeline is asked once
    per model its tasks use, knowing whether a spend limit is set."""
    from stellafleet import pipelines

    uses = sorted(
        {(task.pipeline or default, task.model) for task in plan.tasks}, key=lambda u: (u[0], u[1] or "")
    )
    installed = pipelines.available()
    unknown = sorted({name for name, _ in uses if name not in installed})
    if unknown:
        return [pipelines.unknown_pipeline(name, installed) for name in unknown]
    return pipelines.preflight(uses, config, spend_limited=spend_limit is not None)


def pipeline_entries(names: Sequence[str]) -> dict[str, str]:
    """name -> "module:attr", so each worker imports its pipeline without scanning installed metadata."""
    from stellafleet import pipelines

    installed = pipelines.available()
    return {name: installed[name].value for name in names if name in installed}


def check_watch_ready(root: Path, config: Config) -> None:
    """--watch: gh and a remote must be ready before anything runs (exit 2 otherwise)."""
    from stellafleet.ci import gh, watch

    settings = watch.WatchSettings.from_config(config)
    watch.preflight(root, gh.GitHub(gh.PlumbumGh(), root, repo=settings.repo), settings)


@dataclass
class Prepared:
    """Everything checked and decided before a run starts; nothing written yet."""

    opts: FleetOptions
    root: Path
    config: Config
    plan: Plan
    default_pipeline: str
    concurrency: Decision
    base_ref: str
    base_commit: str
    run_id: str
    waves: list[list[str]]
    problems: list[str]

    @property
    def spend_guard(self) -> float | None:
        limit = self.opts.spend_limit
        return None if limit is None else limit / self.concurrency.value

    @functools.cached_property
    def pipeline_entries(self) -> dict[str, str]:
        """The run's pipelines: name -> "module:attr" (installed metadata is scanned once per run)."""
        return pipeline_entries(sorted({task.pipeline or self.default_pipeline for task in self.plan.tasks}))

    def task_rows(self) -> list[dict[str, Any]]:
        from stellafleet.run.dispatch import workspace_for

        rows = []
        wave_of = {task_id: n for n, wave in enumerate(self.waves, start=1) for task_id in wave}
        for task in self.plan.tasks:
            ws = workspace_for(self.root, self.run_id, task)
            rows.append(
                {
                    "id": task.id,
                    "title": task.title,
                    "wave": wave_of.get(task.id),
                    "isolation": task.isolation,
                    "pipeline": task.pipeline or self.default_pipeline,
                    "depends_on": list(task.depends_on),
                    "claims": list(task.claims),
                    "worktree": str(ws.path.relative_to(self.root)) if ws.isolated else None,
                    "branch": ws.branch,
                }
            )
        return rows

    def preview(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "run_id": self.run_id,
            "concurrency": self.concurrency.describe(),
            "max_concurrency": self.concurrency.value,
            "base_ref": self.base_ref,
            "base_commit": self.base_commit,
            "spend_limit_usd": self.opts.spend_limit,
            "spend_guard_usd": self.spend_guard,
            "waves": self.waves,
            "tasks": self.task_rows(),
            "problems": self.problems,
        }


def prepare(opts: FleetOptions) -> Prepared:
    """Every check before a run, in the order a user would fix them; StellaError (exit 2) on the first."""
    root = check_environment(opts.cwd or Path.cwd())
    config = load_config(root, config_file=Path(opts.config_file) if opts.config_file else None)
    plan = build_plan(opts, root)
    default = opts.pipeline or config.get("fleet.pipeline") or DEFAULT_PIPELINE
    if not isinstance(default, str):
        raise StellaError(f"config: fleet.pipeline must be a pipeline name, not {default!r}")
    problems = pipeline_problems(plan, default, config, opts.spend_limit)
    concurrency = decide(config, opts.max_concurrency)
    base_ref = opts.base_ref or "HEAD"
    base_commit = gitops.resolve_commit(root, base_ref)
    label = opts.base_ref or gitops.current_branch(root) or "HEAD"
    return Prepared(
        opts=opts,
        root=root,
        config=config,
        plan=plan,
        default_pipeline=default,
        concurrency=concurrency,
        base_ref=label,
        base_commit=base_commit,
        run_id=new_run_id(),
        waves=plan.waves(concurrency.value),
        problems=problems,
    )


class Interrupts:
    """Ctrl-C once: launch nothing more and let running workers finish. Twice (or SIGTERM, SIGHUP): stop
    their process trees."""

    def __init__(
        self,
        request_stop: Callable[[str], None],
        stop_workers: Callable[[], None],
        running: Callable[[], Sequence[str]],
        emit: Callable[[str, Mapping[str, Any]], None],
    ) -> None:
        self.count = 0
        self._request_stop = request_stop
        self._stop_workers = stop_workers
        self._running = running
        self._emit = emit

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1
        running = len(self._running())
        plural = "worker" if running == 1 else "workers"
        if self.count == 1 and signum == signal.SIGINT:
            self._request_stop(INTERRUPTED)
            self._emit(
                "notice",
                {
                    "text": f"interrupt: launching nothing more; waiting for {running} running {plural}; "
                    "press Ctrl-C again to stop them"
                },
            )
            return
        self._request_stop(INTERRUPTED)
        self._stop_workers()
        self._emit("notice", {"text": f"interrupt: stopping {running} running {plural}"})

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # SIGHUP (the terminal closed, the ssh connection dropped) is a stop like SIGTERM: left at its
        # default it killed the fleet outright, leaving the run `running`, its claims held, workers orphaned.
        stops = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
        previous = {signum: signal.signal(signum, self.handle) for signum in stops}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_fleet(opts: FleetOptions, *, out: IO[str] | None = None, reporter: Reporter | None = None) -> int:
    """`stella fleet`: the exit code of the run (see errors.py)."""
    out = out or sys.stdout
    prepared = prepare(opts)
    for warning in prepared.plan.warnings:
        print(f"stella fleet: warning: {warning}", file=sys.stderr)
    if opts.dry_run:
        print_dry_run(prepared.preview(), json_mode=opts.json_mode, stream=out)
        return EXIT_USAGE if prepared.problems else EXIT_OK
    if prepared.problems:
        raise StellaError(
            "cannot start the fleet:\n" + "\n".join(f"  {problem}" for problem in prepared.problems)
        )
    # The warm launcher starts now, so its own start-up (an interpreter and the worker's imports) runs
    # beside the rest of ours instead of before the first worker.
    launcher = start_launcher(prepared)
    try:
        if opts.watch:
            check_watch_ready(prepared.root, prepared.config)
        from stellafleet.run.control import FleetRun

        run = FleetRun(prepared, out=out, reporter=reporter, launcher=launcher)
    except BaseException:
        if launcher is not None:
            launcher.close()
        raise
    return run.run()


def start_launcher(prepared: Prepared) -> Launcher | None:
    """The warm launcher that forks the run's workers, or None: `[fleet] fork_workers = false`, or a
    platform that cannot fork them (workers are then fresh interpreters)."""
    fork = prepared.config.get("fleet.fork_workers", True)
    if not isinstance(fork, bool):
        raise StellaError(f"config: fleet.fork_workers must be true or false, not {fork!r}")
    if not fork:
        return None
    from stellafleet.worker.launcher import Launcher

    modules = sorted({entry.partition(":")[0] for entry in prepared.pipeline_entries.values()})
    return Launcher.start(modules, cwd=prepared.root)


def exit_status(
    interrupted: bool, stopped: str | None, statuses: Mapping[str, str]
) -> tuple[str, int, str | None]:
    """The run's (status, exit code, reason) from how it ended."""
    if interrupted:
        return "interrupted", EXIT_INTERRUPTED, INTERRUPTED
    if stopped and stopped.startswith(SPEND_STOP_PREFIX):
        return "spend_limited", EXIT_SPEND_LIMIT, stopped
    unsuccessful = Counter(status for status in statuses.values() if status != "succeeded")
    if unsuccessful:
        return (
            "failed",
            EXIT_TASK_FAILED,
            ", ".join(f"{n} {status}" for status, n in sorted(unsuccessful.items())),
        )
    return "succeeded", EXIT_OK, None


def ensure_state_dirs(root: Path) -> StatePaths:
    paths = StatePaths(root)
    gitops.ensure_excluded(root, EXCLUDED_DIRS)
    for directory in (paths.private, paths.worktrees):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable_state(directory, exc.strerror or str(exc)) from None
        # SQLite writes -wal/-shm files beside the databases; a read-only directory (or file system)
        # would otherwise surface as "not a fleet ledger" or an internal error halfway into the run.
        if not os.access(directory, os.W_OK | os.X_OK):
            raise _unwritable_state(directory, "not writable")
    return paths


def _unwritable_state(directory: Path, why: str) -> StellaError:
    return StellaError(
        f"cannot write stella's state at {directory}: {why}; make it a writable directory and run again",
        exit_code=EXIT_USAGE,
    )


def make_run_reporter(prepared: Prepared, out: IO[str]) -> Reporter:
    from stellafleet.state.ledger import Ledger

    fleet_db = StatePaths(prepared.root).fleet_db
    run_id = prepared.run_id

    def probe() -> Mapping[str, tuple[int, float]]:
        with Ledger.open(fleet_db, readonly=True) as ledger:
            return ledger.running_progress(run_id)

    return make_reporter(
        json_mode=prepared.opts.json_mode, quiet=prepared.opts.quiet, probe=probe, stream=out
    )
