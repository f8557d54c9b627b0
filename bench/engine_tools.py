"""Bench: the engine's grep and glob tools against `git grep` and `git ls-files` run directly.

Generates a committed git repository of 50,000 files in a temporary directory, then times each tool
call (through the Toolbox, exactly as the model calls it) against the plain git command run as a
subprocess, in the same run. Prints medians and ratios; the target is within 1.5x.

    python bench/engine_tools.py [--files 50000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stellafleet.engine.tools import Toolbox, Workspace
from stellafleet.git import gitops

TARGET = 1.5


def generate(root: Path, files: int) -> None:
    per_dir = 100
    for n in range(files):
        directory = root / "src" / f"pkg_{n // per_dir:04d}"
        if n % per_dir == 0:
            directory.mkdir(parents=True)
        suffix = ".py" if n % 2 == 0 else ".txt"
        needle = "    # NEEDLE: rare marker\n" if n % 997 == 0 else ""
        body = "".join(f"def function_{n}_{i}(value):\n    return value + {i}\n" for i in range(8))
        (directory / f"module_{n:05d}{suffix}").write_text(f'"""Module {n}."""\n{needle}{body}')
    env = {
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "b@x",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "b@x",
    }
    gitops.git("init", "-q", "-b", "main", cwd=root)
    gitops.git("add", "-A", cwd=root)
    gitops.git("commit", "-q", "-m", "generated", cwd=root, env=env)


def timings(actions: list[Callable[[], object]], repeat: int) -> list[tuple[float, float]]:
    """(median, min) seconds per action; runs interleaved so load on the machine hits all alike."""
    for action in actions:
        action()  # warm the page cache and git's index
    samples: list[list[float]] = [[] for _ in actions]
    for _ in range(repeat):
        for action, times in zip(actions, samples, strict=True):
            start = time.perf_counter()
            action()
            times.append(time.perf_counter() - start)
    return [(statistics.median(times), min(times)) for times in samples]


def git_direct(root: Path, *args: str) -> Callable[[], object]:
    return lambda: subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--repo", type=Path, help="reuse a repository generated before (in DIR/repo)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stella-bench-tools-") as tmp:
        root = Path(tmp) / "repo"
        if args.repo is not None:
            root = args.repo
            print(f"reusing {root} ({len(gitops.ls_files(root)):,} files)")
        else:
            root.mkdir()
            start = time.perf_counter()
            generate(root, args.files)
            print(f"generated and committed {args.files:,} files in {time.perf_counter() - start:.1f} s")
        box = Toolbox(Workspace(root), env=dict(os.environ))
        untracked = ["--cached", "--others", "--exclude-standard"]
        # (label, tool call, [(baseline label, baseline command)])
        cases: list[tuple[str, Callable[[], object], list[tuple[str, Callable[[], object]]]]] = [
            (
                "grep NEEDLE (rare: 51 hits)",
                lambda: box.call("grep", {"pattern": "NEEDLE"}),
                [
                    ("git grep -n NEEDLE", git_direct(root, "grep", "-n", "NEEDLE")),
                    (
                        "the same git grep --untracked",
                        git_direct(root, "grep", "-n", "-I", "--untracked", "-E", "NEEDLE"),
                    ),
                ],
            ),
            (
                "grep 'return value \\+ 7' (50,000 hits, 200 shown)",
                lambda: box.call("grep", {"pattern": "return value \\+ 7"}),
                [
                    (
                        "git grep -n -E 'return value \\+ 7'",
                        git_direct(root, "grep", "-n", "-E", "return value \\+ 7"),
                    )
                ],
            ),
            (
                "grep function_4242_ include=*.py",
                lambda: box.call("grep", {"pattern": "function_4242_", "include": "*.py"}),
                [
                    (
                        "git grep -n function_4242_ -- '*.py'",
                        git_direct(root, "grep", "-n", "function_4242_", "--", "*.py"),
                    )
                ],
            ),
            (
                "glob **/*.py (25,000 matches, 500 shown)",
                lambda: box.call("glob", {"pattern": "**/*.py"}),
                [
                    ("git ls-files", git_direct(root, "ls-files")),
                    (
                        "git ls-files --cached --others --exclude-standard",
                        git_direct(root, "ls-files", *untracked),
                    ),
                ],
            ),
            (
                "glob src/pkg_0042/*.py",
                lambda: box.call("glob", {"pattern": "src/pkg_0042/*.py"}),
                [("git ls-files", git_direct(root, "ls-files"))],
            ),
        ]
        print(f"\n{'engine tool':<50} {'tool':>8} {'baseline':>8} {'ratio':>6} {'(min)':>6}  baseline")
        worst = 0.0
        for label, tool, baselines in cases:
            measured = timings([tool, *(command for _, command in baselines)], args.repeat)
            (tool_med, tool_min), rest = measured[0], measured[1:]
            for (base_label, _), (base_med, base_min) in zip(baselines, rest, strict=True):
                ratio = tool_med / base_med
                worst = max(worst, ratio)
                print(
                    f"{label:<50} {tool_med * 1000:>6.1f}ms {base_med * 1000:>6.1f}ms {ratio:>5.2f}x "
                    f"{tool_min / base_min:>5.2f}x  {base_label}"
                )
                label = ""
        print(f"\nmedians of {args.repeat} interleaved runs; target {TARGET}x; worst ratio {worst:.2f}x")
        print(
            "note: grep and glob include new (untracked, not ignored) files, which plain `git grep` and\n"
            "`git ls-files` leave out; finding them costs git a walk of the work tree, shown by the\n"
            "second baseline of each (the same listing, run directly)."
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
