"""The one process runner on real processes: output, input, files, timeouts that stop the whole group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers.spawn import ended_within

from stellafleet.proc import runner
from stellafleet.proc.group import group_exists

# Leaves a grandchild in its group that ignores SIGTERM, tells its pid, then hangs.
HANGS_WITH_A_STUBBORN_CHILD = (
    "sh -c 'trap \"\" TERM; sleep 60' & echo $!; exec sleep 60"  # the shell becomes the sleeping leader
)


def test_a_command_runs_to_its_end_with_its_output_and_status(tmp_path: Path) -> None:
    done = runner.run(["/bin/sh", "-c", "pwd; echo err >&2; printf 'a\\r\\nb'; exit 3"], cwd=tmp_path)
    assert done == runner.Result(3, f"{tmp_path}\na\r\nb", "err\n")  # bytes as written, no newline rewrite
    assert not done.timed_out


def test_input_env_and_undecodable_bytes(tmp_path: Path) -> None:
    done = runner.run(
        ["/bin/sh", "-c", "cat; echo $MARK; printf '\\377'"],
        input="fed\n",
        env={"MARK": "seen", "PATH": os.environ["PATH"]},
    )
    assert done.stdout == "fed\nseen\n\ufffd"


def test_output_can_go_to_a_file_with_stderr_joined(tmp_path: Path) -> None:
    with (tmp_path / "out").open("w+b") as out:
        done = runner.run(["/bin/sh", "-c", "echo one; echo two >&2"], stdout=out, stderr=runner.STDOUT)
        out.seek(0)
        assert out.read() == b"one\ntwo\n"
    assert done.stdout == "" and done.returncode == 0


def test_a_timeout_stops_the_whole_group_and_keeps_what_it_printed() -> None:
    started = time.monotonic()
    done = runner.run(["/bin/sh", "-c", HANGS_WITH_A_STUBBORN_CHILD], timeout=2.0, grace_s=0.3)
    assert done.timed_out and done.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 10
    assert ended_within(
        int(done.stdout.split()[0]), 10.0
    )  # the grandchild that ignored SIGTERM was killed with it


def test_a_started_process_is_followed_line_by_line_and_stopped_from_outside() -> None:
    proc = runner.start(
        [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"], text=True
    )
    with proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert proc.poll() is None
        proc.stop(0.2)
        assert proc.returncode == -signal.SIGTERM
        assert proc.wait() == -signal.SIGTERM
    assert not group_exists(proc.pid)


def test_a_command_gets_its_own_session_unless_it_is_part_of_our_work() -> None:
    argv = [sys.executable, "-c", "import os; print(os.getpid(), os.getsid(0))"]
    pid, sid = map(int, runner.run(argv).stdout.split())
    assert sid == pid
    pid, sid = map(int, runner.run(argv, session=False).stdout.split())
    assert sid == os.getsid(0)
    with pytest.raises(ValueError, match="own session"):
        runner.run(["true"], timeout=1, session=False)


def test_a_program_that_cannot_start_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        runner.run([str(tmp_path / "no-such-program")])


def test_a_command_gets_exactly_the_environment_given_and_is_found_on_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEAK", "ours")
    env_and_args = "import os, sys; print(os.environ.get('HOME'), os.environ.get('LEAK'), sys.argv[1:])"
    show = [sys.executable, "-c", env_and_args]
    done = runner.run([*show, "a b", ""], env={"PATH": os.environ["PATH"]})
    assert done.stdout == "None None ['a b', '']\n"
    assert runner.run(show).stdout == f"{os.environ['HOME']} ours []\n"  # env None: ours as it is now

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").write_text("#!/bin/sh\necho found $0\n")
    (tmp_path / "bin" / "tool").chmod(0o755)
    done = runner.run(["tool"], env={"PATH": str(tmp_path / "bin")})
    assert done.stdout == f"found {tmp_path / 'bin' / 'tool'}\n"
    with pytest.raises(OSError):
        runner.run(["tool"])
