"""The config's sections as typed, frozen values (`config.fleet`), built from tables the schema accepted.
The defaults here are the schema's `default`s (a test holds the two to each other)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

T = TypeVar("T")

# The built-in agent-CLI wrappers: their tables share one shape (binary, extra_args, model, max_turns).
AGENT_PIPELINES = ("claude-code", "codex", "aider")
BUILTIN_PIPELINES = ("plain", "command", *AGENT_PIPELINES)  # the ones config.schema.json describes


@dataclass(frozen=True)
class EngineConfig:
    """`[engine]`: the built-in engine. provider, base_url and api_key_env default from the model."""

    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    max_steps: int = 100
    max_wall_seconds: float = 1800.0
    max_output_tokens: int = 4096
    request_timeout: float = 120.0
    max_retries: int = 4
    shell: bool = False
    shell_timeout: float = 120.0


@dataclass(frozen=True)
class FleetConfig:
    """`[fleet]`: max_concurrency None leaves the width to the governor."""

    pipeline: str = "plain"
    max_concurrency: int | None = None
    stop_grace: float = 5.0
    schedule: str = "waves"  # "waves" or "eager" (--schedule wins)
    idle_timeout: float = 900.0  # seconds without CPU time, output or spend before a worker is stopped
    fleet_backoff: bool = True  # workers report provider limits; the fleet narrows and holds (core/limits.py)
    wait_for_limits: bool = False  # a usage limit: wait for its reset instead of skipping what is left
    max_limit_wait: float = 21600.0  # the longest reset --wait-for-limits waits for (seconds)
    max_emitted_tasks: int = 500  # tasks all expanding tasks of one run may add (plan/fragment.py)
    max_expand_depth: int = 3  # levels of emitted tasks below a plan task
    init_submodules: bool = True  # new worktrees and check trees get the main tree's submodules
    allow_detached: bool = False  # shared tasks may commit onto a detached HEAD
    check_log_bytes: int = 8000  # how much of a check's output (its end) the ledger and a round keep
    # the exits that are a check's own red verdict (check_fails_first): not a crash, not command not found
    check_fail_codes: tuple[int, ...] = field(default_factory=lambda: (1,))
    # shared workers' `git` refuses what would touch other workers' files (git/guard.py)
    git_guard: bool = True
    strict_claims: bool = False  # a shared attempt that wrote files outside its claims fails
    resume_max_tokens: int = 150_000  # a follow-up starts a new agent session past this context size
    park_wait: float = 0.0  # seconds the run waits for answers to parked tasks (-1: without end)
    require_commits: bool = False  # a task that succeeded without a commit fails (run/steps/commits.py)


@dataclass(frozen=True)
class ExecutorConfig:
    """`[executor]`: where isolated tasks run; `ray` hands them to a Ray cluster (docs/scale-out.md).
    `tasks`: task id -> the Ray resources that task also needs (e.g. {"gpu_box": 1} to pin it)."""

    kind: str = "local"
    address: str | None = None
    slot_resource: str = "stella_slot"
    # the `.worktreeinclude` files travel with each remote attempt (off: those often secret files stay here)
    send_worktreeinclude: bool = False
    resources: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    tasks: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))

    def resources_for(self, task_id: str) -> dict[str, float]:
        """The Ray resources one remote task asks for: a slot, every task's resources and its own."""
        wanted = {self.slot_resource: 1.0, **self.resources}
        wanted.update(self.tasks.get(task_id, {}))
        return {name: float(amount) for name, amount in wanted.items() if amount}


@dataclass(frozen=True)
class GovernorConfig:
    """`[governor]`: the default fleet width from the machine's cores and free memory, and the smallest
    spend guard a worker is started with under a spend limit."""

    workers_per_core: float = 1.0
    memory_per_worker_gib: float = 1.0
    max: int = 8
    min_guard_usd: float = 0.01


@dataclass(frozen=True)
class WatchConfig:
    """`[watch]`: pushing branches and following their CI."""

    poll_interval: float = 30.0
    appear_timeout: float = 600.0
    stall_timeout: float = 1200.0
    total_timeout: float = 7200.0
    remote: str = "origin"
    force_push: bool = False
    repo: str | None = None  # OWNER/NAME for gh when the remotes do not make it obvious
    fix_ci_log_bytes: int = 8000


@dataclass(frozen=True)
class CommitConfig:
    """[commit]: how a worker's `stella commit` is made."""

    hooks: str = "run"  # "run" | "skip": the repository's commit hooks
    # "auto" | True | False: stash-using commit hooks run one commit at a time (git/hookstash.py)
    serialize_hooks: str | bool = "auto"
    # "commit-tree" | "shared-tree": where a shared commit's hooks run (git/committree.py)
    hooks_in: str = "commit-tree"


@dataclass(frozen=True)
class MergeConfig:
    """`[merge]`: how `stella merge` lands a run's branches; check None means no check command."""

    strategy: str = "rebase"
    check: str | None = None
    check_timeout: float = 1800.0
    check_tail_lines: int = 20
    window: int = 8  # the train's first batch size (docs/merge.md#the-train)
    max_window: int = 32
    parallel_checks: int = 1
    check_retries: int = 1
    retry_on: tuple[str, ...] | None = None  # None: no output marks a check undecided
    fix_rounds: int = 0


@dataclass(frozen=True)
class WorktreeConfig:
    """`[worktree]`: readying an isolated task's worktree (docs/bootstrap.md); None: no such command."""

    setup: str | None = None
    setup_timeout: float = 600.0
    # files whose change between two commits makes a kept tree (git/keptree.py) run setup again; None: none
    setup_inputs: tuple[str, ...] | None = None
    teardown: str | None = None
    teardown_timeout: float = 120.0
    include_max_mb: float = 100.0


@dataclass(frozen=True)
class ResourcesConfig:
    """`[resources]`: free TCP ports leased to each isolated task's worktree and each shared task's attempt
    (docs/bootstrap.md#ports-and-locks), from port_range (`FIRST-LAST`)."""

    ports: int = 0
    port_range: str = "20000-29999"


@dataclass(frozen=True)
class NotifyConfig:
    """`[notify]`: a shell command told (JSON on stdin) when a run ends, a task fails or stalls, or the
    spend limit is reached; None: no notifications."""

    command: str | None = None
    timeout: float = 10.0


@dataclass(frozen=True)
class PriceConfig:
    """`[prices."MODEL"]`: dollars per million tokens; cache prices None mean the input price."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None


@dataclass(frozen=True)
class CommandConfig:
    """`[pipelines.command]`: a default command and per-task ones (`tasks`: task id -> command)."""

    run: str | None = None
    tasks: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))

    def command_for(self, task_id: str) -> str | None:
        """The task's own command when configured, else the pipeline's; None when blank or unset."""
        own = self.tasks.get(task_id)
        command = own if own is not None else self.run
        return command if command is not None and command.strip() else None


@dataclass(frozen=True)
class AgentCliConfig:
    """`[pipelines.NAME]` of an agent-CLI wrapper; binary None means the wrapper's own default."""

    binary: str | None = None
    extra_args: tuple[str, ...] = ()
    model: str | None = None
    max_turns: int | None = None


@dataclass(frozen=True)
class PipelinesConfig:
    """`[pipelines.*]`: the built-in tables typed; third-party pipelines' tables (`plugins`) as written."""

    command: CommandConfig = field(default_factory=CommandConfig)
    agents: Mapping[str, AgentCliConfig] = field(default_factory=lambda: MappingProxyType({}))
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))


# ---------------------------------------------------------------------------------------------
# building from checked tables

# a field's type (without `| None`) -> what makes its value from the checked table's
_CONVERT: dict[str, Any] = {
    "float": float,
    "int": int,
    "tuple[str, ...]": lambda value: tuple(shlex.split(value) if isinstance(value, str) else value),
    "tuple[int, ...]": tuple,
}


def build(kind: type[T], table: Mapping[str, Any]) -> T:
    """kind from a checked table: its keys are kind's fields, values of the schema's type."""
    values: dict[str, Any] = {}
    for spec in fields(kind):  # type: ignore[arg-type]
        if spec.name in table:
            convert = _CONVERT.get(str(spec.type).removesuffix(" | None"))
            values[spec.name] = convert(table[spec.name]) if convert else table[spec.name]
    return kind(**values)


def build_executor(table: Mapping[str, Any]) -> ExecutorConfig:
    tasks = {
        task_id: MappingProxyType(dict(own.get("resources", {})))
        for task_id, own in table.get("tasks", {}).items()
    }
    resources = MappingProxyType(dict(table.get("resources", {})))
    return build(ExecutorConfig, {**table, "resources": resources, "tasks": MappingProxyType(tasks)})


def build_prices(table: Mapping[str, Any]) -> Mapping[str, PriceConfig]:
    return MappingProxyType({model: build(PriceConfig, prices) for model, prices in table.items()})


def build_pipelines(table: Mapping[str, Any]) -> PipelinesConfig:
    command = table.get("command", {})
    tasks = {task_id: own.get("run") for task_id, own in command.get("tasks", {}).items()}
    return PipelinesConfig(
        command=CommandConfig(run=command.get("run"), tasks=MappingProxyType(tasks)),
        agents=MappingProxyType(
            {name: build(AgentCliConfig, table[name]) for name in AGENT_PIPELINES if name in table}
        ),
        plugins=MappingProxyType(
            {name: dict(own) for name, own in table.items() if name not in BUILTIN_PIPELINES}
        ),
    )
