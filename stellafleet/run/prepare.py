"""Before a run: every check, and every setting resolved, into one frozen Prepared; nothing is written.
What is a step's own (its checks, warnings and --dry-run lines) its preflight says (run/steps/)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stellafleet.core.config import Config, load_config
from stellafleet.core.configsections import ExecutorConfig, WatchConfig
from stellafleet.core.errors import StellaError
from stellafleet.git import gitops
from stellafleet.plan.model import Plan, load_plan, plan_from_prompts
from stellafleet.run.governor import Decision, decide
from stellafleet.run.resume import Resume, load_resume
from stellafleet.run.steps import BeforeRun, RunSettings, factory, workspace_for
from stellafleet.run.steps.salvage import leftovers, start_points

STATE_DIR = ".stella/"  # stella's own files (the project config among them) are not the user's changes


@dataclass(frozen=True)
class FleetOptions:
    """What the command line asks of one run, typed once there; prepare() resolves it with the config."""

    prompts: Sequence[str] = ()
    plan_path: str | None = None
    max_concurrency: int | None = None
    base_ref: str | None = None
    pipeline: str | None = None  # for tasks that name none
    model: str | None = None  # for tasks that name none (None: each pipeline's configured model)
    watch: bool = False
    dry_run: bool = False
    json_mode: bool = False
    quiet: bool = False
    spend_limit: float | None = None
    config_file: str | None = None
    stop_on_first_interrupt: bool = False  # Ctrl-C stops the running workers at once, not the second time
    argv: Sequence[str] = ()
    cwd: Path | None = None
    schedule: str | None = None  # "waves" or "eager" (None: the config's, else waves)
    resume: str | None = None  # an earlier run to resume: "latest", an id or a unique prefix
    force: bool = False  # resume even though the plan changed
    from_salvage: bool = False  # with resume: isolated tasks start from their latest salvage commit
    fix_ci: int = 0  # with watch: follow-up rounds per red branch
    executor: str | None = None  # "local" | "ray" (None: the config's [executor] kind)
    ray_address: str | None = None
    wait_for_limits: bool = False  # a usage limit: wait for its reset instead of stopping (exit 3)
    estimate: bool = False  # print what the run would likely cost and take, from the ledger; run nothing
    allow_dirty: bool = False  # claimed files may have the user's uncommitted changes (kept out of commits)
    allow_detached: bool = False  # shared tasks may commit onto a detached HEAD


@dataclass(frozen=True)
class TreeCheck:
    """What the start of a run found: lines to show, and the user's changed files (to keep out)."""

    notes: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


class NotReady(StellaError):
    """The plan's pipelines cannot run yet; `problems` says what each one is missing."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("cannot start the fleet:\n" + "\n".join(f"  {problem}" for problem in problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Prepared:
    """Everything checked and decided before a run starts; nothing written yet."""

    root: Path
    plan: Plan
    plan_path: Path | None
    run_id: str
    base_ref: str  # as shown: the ref asked for, else the current branch
    base_commit: str
    concurrency: Decision
    waves: list[list[str]]
    default_pipeline: str
    problems: list[str]  # what keeps the pipelines from running (only a dry run gets this far with any)
    spend_limit: float | None
    watch: WatchConfig | None  # None: no --watch
    config: Config  # the [fleet] and [governor] settings as configured; the CI watch gets it whole
    config_file: Path | None
    options: FleetOptions  # what the command line asked (how to show the run, Ctrl-C, the argv recorded)
    schedule: str = "waves"
    resume: Resume | None = None
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)  # kind, address: the command line wins
    start_points: Mapping[str, str] = field(default_factory=dict)  # --from-salvage: task id -> commit
    warnings: tuple[str, ...] = ()  # the steps' (an unresolved merge, say), said before the run
    tree: TreeCheck = field(default_factory=TreeCheck)  # the shared tree at the start: notes, changed files
    previews: Mapping[str, Any] = field(default_factory=dict)  # what the steps add to the --dry-run document

    @property
    def run_pipeline(self) -> str:
        """The run's pipeline as recorded and shown: the one every task runs with, or `mixed`."""
        used = {task.pipeline or self.default_pipeline for task in self.plan.tasks}
        return used.pop() if len(used) == 1 else factory.MIXED_PIPELINES

    @property
    def spend_guard(self) -> float | None:
        """Each worker's share of the spend limit."""
        return None if self.spend_limit is None else self.spend_limit / self.concurrency.value

    def run_settings(self) -> RunSettings:
        """What every attempt of the prepared run shares."""
        return RunSettings(
            self.root,
            self.run_id,
            self.base_commit,
            default_pipeline=self.default_pipeline,
            default_model=self.options.model,  # for tasks that name none
            spend_guard_usd=self.spend_guard,
            config_file=self.config_file,
            config=self.config,
            allow_detached=self.options.allow_detached,
            start_points=self.start_points,
        )

    def task_rows(self) -> list[dict[str, Any]]:
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
                    "base": task.base,
                    "starts_at": self.plan.start_of(task, f"base {self.base_commit[:7]}"),
                    "pipeline": task.pipeline or self.default_pipeline,
                    "depends_on": list(task.depends_on),
                    "claims": list(task.claims),
                    "locks": list(task.locks),
                    "ports": task.ports if task.ports is not None else self.config.resources.ports,
                    "expands": task.expands,
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
            "spend_limit_usd": self.spend_limit,
            "spend_guard_usd": self.spend_guard,
            "waves": self.waves,
            "schedule": self.schedule,
            "resumes": self.resume.run_id if self.resume else None,
            "done": sorted(self.resume.done) if self.resume else [],
            "emitted": [task.id for task in self.resume.emitted] if self.resume else [],
            "tasks": self.task_rows(),
            **self.previews,
            "problems": self.problems,
            "watch_pushes": self.watch_pushes(),
        }

    def watch_pushes(self) -> list[str]:
        """What --watch would push besides the isolated branches: the branch shared tasks commit on."""
        if self.watch is None or all(task.isolation == "isolated" for task in self.plan.tasks):
            return []
        return [f"{self.base_ref} to {self.watch.remote}"]


def new_run_id() -> str:
    """`r-YYYYMMDD-HHMMSS-xxxx`: UTC time of the start and 4 random hex digits."""
    return f"r-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def check_environment(cwd: Path) -> Path:
    """The repository root; StellaError (exit 2) when git is missing, cwd is no repository, or it is empty."""
    root = gitops.repo_root(cwd)  # says so when git is missing or cwd is not in a repository
    if not gitops.has_commits(root):
        raise StellaError(
            f"the repository {root} has no commits yet: a fleet branches from a commit, so make a first "
            "commit (e.g. `git commit --allow-empty -m init`) and run again"
        )
    return root


def build_plan(options: FleetOptions, root: Path) -> Plan:
    if options.plan_path and options.prompts:
        raise StellaError("give either prompts or --plan FILE, not both (put the prompts into the plan)")
    if options.plan_path:
        return load_plan(options.plan_path, root=root)
    if not options.prompts:
        raise StellaError('nothing to run: give prompts (stella fleet "Fix the tests") or --plan FILE')
    return plan_from_prompts(list(options.prompts))


def pipeline_problems(
    plan: Plan, pipeline: str, model: str | None, config: Config, spend_limit: float | None
) -> list[str]:
    """Everything missing before the plan's pipelines can run (empty: ready), each asked once per model."""
    from stellafleet import pipelines

    installed = pipelines.available()
    uses = sorted(
        {(task.pipeline or pipeline, task.model or model) for task in plan.tasks},
        key=lambda use: (use[0], use[1] or ""),
    )
    named = plan.unknown_pipelines(list(installed))  # at their place in the plan file
    unknown = sorted(
        {name for name, _ in uses if name not in installed} - {task.pipeline for task in plan.tasks}
    )
    if named or unknown:
        return named + [pipelines.unknown_pipeline(name, installed) for name in unknown]
    return pipelines.preflight(uses, config, spend_limited=spend_limit is not None, installed=installed)


def check_watch_ready(root: Path, config: Config) -> WatchConfig:
    """--watch: gh and a remote must be ready before anything runs (exit 2 otherwise)."""
    from stellafleet.ci import gh, watch

    settings = config.watch
    watch.preflight(root, gh.GitHub(gh.SystemGh(), root, repo=settings.repo), settings, config.settings_file)
    return settings


def watch_settings(root: Path, config: Config, options: FleetOptions) -> WatchConfig | None:
    """--watch's settings, checked ready unless a dry run only shows what it would push."""
    if not options.watch:
        return None
    return config.watch if options.dry_run else check_watch_ready(root, config)


def prepare(options: FleetOptions) -> Prepared:
    """Every check before a run, in the order a user would fix them; StellaError (exit 2) on the first."""
    root = check_environment(options.cwd or Path.cwd())
    config_file = Path(options.config_file).resolve() if options.config_file else None
    config = load_config(root, config_file=Path(options.config_file) if options.config_file else None)
    resume = resume_of(options, root)
    plan = resume.plan if resume is not None else build_plan(options, root)
    default_pipeline = options.pipeline or config.fleet.pipeline
    problems = pipeline_problems(plan, default_pipeline, options.model, config, options.spend_limit)
    concurrency = decide(config, options.max_concurrency)
    base_commit = gitops.resolve_commit(root, options.base_ref or "HEAD")
    executor = resolve_executor(options, config)
    tree = shared_tree(root, plan, resume)
    remote = executor.kind == "ray"  # isolated tasks run on the cluster
    before = BeforeRun(root, plan, config, tree.changed, remote, options.dry_run, options.allow_dirty)
    found = [step.preflight(before) for step in factory.STEPS]
    problems += [problem for step in found for problem in step.problems]
    if problems and not options.dry_run:
        raise NotReady(problems)
    # after the problems: a conflicted claimed path is named as a conflict, not as the user's changes
    check_head(root, plan, config, options)
    refusal = next((step.refusal for step in found if step.refusal), None)
    if refusal is not None and not options.estimate:  # an estimate runs nothing: nothing to refuse
        raise StellaError(refusal)
    plan_file = Path(options.plan_path).resolve() if options.plan_path else None
    return Prepared(
        root=root,
        plan=plan,
        plan_path=resume.plan_path if resume else plan_file,
        run_id=new_run_id(),
        base_ref=options.base_ref or gitops.current_branch(root) or "HEAD",
        base_commit=base_commit,
        concurrency=concurrency,
        waves=plan.waves(concurrency.value, done=resume.done if resume else frozenset()),
        default_pipeline=default_pipeline,
        problems=problems,
        spend_limit=options.spend_limit,
        watch=watch_settings(root, config, options),
        config=config,
        config_file=config_file,
        options=options,
        schedule=options.schedule or config.fleet.schedule,
        resume=resume,
        executor=executor,
        warnings=tuple(warning for step in found for warning in step.warnings),
        tree=TreeCheck(tree.notes + tuple(note for step in found for note in step.notes), tree.changed),
        previews={key: value for step in found for key, value in step.preview.items()},
        start_points=start_points(root, resume) if resume and options.from_salvage else {},
    )


def resume_of(options: FleetOptions, root: Path) -> Resume | None:
    """--resume RUN: the earlier run and its re-read plan (None without --resume)."""
    if options.resume is None:
        if options.force:
            raise StellaError("--force only goes with --resume RUN")
        if options.from_salvage:
            raise StellaError("--from-salvage only goes with --resume RUN")
        return None
    if options.prompts:
        raise StellaError("--resume runs the earlier run's tasks again: give no prompts with it")
    return load_resume(root, options.resume, plan_path=options.plan_path, force=options.force)


def check_ray_installed() -> None:
    """StellaError (exit 2) with the one line to fix it when Ray cannot be imported."""
    try:
        import ray  # noqa: F401 - the run needs it next anyway
    except ImportError:
        raise StellaError(
            "the ray executor needs Ray on this machine: pip install 'stellafleet[ray]'"
        ) from None


def resolve_executor(options: FleetOptions, config: Config) -> ExecutorConfig:
    """[executor] with --executor and --ray-address applied; the ray one needs Ray installed (exit 2)."""
    chosen = config.executor
    kind = options.executor or chosen.kind
    if options.ray_address and kind != "ray":
        raise StellaError("--ray-address needs the ray executor: add --executor ray")
    if kind == "ray" and not options.dry_run:
        check_ray_installed()
    return replace(chosen, kind=kind, address=options.ray_address or chosen.address)


def shared_tree(root: Path, plan: Plan, resume: Resume | None) -> TreeCheck:
    """The user's changed files in the shared tree (none when every task is isolated); a resumed task's
    leftovers are its starting state, not the user's: noted, and not among them."""
    if all(task.isolation == "isolated" for task in plan.tasks):
        return TreeCheck()
    changed = [path for path in gitops.changed_paths(root) if not path.startswith(STATE_DIR)]
    left, notes = leftovers(root, resume, changed) if resume is not None else (set(), [])
    return TreeCheck(tuple(notes), tuple(path for path in changed if path not in left))


def check_head(root: Path, plan: Plan, config: Config, options: FleetOptions) -> None:
    """StellaError (exit 2) for a detached HEAD that shared tasks would commit onto, unless allowed."""
    if all(task.isolation == "isolated" for task in plan.tasks):
        return
    if gitops.current_branch(root) is None and not (options.allow_detached or config.fleet.allow_detached):
        head = gitops.head_commit(root)[:12]
        raise StellaError(
            f"HEAD is detached (at {head}): shared tasks would commit onto it, where only the reflog keeps "
            "their work once you check out a branch; check out a branch first, or pass --allow-detached "
            "to commit onto the detached HEAD anyway"
        )
