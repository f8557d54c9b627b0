"""`stella plan`: check, show and inspect plan files without running anything."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stellafleet import pipelines
from stellafleet.commands import positive_int, print_schema, usage
from stellafleet.core import jsontext
from stellafleet.core.errors import EXIT_OK, EXIT_USAGE, PlanError, StellaError
from stellafleet.core.terminal import printable, single_line, styled
from stellafleet.core.words import plural, tasks_in_waves
from stellafleet.plan import schema as planschema
from stellafleet.plan.model import Plan, PlanTask, load_plan
from stellafleet.run.waves import EXPANDS_NOTE, doit_view


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="check and show plan files (nothing runs)",
        description="Check plan files and show their waves and graph; nothing runs.",
    )
    parser.set_defaults(func=lambda args: usage(parser))
    sub = parser.add_subparsers(dest="plan_command", metavar="SUBCOMMAND")

    check = sub.add_parser("check", help="validate plans; print each problem; exit 2 on any")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(func=check_command)

    show = sub.add_parser("show", help="the waves and each task's dependencies, claims and isolation")
    show.add_argument("file", metavar="FILE")
    show.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="group the waves as a fleet with this many workers would (default: no limit)",
    )
    show.add_argument(
        "--schedule",
        choices=("waves", "eager"),
        default="waves",
        help="show the run as this schedule would start its tasks (default: waves)",
    )
    show.add_argument("--json", action="store_true", help="print one JSON document")
    show.set_defaults(func=show_command)

    listing = sub.add_parser("list", help="doit's own `list` view of the compiled task graph")
    listing.add_argument("file", metavar="FILE")
    listing.set_defaults(func=lambda args: _doit(load_plan(args.file), ["list"]))

    info = sub.add_parser("info", help="doit's own `info` view of one task of the compiled graph")
    info.add_argument("file", metavar="FILE")
    info.add_argument("task", metavar="TASK")
    info.set_defaults(func=info_command)

    schema = sub.add_parser("schema", help="print the bundled plan JSON Schema")
    schema.set_defaults(func=lambda args: print_schema(planschema.BUNDLED.text))


def check_command(args: argparse.Namespace) -> int:
    """Check every file, print every problem (and warning); 2 if any file has a problem."""
    code = EXIT_OK
    for name in args.files:
        try:
            plan = load_plan(name)
        except PlanError as exc:
            problems = exc.problems
        else:
            problems = plan.unknown_pipelines(list(pipelines.available()))
        for problem in problems:
            print(problem)
        if problems:
            code = EXIT_USAGE
            continue
        waves = len(plan.waves(len(plan.tasks)))
        grows = ", plus waves for emitted tasks" if any(task.expands for task in plan.tasks) else ""
        print(f"ok: {name} ({plural(len(plan.tasks), 'task')}, {plural(waves, 'wave')}{grows})")
        if pinned := plan.pinned_after_others():
            one = len(pinned) == 1
            print(
                f"hint: {name}: isolated {'task' if one else 'tasks'} {', '.join(pinned)} "
                f"{'waits' if one else 'wait'} for {'its' if one else 'their'} dependencies but "
                f"{'starts' if one else 'start'} from the pinned base, without their work: "
                'set base = "parents" to start from it'
            )
        if claimed := plan.isolated_claims():
            print(
                f"hint: {name}: claims of isolated tasks ({', '.join(claimed)}) do nothing: each works in a "
                "worktree of its own; to keep tasks from running at once, give them a common lock: "
                'locks = ["db:test"]'
            )
    return code


def show_command(args: argparse.Namespace) -> int:
    plan = load_plan(args.file)
    limit: int | None = args.max_concurrency
    eager = getattr(args, "schedule", "waves") == "eager"
    # eager: the waves are the dependency layers, the order tasks become ready, never a wait
    waves = plan.waves(len(plan.tasks) if eager else limit or len(plan.tasks))
    explained = eager_explanation(limit) if eager else None
    if args.json:
        document = _document(plan, limit, waves)
        document.update(schedule="eager" if eager else "waves", explanation=explained)
        print(jsontext.dumps(document, indent=2, ensure_ascii=False))
        return EXIT_OK
    heading = f"{args.file}: {tasks_in_waves(len(plan.tasks), len(waves))} " + (
        f"(max concurrency {limit})" if limit else "(no concurrency limit)"
    )
    if any(task.expands for task in plan.tasks):
        heading += ", plus waves for emitted tasks"
    if explained:
        heading += f"\n{explained}"
    if sys.stdout.isatty():
        _show_rich(plan, waves, heading)
    else:
        _show_plain(plan, waves, heading)
    return EXIT_OK


def eager_explanation(limit: int | None) -> str:
    slots = f"one of the {limit} worker slots" if limit and limit > 1 else "a worker slot"
    return (
        f"eager schedule: a task starts as soon as every task it depends on has succeeded and {slots} is "
        "free, without waiting for the rest of its wave (of the ready tasks, the one with the longest chain "
        "of dependents first, timed by how long the same tasks took in earlier runs where the ledger knows); "
        "the waves below only show the order in which tasks become ready. A failed "
        "task's dependents are skipped; once the spend limit is reached no new task starts."
    )


def info_command(args: argparse.Namespace) -> int:
    plan = load_plan(args.file)
    plan.task(args.task)  # a clear error with a "did you mean" before doit sees it
    return _doit(plan, ["info", args.task])


def _doit(plan: Plan, argv: list[str]) -> int:
    code, out, err = doit_view(plan, argv)
    sys.stdout.write(printable(out))  # the plan's titles and prompts: shown, never obeyed
    if code != 0:
        raise StellaError(err.strip().removeprefix("ERROR: ") or f"doit {argv[0]} failed (exit {code})")
    return EXIT_OK


def _details(plan: Plan, task: PlanTask) -> list[tuple[str, str]]:
    start = plan.start_of(task)
    rows = [
        ("depends on", ", ".join(task.depends_on) or "-"),
        ("claims", ", ".join(task.claims) or "-"),
        *([("locks", ", ".join(task.locks))] if task.locks else []),
        *([("ports", str(task.ports))] if task.ports else []),
        ("isolation", task.isolation + (f" (starts at {start})" if start else "")),
    ]
    if task.expands:
        rows.append(("expands", "at run time: its worker emits more tasks, which run before its dependents"))
    rows.extend(
        (key, str(value))
        for key, value in (("pipeline", task.pipeline), ("model", task.model), ("timeout", task.timeout))
        if value is not None
    )
    return rows


def _show_plain(plan: Plan, waves: list[list[str]], heading: str) -> None:
    print(printable(heading))
    for number, wave in enumerate(waves, start=1):
        print(f"\nwave {number}")
        for task_id in wave:
            task = plan.task(task_id)
            print(f"  {task_id}  {single_line(task.title)}" + (f" {EXPANDS_NOTE}" if task.expands else ""))
            for key, value in _details(plan, task):
                print(f"      {key}: {single_line(value)}")


def _show_rich(plan: Plan, waves: list[list[str]], heading: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=heading, title_justify="left")
    for column in ("wave", "task", "title", "depends on", "claims", "locks", "isolation"):
        table.add_column(column, overflow="fold")
    for number, wave in enumerate(waves, start=1):
        for position, task_id in enumerate(wave):
            task = plan.task(task_id)
            table.add_row(
                str(number) if position == 0 else "",
                task_id,
                styled(single_line(task.title) + (f" {EXPANDS_NOTE}" if task.expands else "")),
                ", ".join(task.depends_on) or "-",
                "\n".join(task.claims) or "-",
                "\n".join(task.locks) or "-",
                task.isolation + (f"\n{start}" if (start := plan.start_of(task)) else ""),
                end_section=position == len(wave) - 1,
            )
    Console().print(table)


def _document(plan: Plan, limit: int | None, waves: list[list[str]]) -> dict[str, Any]:
    wave_of = {task_id: number for number, wave in enumerate(waves, start=1) for task_id in wave}
    return {
        "plan": plan.source,
        "sha256": plan.sha256,
        "max_concurrency": limit,
        "waves": waves,
        "tasks": [
            {
                "id": task.id,
                "title": task.title,
                "prompt": task.prompt,
                "depends_on": list(task.depends_on),
                "claims": list(task.claims),
                "locks": list(task.locks),
                "ports": task.ports,
                "isolation": task.isolation,
                "base": task.base,
                "starts_at": plan.start_of(task),
                "pipeline": task.pipeline,
                "model": task.model,
                "timeout": task.timeout,
                "expands": task.expands,
                "wave": wave_of[task.id],
            }
            for task in plan.tasks
        ],
        "warnings": [],  # a checked plan has none; the key stays for the readers of the document
    }
