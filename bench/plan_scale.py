"""How fast a big plan is loaded, checked, compiled to doit tasks and cut into waves.

Generates a 10,000-task plan with about 30,000 dependency edges (a DAG: every edge points to an
earlier task), writes it as TOML to a temporary file, and times

    load (parse + JSON Schema + graph checks) -> graph.compile_tasks -> Plan.waves

against graphlib.TopologicalSorter(...).static_order() on the same graph, measured in the same run.

    python bench/plan_scale.py [--tasks 10000] [--edges 30000] [--max-concurrency 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import graphlib
import json
import random
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from stellafleet.plan import schema as planschema
from stellafleet.plan.model import load_plan, plan_from_data
from stellafleet.run import waves as graph


def make_plan(tasks: int, edges: int, seed: int = 7) -> tuple[str, dict[str, list[str]]]:
    """TOML text of a random DAG plan, and its dependency mapping."""
    rng = random.Random(seed)
    dependencies: dict[str, list[str]] = {f"task-{0:05d}": []}
    per_task = edges / max(tasks - 1, 1)
    lines = []
    for number in range(tasks):
        task_id = f"task-{number:05d}"
        wanted = int(per_task) + (1 if rng.random() < per_task - int(per_task) else 0)
        chosen = sorted({f"task-{rng.randrange(number):05d}" for _ in range(wanted)}) if number else []
        dependencies[task_id] = chosen
        lines += [
            "[[tasks]]",
            f'id = "{task_id}"',
            f'prompt = "Do step {number} of the migration"',
            f"depends_on = {json.dumps(chosen)}",
            f'claims = ["src/part{number % 500}/file{number}.py"]',
            "",
        ]
    return "\n".join(lines), dependencies


def best_of(repeat: int, run: object) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--edges", type=int, default=30_000)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()

    text, dependencies = make_plan(options.tasks, options.edges)
    edge_count = sum(len(chosen) for chosen in dependencies.values())
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "plan.toml"
        path.write_text(text, encoding="utf-8")

        stages: dict[str, float] = {}

        def load() -> None:
            load_plan(path)

        plan = load_plan(path)
        data = tomllib.loads(text)
        stages["load + validate"] = best_of(options.repeat, load)
        stages["  parse TOML"] = best_of(options.repeat, lambda: tomllib.loads(text))
        stages["  check data"] = best_of(options.repeat, lambda: plan_from_data(data, root=path.parent))
        stages["  JSON Schema check"] = best_of(options.repeat, lambda: planschema.schema_problems(data))
        stages["compile_tasks"] = best_of(options.repeat, lambda: graph.compile_tasks(plan))
        stages["waves"] = best_of(options.repeat, lambda: plan.waves(options.max_concurrency))

        def everything() -> None:
            loaded = load_plan(path)
            graph.compile_tasks(loaded)
            loaded.waves(options.max_concurrency)

        total = best_of(options.repeat, everything)
        baseline = best_of(
            options.repeat, lambda: list(graphlib.TopologicalSorter(dependencies).static_order())
        )

    waves = plan.waves(options.max_concurrency)
    print(f"plan: {len(plan.tasks)} tasks, {edge_count} dependency edges, {len(text) / 1e6:.2f} MB of TOML")
    print(f"waves at max concurrency {options.max_concurrency}: {len(waves)}")
    for stage, seconds in stages.items():
        print(f"  {stage:<32} {seconds * 1000:8.1f} ms")
    print(f"total (load + validate + compile + waves): {total * 1000:.1f} ms (best of {options.repeat})")
    print(f"baseline graphlib static_order:            {baseline * 1000:.1f} ms")
    print(f"ratio total / baseline:                    {total / baseline:.1f}x")
    target = 2.0  # jsonschema itself checks a task in about 0.1 ms: a 10,000-task plan in about a second
    print(f"target: under {target:.1f} s -> {'met' if total < target else 'NOT met'}")
    return 0 if total < target else 1


if __name__ == "__main__":
    sys.exit(main())
