"""A warm worker launcher: one pre-imported Python process that forks every worker of a run.

Starting a fresh interpreter and importing stellafleet costs tens of milliseconds of CPU per worker,
which is most of a fleet's per-task overhead. The launcher (`python -m stellafleet.worker.launcher`) pays it
once: it imports the worker and the run's pipelines, then forks one child per request. A child becomes
exactly what `python -m stellafleet.worker.main` would be: its own session, the task's environment and
working directory, stdin from /dev/null, stdout and stderr appended to the task's log, and it runs
`stellafleet.worker.main.main()`.

The launcher stays single-threaded (forking a threaded process is unsafe), reaps its children and reports
each exit with its status and rusage. Requests and replies are JSON lines on its stdin and stdout:

    -> {"id": 1, "set": {...}, "unset": [...], "cwd": "...", "log": "..."}
    <- {"id": 1, "pid": 4242}          or {"id": 1, "error": "..."}
    <- {"exit": 4242, "status": 0, "cpu": 0.012, "maxrss": 31457280}

A worker's environment is sent as its difference from the launcher's own (which the fleet handed it at
start): a forked child pays for every page it writes, and rewriting the whole environment was a good
part of a no-op worker's cost.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# --- the launcher process ---


def _child(request: dict[str, Any], close: Sequence[int], ready: int) -> None:
    """In the forked child: become the worker process, run it, and never return."""
    code = 1
    try:
        os.setsid()
        os.close(ready)  # tells the launcher the worker leads its own session now
        for fd in close:  # the launcher's own channels are not the worker's business
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request["cwd"])
        for key in request["unset"]:
            os.environ.pop(key, None)
        os.environ.update(request["set"])
        from stellafleet.worker import main as worker

        code = worker.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(preload: Sequence[str]) -> int:
    """The launcher's loop: fork on request, report exits, leave when the fleet closes stdin."""
    from stellafleet.proc.orphan import die_with_parent

    die_with_parent()  # a killed fleet takes its launcher along; the orphaned workers then end themselves
    environment = _preload(preload)
    from stellafleet.worker import main as worker

    if threading.active_count() > 1:
        # A preloaded module started a thread: forking now could copy a held lock into every worker.
        # Leaving makes the fleet start fresh interpreters instead.
        return 3
    forker = _Forker(environment, worker.preload_config)
    forker.serve(sys.stdin.fileno())
    forker.reap(block=True)  # the fleet is gone or done: wait for whatever still runs, then leave
    return 0


def _preload(preload: Sequence[str]) -> dict[str, str]:
    """Import the worker and the run's pipelines; the environment the fleet handed us, as it was."""
    import importlib

    environment = dict(os.environ)  # what the fleet handed us: requests are differences from it
    for module in ["stellafleet.worker.main", *preload]:
        with contextlib.suppress(Exception):  # a module that fails here fails again, reported, in its worker
            importlib.import_module(module)
    if os.environ != environment:  # a preloaded module changed it: workers get exactly what they are sent
        os.environ.clear()
        os.environ.update(environment)
    return environment


class _Forker:
    """The launcher's side of the channels: forks a worker per request and reports each exit."""

    def __init__(self, environment: dict[str, str], preload_config: Callable[[dict[str, str]], None]) -> None:
        self.environment = environment
        self.preload_config = preload_config
        self.out = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # nothing imported may write into the reply channel by accident
        os.close(devnull)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.children = 0

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.out, data) :]

    def reap(self, block: bool) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children = 0
                return
            if pid == 0:
                return
            self.children -= 1
            cpu = usage.ru_utime + usage.ru_stime
            self.send({"exit": pid, "status": status, "cpu": cpu, "maxrss": usage.ru_maxrss * 1024})

    def serve(self, stdin: int) -> None:
        """Fork on each request line and reap on each SIGCHLD until stdin closes."""
        buffer = b""
        while True:
            try:
                ready, _, _ = select.select([stdin, self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            self.reap(block=False)
            if stdin not in ready:
                continue
            chunk = os.read(stdin, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.fork(json.loads(line))

    def fork(self, request: dict[str, Any]) -> None:
        """Start the requested worker and answer with its pid once it leads its own session."""
        worker_env = {k: v for k, v in self.environment.items() if k not in request["unset"]}
        worker_env.update(request["set"])
        self.preload_config(worker_env)  # the child inherits it instead of parsing the config again
        ready_r, ready_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(ready_r)
            os.close(ready_w)
            self.send({"id": request["id"], "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            _child(request, close=(self.out, self.wake_r, self.wake_w, ready_r), ready=ready_w)
        self.children += 1
        os.close(ready_w)
        os.read(ready_r, 1)  # EOF once the child has its own session (or has died trying)
        os.close(ready_r)
        self.send({"id": request["id"], "pid": pid})


# --- the fleet's side ---


class LauncherGone(Exception):
    """The launcher process is no longer there to start or report workers."""


class Launcher:
    """Talks to one launcher process; `spawn` and `wait_exit` are safe from many threads."""

    def __init__(self, proc: Any, environment: Mapping[str, str]) -> None:
        self._proc = proc
        self._environment = dict(environment)  # the launcher's own: requests carry differences from it
        self._lock = threading.Lock()  # one request written at a time
        # What the reader thread has received, and one event per thread waiting for an entry: a
        # message wakes exactly the thread it is for (a shared condition woke every waiting thread for
        # every message, eight threads twice per worker at -j8).
        self._state = threading.Lock()
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, tuple[int, float, int]] = {}
        self._waiting: dict[tuple[str, int], threading.Event] = {}
        self._gone = False
        self._log_dirs: set[Path] = set()  # made already: one mkdir per directory, not per worker
        self._reader = threading.Thread(target=self._read, name="stella-launcher", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, preload: Sequence[str], *, cwd: Path) -> Launcher | None:
        """A running launcher, or None where workers cannot be forked (they are exec'd instead)."""
        if not hasattr(os, "fork") or not hasattr(os, "pidfd_open") or sys.platform != "linux":
            return None
        import subprocess

        environment = dict(os.environ)
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "stellafleet.worker.launcher", *preload],
            cwd=str(cwd),
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is the fleet's to handle
        )
        return cls(proc, environment)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._state:
                if "exit" in message:
                    pid = message["exit"]
                    status = os.waitstatus_to_exitcode(message["status"])
                    self._exits[pid] = (status, float(message["cpu"]), int(message["maxrss"]))
                    waiter = self._waiting.pop(("exit", pid), None)
                else:
                    self._replies[message["id"]] = message
                    waiter = self._waiting.pop(("reply", message["id"]), None)
            if waiter is not None:
                waiter.set()
        with self._state:
            self._gone = True
            waiters = list(self._waiting.values())
            self._waiting.clear()
        for waiter in waiters:
            waiter.set()

    def _take(self, kind: str, key: int, received: dict[int, Any], timeout: float | None) -> Any:
        """The entry for key once the reader has it (None on timeout or when the launcher is gone)."""
        with self._state:
            if key in received or self._gone:
                return received.pop(key, None)
            waiter = self._waiting.setdefault((kind, key), threading.Event())
        waiter.wait(timeout)
        with self._state:
            if self._waiting.get((kind, key)) is waiter:
                del self._waiting[(kind, key)]
            return received.pop(key, None)

    @property
    def alive(self) -> bool:
        return not self._gone

    def spawn(self, *, env: Mapping[str, str], cwd: Path, log_path: Path) -> int:
        """Fork a worker; its pid. LauncherGone if the launcher has exited."""
        if log_path.parent not in self._log_dirs:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_dirs.add(log_path.parent)
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            base = self._environment
            request = {
                "id": request_id,
                "set": {key: value for key, value in env.items() if base.get(key) != value},
                "unset": [key for key in base if key not in env],
                "cwd": str(cwd),
                "log": str(log_path),
            }
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise LauncherGone("the worker launcher has exited") from None
        reply = self._take("reply", request_id, self._replies, None)
        if reply is None:
            raise LauncherGone("the worker launcher has exited")
        if "error" in reply:
            raise OSError(reply["error"])
        return int(reply["pid"])

    def exit_of(self, pid: int) -> tuple[int, float, int] | None:
        """(exit code, CPU seconds, peak RSS bytes) once the launcher has reaped pid."""
        with self._state:
            return self._exits.pop(pid, None)

    def wait_exit(self, pid: int, timeout: float) -> tuple[int, float, int] | None:
        exited: tuple[int, float, int] | None = self._take("exit", pid, self._exits, timeout)
        return exited

    def release(self) -> None:
        """No more workers to fork: the launcher reaps what still runs, reports it, and exits."""
        with self._lock:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        """Let the launcher go (release) and wait for it to exit."""
        self.release()
        try:
            self._proc.wait(timeout=10)
        except Exception:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
