"""run/background.py: work in a thread, its error handed back, and Ctrl-C while waiting stopping
the work and waiting for it to end (so what it records is recorded) before it is raised on."""

from __future__ import annotations

import _thread
import threading

import pytest

from stellafleet.run.background import run_in_background


def test_the_work_runs_in_its_thread_and_its_error_comes_back_to_the_waiting_one() -> None:
    ran_in: list[str] = []
    run_in_background(
        lambda: ran_in.append(threading.current_thread().name), on_interrupt=lambda: None, name="w"
    )
    assert ran_in == ["w"]

    def failing() -> None:
        raise ValueError("the task broke")

    with pytest.raises(ValueError, match="the task broke"):
        run_in_background(failing, on_interrupt=lambda: None, name="stella-test")


def test_ctrl_c_while_waiting_stops_the_work_and_waits_for_its_end_before_it_is_raised() -> None:
    stopped = threading.Event()
    said: list[str] = []

    def work() -> None:
        _thread.interrupt_main()  # Ctrl-C reaches the waiting (main) thread
        assert stopped.wait(30)  # the worker runs until it is stopped
        said.append("recorded")  # what the attempt records after its stop

    def on_interrupt() -> None:
        said.append("stopped")
        stopped.set()

    with pytest.raises(KeyboardInterrupt):
        run_in_background(work, on_interrupt=on_interrupt, name="stella-test")
    assert said == ["stopped", "recorded"]
