"""doit's own views (`list`, `info`) of a compiled plan, for `stella plan list` / `stella plan info`."""

from __future__ import annotations

import contextlib
import io

from doit.doit_cmd import DoitMain

from stellafleet.plan.model import Plan
from stellafleet.run.waves import MEMORY_BACKEND, PlanLoader


def doit_view(plan: Plan, argv: list[str]) -> tuple[int, str, str]:
    """Run a doit command (["list"]) on the compiled plan in this process; (exit code, stdout, stderr)."""
    main = DoitMain(
        task_loader=PlanLoader(plan, backend=MEMORY_BACKEND),
        config_filenames=(),
        extra_config={"BACKEND": {MEMORY_BACKEND: "stellafleet.run.waves:MemoryBackend"}},
    )
    main.BIN_NAME = "doit"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.run(list(argv))
    return int(code), out.getvalue(), err.getvalue()
