"""What the fake agent CLIs (fake_claude, fake_codex, fake_aider) share.

Tests put tiny executables named `claude`, `codex` and `aider` on a PATH directory (`write_shims`); each
runs `python -m stellafleet.testing.fake_<cli> "$@"`. A fake is driven by a JSON script from the
FAKE_AGENT_SCRIPT environment variable (the JSON itself, or `@/path/to/script.json`), optionally per task
(`{"tasks": {"t1": {...}}, "default": {...}}`) and per CLI (`{"claude": {...}, "codex": {...}}`). Every
fake appends what it did (its argv, hook decisions, events emitted, signals received) as JSON lines to the
file named by FAKE_AGENT_LOG, so tests can assert on it.

Common script keys: `mode` (each fake documents its own), `edits` (`[{"path", "content"}]`, relative
to the working directory), `commit` (`{"message": ...}`: commit the edited files with `stella commit`),
`hold_s` (sleep after editing), `pause_s` (sleep between reported events), `spawn_child` (start a
grandchild that sleeps, to prove the whole process group is stopped), `exit_code`, `stderr`, and file
barriers for ordering concurrent fakes: `wait_for` (a path to wait for before editing), `mark` (a path to
create after editing) and `wait_after` (a path to wait for after editing, before finishing).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

SCRIPT_ENV = "FAKE_AGENT_SCRIPT"
LOG_ENV = "FAKE_AGENT_LOG"
CLIS = ("claude", "codex", "aider")
HANG_S = 3600.0


def write_shims(bin_dir: Path, clis: Iterable[str] = CLIS, *, python: str | None = None) -> Path:
    """Create executables named after each CLI in bin_dir that run the matching fake; returns bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    for cli in clis:
        shim = bin_dir / cli
        shim.write_text(f'#!/bin/sh\nexec "{python}" -m stellafleet.testing.fake_{cli} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


# --- starting up: the version, argv, the start log entry and the script --------------------------------


def answers_version(args: list[str], version: str, flags: Iterable[str] = ("--version",)) -> bool:
    """Print version when one of flags was given (the fake then exits 0 at once)."""
    if any(flag in args for flag in flags):
        print(version)
        return True
    return False


def parse_args(
    argv: list[str], value_options: Collection[str], multi_options: Collection[str] = ()
) -> tuple[dict[str, Any], list[str]]:
    """(options, positional arguments): value_options take the next argument, multi_options every
    argument up to the next option (as Claude Code's variadic ones do), any other option is a flag."""
    options: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in value_options:
            options[arg] = argv[i + 1]
            i += 2
        elif arg in multi_options:
            values = []
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                values.append(argv[i])
                i += 1
            options[arg] = values
        elif arg.startswith("-") and arg != "-":  # a lone "-" is stdin, an argument
            options[arg] = True
            i += 1
        else:
            positional.append(arg)
            i += 1
    return options, positional


def begin(cli: str, args: list[str], *, cwd: Path, options: dict[str, Any], prompt: Any) -> dict[str, Any]:
    """Log SIGTERM from now on, log the start (argv, cwd, options, prompt); returns this run's script."""
    on_sigterm(cli)
    git = shutil.which("git")  # a shared-tree worker's is stella's guard
    log(cli, "start", argv=args, cwd=str(cwd), options=options, prompt=prompt, git=git)
    return load_script(cli)


def load_script(cli: str) -> dict[str, Any]:
    """This invocation's script: the task's entry (else "default"), then the CLI's section if any."""
    raw = os.environ.get(SCRIPT_ENV, "").strip()
    if not raw:
        return {}
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    script: Any = json.loads(raw)
    if isinstance(script, dict) and "tasks" in script:
        task = os.environ.get("STELLA_TASK_ID", "")
        script = script["tasks"].get(task) or script.get("default") or {}
    if isinstance(script, dict) and isinstance(script.get(cli), dict):
        script = script[cli]
    return script if isinstance(script, dict) else {}


def log(cli: str, event: str, **fields: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    entry = {
        "cli": cli,
        "event": event,
        "task": os.environ.get("STELLA_TASK_ID"),
        "pid": os.getpid(),
        **fields,
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    """The entries a fake logged (for tests)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def on_sigterm(cli: str) -> None:
    """Log SIGTERM (what the wrapper sends first) and exit the way a killed CLI does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log(cli, "terminated", signal=signal.Signals(signum).name)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def emit(obj: Any) -> None:
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def write_file(cwd: Path, relative: str, content: str) -> Path:
    target = cwd / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return target


def commit_message(cli: str, commit: dict[str, Any]) -> str:
    """The message of the script's `commit` entry."""
    return str(commit.get("message", f"fake {cli} work"))


def commit_command(message: str, paths: list[str]) -> str:
    """The shell command an agent runs to commit paths (as the fakes report it)."""
    return f"stella commit -m {json.dumps(message)} {' '.join(paths)}"


def stella_commit(cli: str, message: str, paths: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Commit through `stella commit`, found on PATH as an agent's shell would find it; logged."""
    done = subprocess.run(
        ["stella", "commit", "-m", message, *paths], cwd=cwd, capture_output=True, text=True, check=False
    )
    log(cli, "commit", exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)
    return done


def spawn_sleeper(cli: str) -> None:
    """A grandchild in the fake's process group that only a group-wide stop ends."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    log(cli, "spawned", child_pid=child.pid)


def spawn_or_hang(cli: str, script: dict[str, Any]) -> bool:
    """`spawn_child`: start a grandchild; mode `hang`: sleep until stopped. True when it hung."""
    if script.get("spawn_child"):
        spawn_sleeper(cli)
    if script.get("mode") != "hang":
        return False
    log(cli, "hanging")
    time.sleep(HANG_S)
    return True


def crash(cli: str, script: dict[str, Any], default: str) -> int:
    sys.stderr.write(str(script.get("stderr", default)) + "\n")
    sys.stderr.flush()
    log(cli, "crashed")
    return int(script.get("exit_code", 1))


def crash_or_garble(cli: str, script: dict[str, Any], *, stderr: str, garbage: str) -> int | None:
    """Mode `crash` (stderr and a non-zero exit) or `malformed` (one line that is not JSON, exit 0): the
    exit status; None for any other mode."""
    mode = script.get("mode")
    if mode == "crash":
        return crash(cli, script, stderr)
    if mode == "malformed":
        emit(garbage)
        return 0
    return None


def wait_for_file(path: str | None, timeout: float = 120.0) -> None:
    """Block until path exists (a barrier between concurrent fakes); give up loudly after timeout."""
    if not path:
        return
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            sys.stderr.write(f"fake agent: gave up waiting for {path}\n")
            raise SystemExit(3)
        time.sleep(0.02)


def mark(path: str | None) -> None:
    if path:
        Path(path).write_text("")


def pause(script: dict[str, Any], key: str = "pause_s") -> None:
    """Sleep for the script's `pause_s` (or another key's) seconds, if any."""
    seconds = float(script.get(key, 0) or 0)
    if seconds:
        time.sleep(seconds)
