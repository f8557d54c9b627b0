"""Sweep the worktrees and `fleet/*` branches finished runs left: only stella's own, never a live one's."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from stellafleet.core.configsections import WorktreeConfig
from stellafleet.core.errors import GitError
from stellafleet.core.paths import EXCLUDED_DIRS, StatePaths
from stellafleet.core.status import RunStatus
from stellafleet.core.words import plural
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, mergeops, salvage, worktrees
from stellafleet.proc import group, shell
from stellafleet.proc.pids import pid_alive
from stellafleet.state.journal import Record
from stellafleet.state.leases import LeaseStore, port_env
from stellafleet.state.ledger import Ledger

BRANCH_PREFIX = "fleet/"

REMOVED = "removed"
KEPT = "kept"
WOULD_REMOVE = "would remove"


@dataclass(frozen=True)
class CleanItem:
    """One decision about one worktree or branch."""

    run_id: str
    task_id: str | None
    kind: str  # "worktree" | "branch"
    target: str
    action: str  # REMOVED | KEPT | WOULD_REMOVE
    reason: str


@dataclass
class CleanReport:
    dry_run: bool
    force: bool
    items: list[CleanItem] = field(default_factory=list)
    runs_considered: int = 0

    def with_action(self, action: str) -> list[CleanItem]:
        return [item for item in self.items if item.action == action]

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "force": self.force,
            "runs_considered": self.runs_considered,
            "removed": [asdict(i) for i in self.with_action(REMOVED)],
            "would_remove": [asdict(i) for i in self.with_action(WOULD_REMOVE)],
            "kept": [asdict(i) for i in self.with_action(KEPT)],
        }


@dataclass
class _Owner:
    """A task of a run that recorded a branch or worktree, and why it must not be touched (if so)."""

    run_id: str
    task_id: str | None
    base_ref: str | None
    live: str | None
    worker_started: bool = True  # False: no worker ever ran in its worktree, only `[worktree] setup`
    branch: str | None = None
    worktree_index: int | None = None  # the STELLA_WORKTREE_INDEX its worktree had


def _live_reasons(detail: dict[str, Any], alive: Callable[[int | None, int | None], bool]) -> dict[str, str]:
    """task id -> why it is live, for the tasks of a run that have a live attempt (or a live fleet)."""
    run = detail["run"]
    run_live = _fleet_live(run, alive)
    reasons: dict[str, str] = {}
    for attempt in detail.get("attempts", []):
        if attempt.get("finished_at_ms") is not None:
            continue
        pid = attempt.get("pid")
        if pid and alive(pid, attempt.get("pid_started_ms")):
            reasons[attempt["task_id"]] = f"attempt {attempt['id']} is still running (pid {pid})"
        elif not pid and run_live:
            reasons[attempt["task_id"]] = f"attempt {attempt['id']} is starting (fleet pid {run.get('pid')})"
    if run_live:
        for task in detail.get("tasks", []):
            reasons.setdefault(task["id"], f"run {run['id']} is still running (pid {run.get('pid')})")
    return reasons


def _collect(
    details: Iterable[dict[str, Any]], alive: Callable[[int | None, int | None], bool]
) -> tuple[dict[str, _Owner], dict[str, _Owner]]:
    """Recorded worktree paths and fleet branches -> their owner, from tasks and attempts alike."""
    worktrees: dict[str, _Owner] = {}
    branches: dict[str, _Owner] = {}
    for detail in details:
        run = detail["run"]
        live = _live_reasons(detail, alive)
        rows = [(t["id"], t.get("branch"), t.get("worktree")) for t in detail.get("tasks", [])]
        rows += [(a["task_id"], a.get("branch"), a.get("worktree")) for a in detail.get("attempts", [])]
        attempts = detail.get("attempts", [])
        started = {a.get("worktree") for a in attempts if a.get("pid")}
        indexes = {a.get("worktree"): a.get("worktree_index") for a in attempts if a.get("worktree_index")}
        for task_id, branch, worktree in rows:
            owner = _Owner(
                run["id"], task_id, run.get("base_ref"), live.get(task_id), worktree in started, branch,
                indexes.get(worktree),
            )  # fmt: skip
            for table, key in ((worktrees, worktree), (branches, branch)):
                if not key:
                    continue
                known = table.setdefault(key, owner)
                if owner.live and not known.live:
                    known.live = owner.live
    return worktrees, branches


def _fleet_live(run: dict[str, Any] | None, alive: Callable[[int | None, int | None], bool]) -> bool:
    """Whether the run's fleet still runs (an unknown run, from refs alone, is not live)."""
    return (
        run is not None
        and run.get("status") == RunStatus.RUNNING
        and alive(run.get("pid"), run.get("created_at_ms"))
    )


def teardown_env(root: Path, owner: _Owner, path: Path) -> dict[str, str]:
    """Ours, with the variables of the worktree's task its setup had (`app-$STELLA_TASK_ID`)."""
    worker = {*WorkerContext.env_names(), "STELLA_WORKTREE_INDEX"}  # never a stale one of ours
    env = {key: value for key, value in os.environ.items() if key not in worker}
    named = {
        "STELLA_ROOT": str(root),
        "STELLA_RUN_ID": owner.run_id,
        "STELLA_TASK_ID": owner.task_id,
        "STELLA_WORKSPACE": str(path),
        "STELLA_BRANCH": owner.branch,
        "STELLA_WORKTREE_INDEX": None if owner.worktree_index is None else str(owner.worktree_index),
    }
    store = LeaseStore.if_any()
    if store is not None:  # the ports its setup and worker had (still its: released once it is removed)
        with store:
            named |= port_env(store.ports_of(path))
    return env | {key: value for key, value in named.items() if value is not None}


def uncommitted(path: Path) -> list[str]:
    """What a worktree holds that no commit has, as git judges it (ignored files do not count)."""
    names = [line[3:] for line in gitops.status_porcelain(path)]
    return [name for name in names if not name.startswith(EXCLUDED_DIRS)]


def nested_work(path: Path, dirty: Sequence[str]) -> list[str]:
    """The nested repositories among a worktree's changes with work of their own (uncommitted, or commits
    no remote has): a salvage keeps only their commit id, so removing the worktree would lose it."""
    found = []
    for name in dirty:
        inner = path / name.rstrip("/")
        if not (inner / ".git").exists():
            continue
        code, unpushed, _ = gitops.git_status("rev-list", "--count", "HEAD", "--not", "--remotes", cwd=inner)
        if code != 0 or int(unpushed.strip() or 0) or gitops.status_porcelain(inner):
            found.append(name)
    return found


class Cleaner:
    """Decides and (unless dry) carries out the sweep for one repository."""

    def __init__(
        self,
        root: Path,
        *,
        dry_run: bool,
        force: bool,
        alive: Callable[[int | None, int | None], bool] = pid_alive,
        worktree: WorktreeConfig | None = None,
    ) -> None:
        self.root = root
        self.worktree = worktree or WorktreeConfig()  # its teardown runs before a worktree goes
        self.paths = StatePaths(root)
        self.report = CleanReport(dry_run=dry_run, force=force)
        self.alive = alive
        self.gone_worktrees: set[Path] = set()
        self.merged_by_stella: dict[str, str] = {}  # branch -> where `stella merge` landed it

    def _decide(self, owner: _Owner, kind: str, target: str, remove: bool, reason: str) -> None:
        action = (WOULD_REMOVE if self.report.dry_run else REMOVED) if remove else KEPT
        self.report.items.append(CleanItem(owner.run_id, owner.task_id, kind, target, action, reason))

    def _remove(self, owner: _Owner, kind: str, target: str, reason: str, remove: Callable[[], None]) -> bool:
        """Remove (unless a dry run) and record the decision; what git refuses to remove is kept."""
        if not self.report.dry_run:
            try:
                remove()
            except GitError as exc:
                self._decide(owner, kind, target, False, f"git refused: {exc}")
                return False
        self._decide(owner, kind, target, True, reason)
        return True

    def _display(self, path: Path) -> str:
        return str(path.relative_to(self.root) if path.is_relative_to(self.root) else path)

    def sweep_worktrees(self, recorded: dict[str, _Owner]) -> None:
        managed = self.paths.worktrees.resolve()
        registered = {wt.path.resolve(): wt for wt in worktrees.worktree_list(self.root)}
        for raw, owner in recorded.items():
            path = (self.root / raw).resolve()  # an absolute raw stays itself
            if managed not in path.parents:
                continue  # the shared tree, or anything outside .stella/worktrees/, is never ours to remove
            shown = self._display(path)
            if path not in registered:
                if path.exists():
                    self._decide(
                        owner, "worktree", shown, False, "not a registered git worktree: remove it by hand"
                    )
                continue
            if owner.live:
                self._decide(owner, "worktree", shown, False, f"{owner.live}; never removed while live")
                continue
            dirty = uncommitted(path) if path.exists() else []
            reason, keep = self._why_removable(owner, path, dirty)
            if keep:
                self._decide(owner, "worktree", shown, False, reason)
                continue
            reason += self._teardown(owner, path)
            remove = partial(
                worktrees.worktree_remove, self.root, path, force=bool(dirty) or not path.exists()
            )
            if self._remove(owner, "worktree", shown, reason, remove):
                self.gone_worktrees.add(path)

    def _why_removable(self, owner: _Owner, path: Path, dirty: list[str]) -> tuple[str, bool]:
        """Why the (not live) worktree at path may go, or why it is kept: (the reason, whether kept)."""
        busy = group.working_in(path) if path.exists() else []
        if busy:
            what = f"pid {busy[0].pid}" + (f" and {len(busy) - 1} more" if len(busy) > 1 else "")
            return f"a process is still running in it ({what}); never removed under it", True
        nested = nested_work(path, dirty)
        if nested and not self.report.force:
            why = f"holds a nested repository with work of its own ({', '.join(nested[:3])}): "
            return why + "commit or push it there, or rerun with --force", True
        if not dirty:
            return "clean worktree", False
        # the task's salvage ref, when it holds exactly the worktree's uncommitted work (nothing is lost)
        held = salvage.holds_worktree(self.root, path, owner.run_id, owner.task_id) if owner.task_id else None
        if held is not None:
            return f"uncommitted changes ({len(dirty)}) kept in {held.ref} ({held.sha[:7]})", False
        if not owner.worker_started:  # what an interrupted setup left (configure debris): not anyone's work
            return (
                f"uncommitted files ({len(dirty)}) left by its [worktree] setup: no worker ran in it",
                False,
            )
        if self.report.force:
            return f"uncommitted changes ({len(dirty)}) discarded by --force", False
        files = f"{plural(len(dirty), 'file')}: {', '.join(dirty[:3])}" + (", ..." if len(dirty) > 3 else "")
        return f"has uncommitted changes ({files}): commit or discard them, or rerun with --force", True

    def _teardown(self, owner: _Owner, path: Path) -> str:
        """`[worktree] teardown` run in the worktree unless a dry run (output to the task's log), in words."""
        command, timeout = self.worktree.teardown, self.worktree.teardown_timeout
        if command is None or self.report.dry_run or not path.exists():
            return ""
        log_path = self.paths.log_file(owner.run_id, owner.task_id or "clean")
        done = shell.run_logged(
            "teardown", command, cwd=path, env=teardown_env(self.root, owner, path), log_path=log_path,
            timeout=timeout,
        )  # fmt: skip
        return (
            "; teardown ran" if done.ok else f"; teardown failed ({done.describe(timeout)}), removed anyway"
        )

    def _merge_targets(self, base_ref: str | None) -> list[str]:
        targets: list[str] = []
        if base_ref and base_ref != "HEAD" and gitops.ref_commit(self.root, base_ref):
            targets.append(base_ref)
        current = gitops.current_branch(self.root)
        if current and current not in targets:
            targets.append(current)
        return targets or ["HEAD"]

    def _patches_in(self, branch: str, targets: list[str]) -> str | None:
        """Why a branch that is no ancestor of a target still counts as merged (its changes are there)."""
        into = next((t for t in targets if mergeops.changes_held(self.root, t, branch)), None)
        if into is None:
            return None
        how = "rebased onto it by stella merge" if branch in self.merged_by_stella else "same changes"
        return f"merged into {into} ({how})"

    def sweep_branches(self, recorded: dict[str, _Owner]) -> None:
        checked_out = {
            wt.branch: wt.path.resolve() for wt in worktrees.worktree_list(self.root) if wt.branch is not None
        }
        for branch, owner in recorded.items():
            if not branch.startswith(BRANCH_PREFIX) or not gitops.branch_exists(self.root, branch):
                continue
            if owner.live:
                self._decide(owner, "branch", branch, False, f"{owner.live}; never removed while live")
                continue
            where = checked_out.get(branch)
            if where is not None and where not in self.gone_worktrees:
                self._decide(owner, "branch", branch, False, f"checked out in {self._display(where)}")
                continue
            reason = self._branch_reason(owner, branch)
            if reason is None:
                continue
            tip = gitops.ref_commit(self.root, f"refs/heads/{branch}") or ""
            reason += f" (was {tip[:7]})"  # as `git branch -D` prints it: the way back to the commits
            self._remove(owner, "branch", branch, reason, partial(gitops.branch_delete, self.root, branch))

    def _branch_reason(self, owner: _Owner, branch: str) -> str | None:
        """Why the branch may go, or None once it is kept (the decision recorded)."""
        targets = self._merge_targets(owner.base_ref)
        merged_into = next((t for t in targets if gitops.is_ancestor(self.root, branch, t)), None)
        if merged_into is not None:
            return f"merged into {merged_into}"
        patched_into = self._patches_in(branch, targets)
        if patched_into is not None:
            return patched_into
        if salvage.held_elsewhere(self.root, branch) == 0:
            return "every commit is on another branch or a salvage ref"
        ahead = gitops.commits_ahead(self.root, targets[0], branch)
        commits = plural(ahead, "commit")
        if not self.report.force:
            why = f"not merged into {' or '.join(targets)} ({commits} ahead): "
            self._decide(owner, "branch", branch, False, why + "merge it, or rerun with --force to delete it")
            return None
        return f"not merged ({commits} ahead), deleted by --force"

    def sweep_salvage(self, run_ids: list[str], live: set[str], older_than_days: float | None) -> None:
        """--salvage: remove the salvage refs of the runs (older than the given days), never a live run's."""
        for run_id in run_ids:
            for ref in salvage.older_than(salvage.salvage_refs(self.root, run_id), older_than_days):
                _, task_id, attempt = ref.parts
                owner = _Owner(run_id, task_id, None, None)
                if run_id in live:
                    self._decide(owner, "salvage", ref.ref, False, f"run {run_id} is still running")
                    continue
                reason = f"salvage of attempt {attempt} removed by --salvage (was {ref.sha[:7]})"
                alone = salvage.unbranched_ancestors(self.root, ref.sha)
                commits = plural(alone, "commit")
                if alone and not self.report.force:
                    why = f"holds {commits} no branch holds: `git branch NAME {ref.sha[:12]}^` keeps them"
                    self._decide(owner, "salvage", ref.ref, False, why + ", or rerun with --force")
                    continue
                if alone:
                    reason += f", with {commits} no branch holds, by --force"
                self._remove(
                    owner, "salvage", ref.ref, reason, partial(salvage.delete_salvage, self.root, ref)
                )


def clean(
    root: Path,
    *,
    run_ref: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    alive: Callable[[int | None, int | None], bool] = pid_alive,
    worktree: WorktreeConfig | None = None,
    salvage_refs: bool = False,
    older_than_days: float | None = None,
) -> CleanReport:
    """Sweep one run (run_ref) or every run's leftovers; salvage refs first, with salvage_refs."""
    cleaner = Cleaner(root, dry_run=dry_run, force=force, alive=alive, worktree=worktree)
    db = StatePaths(root).fleet_db
    if not db.exists():
        return cleaner.report
    with Ledger.open(db, readonly=dry_run) as ledger:
        run_ids = [ledger.runs.resolve(run_ref)] if run_ref else ledger.runs.with_workspaces()
        if salvage_refs:
            salvaged = run_ids if run_ref else sorted({r.parts[0] for r in salvage.salvage_refs(root)})
            live = {run_id for run_id in salvaged if _fleet_live(ledger.runs.get(run_id), alive)}
            cleaner.sweep_salvage(salvaged, live, older_than_days)
        cleaner.report.runs_considered = len(run_ids)
        details = [ledger.get_run(run_id) for run_id in run_ids]
        worktrees, branches = _collect(details, alive)
        cleaner.merged_by_stella = ledger.merges.merged_branches()
        cleaner.sweep_worktrees(worktrees)
        cleaner.sweep_branches(branches)
        if not dry_run:
            release_ports(cleaner.gone_worktrees)
            for item in cleaner.report.items:
                ledger.cleanups.record(**asdict(item))
    return cleaner.report


def release_ports(gone: Iterable[Path]) -> None:
    """The ports of the worktrees removed go back to the host's lease store."""
    store = LeaseStore.if_any()
    if store is not None:
        with store:
            for path in gone:
                store.release_worktree(path)


def repair(root: Path, records: Sequence[Record]) -> bool:
    """A killed `stella clean`: git forgets the worktree it was removing (the next clean decides again)."""
    gitops.git("worktree", "prune", cwd=root, check=False)
    return True
