"""Before a run: every check, and every setting resolved, into one frozen Prepared; nothing is written."""

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
from stellafleet.core.words import files_named
from stellafleet.git import gitops, hooks, include, salvage
from stellafleet.plan.model import Plan, load_plan, plan_from_prompts
from stellafleet.run.governor import Decision, decide
from stellafleet.run.resume import Resume, load_resume
from stellafleet.run.steps import workspace_for
from stellafleet.run.steps.factory import MIXED_PIPELINES

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
    warnings: tuple[str, ...] = ()  # about the repository (an unresolved merge), said before the run
    tree: TreeCheck = field(default_factory=TreeCheck)  # the shared tree at the start: notes, changed files

    @property
    def run_pipeline(self) -> str:
        """The run's pipeline as recorded and shown: the one every task runs with, or `mixed`."""
        used = {task.pipeline or self.default_pipeline for task in self.plan.tasks}
        return used.pop() if len(used) == 1 else MIXED_PIPELINES

    @property
    def spend_guard(self) -> float | None:
        """Each worker's share of the spend limit."""
        return None if self.spend_limit is None else self.spend_limit / self.concurrency.value

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
            "worktree": self.readying(),
            "problems": self.problems,
            "watch_pushes": self.watch_pushes(),
        }

    def watch_pushes(self) -> list[str]:
        """What --watch would push besides the isolated branches: the branch shared tasks commit on."""
        if self.watch is None or all(task.isolation == "isolated" for task in self.plan.tasks):
            return []
        return [f"{self.base_ref} to {self.watch.remote}"]

    def readying(self) -> dict[str, Any] | None:
        """What readies each new worktree (None: the plan has no isolated task): the setup command and its
        timeout, and the `.worktreeinclude` files copied in."""
        if not any(task.isolation == "isolated" for task in self.plan.tasks):
            return None
        wt = self.config.worktree
        files = include.included_files(self.root)
        size = sum((self.root / path).lstat().st_size for path in files)
        return {
            "setup": wt.setup,
            "setup_timeout": wt.setup_timeout,
            "include_files": len(files),
            "include_bytes": size,
        }


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


def merge_state_notes(root: Path, plan: Plan) -> tuple[list[str], list[str]]:
    """(warnings, problems) of a repository with an unresolved merge (a conflicted claim is a problem)."""
    merging, conflicted = gitops.unresolved_merge(root)
    if not merging and not conflicted:
        return [], []
    listed = ", ".join(conflicted[:5]) + (f" and {len(conflicted) - 5} more" if len(conflicted) > 5 else "")
    what = "an unfinished merge (MERGE_HEAD)" if merging else "unresolved conflicts"
    paths = f" with unresolved conflicts in {listed}" if conflicted else ""
    warnings = [
        f"the repository is in {what}{paths}: shared-tree tasks work and commit in the middle of it; "
        "finish it (`git merge --continue`) or abort it (`git merge --abort`) first"
    ]
    problems = [
        f"task {task.id!r} claims {path!r}, which has unresolved merge conflicts: resolve it "
        "(or run the task isolated) first"
        for task in plan.tasks
        if task.isolation != "isolated"
        for path in task.claims
        if path in conflicted
    ]
    return warnings, problems


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
    merge_warnings, merge_problems = merge_state_notes(root, plan)
    problems = [*problems, *merge_problems]
    if executor.kind == "ray":  # an isolated task's worker runs on a node: its fragment would stay there
        problems += [
            f"task {task.id!r}: expands = true needs the task to run on this machine, and isolated tasks "
            'run on the Ray cluster: make it shared, or run without [executor] kind = "ray"'
            for task in plan.tasks
            if task.expands and task.isolation == "isolated"
        ]
    if problems and not options.dry_run:
        raise NotReady(problems)
    # after the problems: a conflicted claimed path is named as a conflict, not as the user's changes
    tree = check_tree(root, plan, config, options, resume)
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
        warnings=tuple(merge_warnings),
        tree=tree,
        start_points=salvage_start_points(root, resume, options.from_salvage),
    )


def salvage_start_points(root: Path, resume: Resume | None, from_salvage: bool) -> dict[str, str]:
    """--from-salvage: each resumed isolated task's latest salvage commit, by task id."""
    if not from_salvage:
        return {}
    if resume is None:
        raise StellaError("--from-salvage only goes with --resume RUN")
    left = [t.id for t in resume.plan.tasks if t.isolation == "isolated" and t.id not in resume.done]
    latest = {task_id: salvage.latest_salvage(root, resume.run_id, task_id) for task_id in left}
    return {task_id: found.sha for task_id, found in latest.items() if found is not None}


def resume_of(options: FleetOptions, root: Path) -> Resume | None:
    """--resume RUN: the earlier run and its re-read plan (None without --resume)."""
    if options.resume is None:
        if options.force:
            raise StellaError("--force only goes with --resume RUN")
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


# the shared tree at the start of a run: a detached HEAD, the user's changes in claimed files, hooks
def _owner(path: str, claims: dict[str, str]) -> str | None:
    for claim, task_id in claims.items():
        if path == claim or path.startswith(claim.rstrip("/") + "/"):
            return task_id
    return None


def _leftovers(root: Path, resume: Resume | None, dirty: list[tuple[str, str]]) -> tuple[set[str], list[str]]:
    """Of the claimed changed files, those a resumed run's failed attempt left as its salvage commit holds
    them (they are the task's starting state, not the user's), and a note per attempt."""
    if resume is None:
        return set(), []
    left: set[str] = set()
    notes = []
    for task_id in sorted({owner for _, owner in dirty if owner not in resume.done}):
        saved = salvage.latest_salvage(root, resume.run_id, task_id)
        found = salvage.still_in_tree(root, saved.sha, [p for p, o in dirty if o == task_id]) if saved else []
        if saved is not None and found:
            left.update(found)
            notes.append(
                f"{', '.join(found)}: left by task {task_id}'s attempt {saved.parts[2]} (salvaged as "
                f"{saved.ref}); the task starts from {'it' if len(found) == 1 else 'them'}"
            )
    return left, notes


def check_tree(
    root: Path, plan: Plan, config: Config, options: FleetOptions, resume: Resume | None = None
) -> TreeCheck:
    """StellaError (exit 2) for a detached HEAD or claimed files with the user's changes; else the notes."""
    if all(task.isolation == "isolated" for task in plan.tasks):
        return TreeCheck(_hook_notes(root, config, plan))
    if gitops.current_branch(root) is None and not (options.allow_detached or config.fleet.allow_detached):
        head = gitops.head_commit(root)[:12]
        raise StellaError(
            f"HEAD is detached (at {head}): shared tasks would commit onto it, where only the reflog keeps "
            "their work once you check out a branch; check out a branch first, or pass --allow-detached "
            "to commit onto the detached HEAD anyway"
        )
    changed = tuple(p for p in gitops.changed_paths(root) if not p.startswith(STATE_DIR))
    claims = {claim: task.id for task in plan.tasks if task.isolation != "isolated" for claim in task.claims}
    dirty_claimed = [(path, owner) for path in changed if (owner := _owner(path, claims)) is not None]
    left, notes = _leftovers(root, resume, dirty_claimed)
    dirty_claimed = [(path, owner) for path, owner in dirty_claimed if path not in left]
    changed = tuple(path for path in changed if path not in left)  # the task's own: its commits take them
    notes += _hook_notes(root, config, plan)
    if dirty_claimed and not options.allow_dirty:
        named = ", ".join(f"{path} (task {owner})" for path, owner in dirty_claimed)
        raise StellaError(
            f"claimed files have uncommitted changes of yours: {named}; commit or stash them first, or "
            "pass --allow-dirty (the workers' commits of them then leave your changes out)"
        )
    if dirty_claimed:
        named = ", ".join(path for path, _ in dirty_claimed)
        notes.append(
            f"warning: --allow-dirty: {named} {'has' if len(dirty_claimed) == 1 else 'have'} uncommitted "
            "changes of yours; the workers' commits take only what the workers write, and your changes "
            "stay uncommitted"
        )
    elif changed:
        notes.append(
            f"your work tree has uncommitted changes ({files_named(list(changed))}): they stay yours, "
            "workers' commits leave them out"
        )
    return TreeCheck(tuple(notes), changed)


def _hook_notes(root: Path, config: Config, plan: Plan) -> tuple[str, ...]:
    """Which hooks the workers' commits run; a warning when the user's own commits would disturb them."""
    names = hooks.installed(root)
    if not names:
        return ()
    listed = " and ".join(names)
    if config.commit.hooks == "skip":
        return (
            f'warning: [commit] hooks = "skip": the installed {listed} hooks will not run for the '
            "workers' commits",
        )
    notes = []
    if any(task.isolation == "isolated" for task in plan.tasks):
        where = hooks.hooks_dir(root)
        shown = where.relative_to(root) if where.is_relative_to(root) else where
        notes.append(f"isolated tasks' commits run the {listed} hooks of {shown}")
    if hooks.framework_installed(root) and any(task.isolation != "isolated" for task in plan.tasks):
        notes.append(
            "warning: the pre-commit framework is installed: your own `git commit` during the run stashes "
            "the workers' unfinished files while its hooks run (their commits may be refused); commit with "
            "`stella commit -m MSG PATH...` instead"
        )
    return tuple(notes)
