"""The `notes` pipeline: a complete, minimal stella pipeline plugin.

A pipeline is any class with the members below; stella finds it through the `stella.pipelines`
entry-point group declared in this package's pyproject.toml and creates it with no arguments, once per
worker process.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from stellafleet.core.config import Config
from stellafleet.core.errors import StellaError
from stellafleet.core.spend import SpendReporter
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git.lane import commit_paths
from stellafleet.pipelines.base import PipelineResult


class NotesPipeline:
    name = "notes"
    description = "writes the task's prompt to notes/<task>.md and commits it (example plugin)"

    def preflight(
        self, config: Config, *, spend_limited: bool = False, model: str | None = None
    ) -> str | None:
        """None when ready; otherwise one line saying what to install or configure.

        The fleet calls this before anything runs, once per model this pipeline's tasks use (`model`:
        a task's own model, None for the default), with spend_limited=True when the run has a spend
        limit: a pipeline that prices tokens itself should refuse a model it has no price for then.
        `notes` spends nothing, so it needs neither. (A plugin may still declare the older
        `preflight(self, config)`: stella passes only the keywords a preflight accepts.)
        """
        folder = config.get("pipelines.notes.folder", "notes")
        if not isinstance(folder, str) or not folder.strip() or folder.startswith("/"):
            return "set [pipelines.notes] folder to a folder inside the repository"
        return None

    def version(self) -> str | None:
        try:
            return version("stella-pipeline-example")
        except PackageNotFoundError:
            return None

    def run(self, ctx: WorkerContext, config: Config, spend: SpendReporter) -> PipelineResult:
        folder = str(config.get("pipelines.notes.folder", "notes")).strip("/")
        relative = f"{folder}/{ctx.task_id}.md"
        target = ctx.workspace / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# {ctx.task_title}\n\n{ctx.prompt}\n")
        spend.add(0.0, steps=1)  # report spend as it happens: nothing was spent, one step was taken
        try:
            sha = commit_paths(ctx, [relative], f"notes: {ctx.task_title or ctx.task_id}")
        except StellaError as exc:
            text = f"could not commit {relative}: {exc}"
            return PipelineResult(success=False, summary=text, error=text)
        return PipelineResult(success=True, summary=f"wrote {relative} (commit {sha[:12]})", steps=1)
