"""The one place stella starts a program (`start`, `run`), git and gh too; by default in its own session, so
a timeout or Ctrl-C stops its group. Plain subprocess: plumbum was measured and left ("Why not plumbum" in
docs/architecture.md)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from stellafleet.proc.group import ProcessSet

PIPE = subprocess.PIPE  # captured
DEVNULL = subprocess.DEVNULL  # nothing in; thrown away
STDOUT = subprocess.STDOUT  # stderr only: into wherever stdout goes
INHERIT = None  # ours (the terminal)
DRAIN_S = 1.0  # after a stop, how long to read what is left in its pipes

Stream = int | IO[Any] | None


@dataclass(frozen=True)
class Result:
    """How a command that was run to its end, or to its timeout, went."""

    returncode: int  # negative: killed by that signal
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False  # it ran out of time and its group was stopped


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def signal_description(returncode: int) -> str:
    """'exit status 3' or 'killed by signal SIGKILL' for a Popen-style return code."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by signal {name}"


class Process:
    """A started command. poll, wait and stop may come from another thread than the one reading it."""

    def __init__(self, popen: subprocess.Popen[Any], *, session: bool) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.session = session
        self.stdout = popen.stdout
        self.stderr = popen.stderr

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._popen.__exit__(*exc)  # closes its pipes and reaps it

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self) -> int:
        """Its exit status once it has ended (negative: killed by that signal)."""
        return self._popen.wait()

    def finish(self, input: str = "") -> Result:
        """Feed input to a process started with stdin=PIPE, close its stdin and wait for its end."""
        out, err = self._popen.communicate(input.encode())
        return Result(self._popen.returncode, _text(out), _text(err))

    def reaped(self, code: int) -> None:
        """Its exit, reaped by the caller (os.wait4, for the rusage): nothing waits on its pid again."""
        self._popen.returncode = code

    def stop(self, grace_s: float, *, identity: Mapping[str, str] | None = None) -> None:
        """SIGTERM to its group (and what carries identity, an attempt's), up to grace_s to end, SIGKILL
        to what is left; reaped when this returns."""
        if not self.session:
            raise ValueError("only a command in its own session can be stopped with its group")
        ours = () if self._popen.returncode is not None else (self.pid,)  # a reaped pid may be another's
        ProcessSet(*ours, group=self.pid, leader=self._popen, identity=identity).stop(grace_s)


def start(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Stream = DEVNULL,
    stdout: Stream = PIPE,
    stderr: Stream = PIPE,
    session: bool = True,
    text: bool = False,
) -> Process:
    """Start argv in cwd with env (None: ours as it is now); OSError when it cannot start. text: its pipes
    read as UTF-8 lines (undecodable bytes replaced) for a caller that follows them as they come."""
    popen = subprocess.Popen(
        list(argv),
        env=None if env is None else dict(env),
        cwd=None if cwd is None else str(cwd),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=session,
        close_fds=True,
        encoding="utf-8" if text else None,
        errors="replace" if text else None,
        bufsize=1 if text else -1,  # text: line by line, as the caller follows it
    )
    return Process(popen, session=session)


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
    grace_s: float = 0.0,
    stdout: Stream = PIPE,
    stderr: Stream = PIPE,
    session: bool = True,
    on_start: Callable[[int], None] | None = None,
) -> Result:
    """Run argv to its end with input (if any) on stdin; past timeout, or on Ctrl-C, its group is stopped
    (the Result keeps what it printed). on_start is told its pid. OSError when it cannot start."""
    if timeout is not None and not session:
        raise ValueError("a timeout needs the command in its own session, to stop it with its group")
    stdin = DEVNULL if input is None else PIPE
    with start(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, session=session) as proc:
        popen = proc._popen
        try:
            if on_start is not None:
                on_start(proc.pid)
            out, err = popen.communicate(None if input is None else input.encode(), timeout)
        except subprocess.TimeoutExpired:
            proc.stop(grace_s)
            try:  # what it printed, unless a process that left its group still holds the pipes
                out, err = popen.communicate(timeout=DRAIN_S)
            except subprocess.TimeoutExpired:
                out, err = b"", b""
            return Result(popen.returncode, _text(out), _text(err), timed_out=True)
        except BaseException:  # Ctrl-C: its own session does not get the terminal's, so pass it on
            if session:
                proc.stop(grace_s)
            raise
    return Result(popen.returncode, _text(out), _text(err))


def become(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """This process replaced by argv[0] (a path): a wrapper handing over to what it wraps, stdio and all."""
    os.execve(argv[0], list(argv), dict(env))
