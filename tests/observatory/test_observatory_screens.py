"""What the observatory's pages say, in real headless Chromium (same requirements as
test_observatory_browser.py): the runs list names each run's plan or command, the attention strip says a
failure once and keeps the worker's words, timeline bars carry their task's name, a finished $0 run says
so, and the clean-up table keeps its short words whole at 1400 px."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_observatory_browser import browser, click, css, observatory, text_of, until

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd, AttemptOutcome
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import StepClock, add_run, leave_for_you, sample_task

pytestmark = pytest.mark.browser
__all__ = ["browser", "observatory"]

LONG_ID = "rewrite-the-receipts-reader-for-the-new-schema"
GIT_ERROR = "fatal: unable to read tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _ledger(db: Path) -> tuple[str, str]:
    """A finished run of a plan with a long-named task, a failed one (git's words in its summary) and a
    clean-up; and a finished run of inline prompts that spent nothing."""
    clock = StepClock(1_796_116_500_000)
    with Ledger.open(db, now_ms=clock) as ledger:
        planned = add_run(ledger, "r-20261201-100000-aaaa", plan_path="/home/dev/plans/receipts.toml",
                          argv=["stella", "fleet", "--plan", "/home/dev/plans/receipts.toml"])  # fmt: skip
        ledger.tasks.add(planned, [sample_task(LONG_ID), sample_task("merge")], {LONG_ID: 1, "merge": 1})
        done = ledger.attempts.start(planned, LONG_ID, pipeline="command")
        broke = ledger.attempts.start(planned, "merge", pipeline="command")
        clock.ms += 4_000  # the long-named task's bar is short: its name must be cut to fit
        ledger.spend.add(done, 0.25, steps=1)
        ledger.attempts.finish(done, AttemptEnd(AttemptOutcome.SUCCEEDED, "read path done", exit_code=0))
        ledger.tasks.set_status(planned, LONG_ID, "succeeded")
        clock.ms += 60_000
        end = AttemptEnd(AttemptOutcome.FAILED, GIT_ERROR, "command failed: exit status 128", exit_code=128)
        ledger.attempts.finish(broke, end)
        ledger.tasks.set_status(planned, "merge", "failed", "command failed: exit status 128")
        leave_for_you(ledger, planned, "merge", "command failed: exit status 128", attempt=broke)
        ledger.cleanups.record(run_id=planned, task_id=LONG_ID, kind="worktree",
                               target="/home/dev/repo/.stella/worktrees/" + LONG_ID + "-5c1d7e9a0b2f4a6c" * 3,
                               action="removed", reason="its branch is merged into main and nothing is left "
                               "uncommitted in the worktree, so nothing of it is lost")  # fmt: skip
        ledger.runs.finish(planned, "failed", exit_code=1, reason="1 failed")
        clock.ms += 600_000
        inline = add_run(ledger, "r-20261201-110000-bbbb", argv=["stella", "fleet", "Fix the lint warnings"])
        ledger.tasks.add(inline, [sample_task("t1")], {"t1": 1})
        free = ledger.attempts.start(inline, "t1", pipeline="command")
        ledger.attempts.finish(free, AttemptEnd(AttemptOutcome.SUCCEEDED, "fixed", exit_code=0))
        ledger.tasks.set_status(inline, "t1", "succeeded")
        ledger.runs.finish(inline, "succeeded", exit_code=0)
    return planned, inline


def test_the_pages_say_what_each_run_was_and_what_went_wrong(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    planned, inline = _ledger(StatePaths(git_repo).fleet_db)
    url = observatory(git_repo)
    browser.set_window_size(1400, 1000)
    browser.get(url)
    until(browser, lambda d: len(css(d, "tr.run-row")) == 2, "two runs")
    assert "receipts.toml" in text_of(browser, f'tr.run-row[data-run-id="{planned}"] td.what-cell')
    assert text_of(browser, f'tr.run-row[data-run-id="{inline}"] td.what-cell') == (
        "stella fleet 'Fix the lint warnings'"
    )

    browser.execute_script(f"location.hash = '#/runs/{planned}'")
    until(browser, lambda d: css(d, "#attention .attention-item"), "the attention strip")
    item = " ".join(text_of(browser, "#attention .attention-item").split())
    assert item.startswith("failed merge command failed"), item  # the badge says failed; no label repeats it
    assert f"command failed: exit status 128: {GIT_ERROR}" in item  # git's words kept

    labels = browser.execute_script(
        "return [...document.querySelectorAll('#timeline-chart text.bar-label')].map(t => "
        "({attempt: t.dataset.attempt, text: t.textContent}))"
    )
    by_attempt = {
        r.get_attribute("data-attempt"): r.get_attribute("data-task")
        for r in css(browser, "#timeline-chart rect.bar")
    }
    assert labels, "no bar carries its task's name"
    for label in labels:
        task = by_attempt[label["attempt"]]
        assert label["text"] == task or (label["text"].endswith("…") and task.startswith(label["text"][:-1]))
    assert any(label["text"].endswith("…") for label in labels)  # the long id is cut to fit its bar
    long_bar = next(a for a, task in by_attempt.items() if task == LONG_ID)
    hover = (
        'const r = document.querySelector(`#timeline-chart rect.bar[data-attempt="${arguments[0]}"]`);'
        "r.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
        "return r.querySelector('title').textContent"
    )
    assert browser.execute_script(hover, long_bar).startswith(LONG_ID + " · ")  # the whole name on hover

    lines = browser.execute_script(
        "const cells = [...document.querySelectorAll('#cleanups-table tbody td')].slice(0, 4);"
        "return cells.map(td => { const r = document.createRange(); r.selectNodeContents(td);"
        " return [td.textContent, new Set([...r.getClientRects()].map(c => Math.round(c.top))).size]; })"
    )
    assert lines[1] == ["worktree", 1], lines  # one line, not "worktr-ee"
    badge = (
        "return document.querySelectorAll('#cleanups-table tbody td')[3]"
        ".firstElementChild.getClientRects().length"
    )
    assert browser.execute_script(badge) == 1  # "removed" on one line too

    browser.execute_script(f"location.hash = '#/runs/{inline}'")
    until(browser, lambda d: "succeeded" in text_of(d, "h2.run-title"), "the free run")
    until(browser, lambda d: css(d, "#spend-box .no-spend"), "the spend box")
    assert text_of(browser, "#spend-box .no-spend") == "$0.00 spent."
    assert "No spend recorded yet" not in text_of(browser, "#spend-box")


KILLED_PLAN = "/home/dev/plans/lint-staged-configuration-loader-migration.toml"


def _killed_ledger(db: Path) -> tuple[str, str, int]:
    """A watched run (one branch green, one red) and a run whose fleet was killed with three tasks running,
    two of which left work on salvage refs; the killed run's first attempt id."""
    clock = StepClock(1_796_116_500_000)
    with Ledger.open(db, now_ms=clock) as ledger:
        watched = add_run(ledger, "r-20261201-090000-cccc", argv=["stella", "fleet", "--watch", "x"])
        ledger.tasks.add(watched, [sample_task("w")], {"w": 1})
        for branch, state in (("fleet/a", "green"), ("fleet/b", "red")):
            row = {"head_sha": None, "pr_url": None, "pr_number": None, "conclusion": None, "reason": None}
            ledger.ci.upsert(run_id=watched, branch=branch, task_id="w", state=state, run_urls=[], **row)
        ledger.runs.finish(watched, "failed", exit_code=4)
        clock.ms += 60_000
        killed = add_run(ledger, "r-20261201-100000-dddd", plan_path=KILLED_PLAN,
                         argv=["stella", "fleet", "--plan", KILLED_PLAN])  # fmt: skip
        ids = ("loader", "resolver", "docs")
        ledger.tasks.add(killed, [sample_task(t, isolation="isolated") for t in ids], dict.fromkeys(ids, 1))
        attempts = [ledger.attempts.start(killed, t, pipeline="command") for t in ids]
        for task, attempt in zip(ids[:2], attempts, strict=False):
            ledger.attempts.set_salvage(
                attempt, f"refs/stella/salvage/{killed}/{task}/{attempt}", "5b0e61d2c9a4" * 3
            )
        clock.ms += 30_000
        gone = "the fleet process (pid 5100) ended without finishing its run: its attempts were abandoned"
        ledger.abandon_run(killed, gone)
    return watched, killed, attempts[0]


def test_a_killed_run_says_once_that_its_work_was_salvaged_and_links_each_attempt(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    watched, killed, first = _killed_ledger(StatePaths(git_repo).fleet_db)
    url = observatory(git_repo)
    browser.set_window_size(1280, 900)
    browser.get(url)
    until(browser, lambda d: len(css(d, "tr.run-row")) == 2, "two runs")
    assert " ".join(text_of(browser, f'tr.run-row[data-run-id="{watched}"] td.ci-cell').split()) == (
        "green 1 · red 1"
    )
    assert text_of(browser, f'tr.run-row[data-run-id="{killed}"] td.ci-cell') == "not watched"
    plan = f'tr.run-row[data-run-id="{killed}"] td.what-cell'
    assert text_of(browser, plan) == KILLED_PLAN.split("/")[-1]
    rows = browser.execute_script(  # the file name on one line: never broken in the middle
        f"const r = document.createRange(); r.selectNodeContents(document.querySelector('{plan}'));"
        "return new Set([...r.getClientRects()].map(c => Math.round(c.top))).size"
    )
    assert rows == 1

    browser.get(url + f"#/runs/{killed}?attempt={first}")  # a deep link opens that attempt
    until(browser, lambda d: "Attempt 1 of loader" in text_of(d, ".attempt-title"), "the linked attempt")
    items = css(browser, "#attention .attention-item")
    assert len(items) == 1, text_of(browser, "#attention")  # once, not once a task
    said = " ".join(text_of(browser, "#attention .attention-item").split())
    assert "3 tasks" in said and "ended without finishing its run" in said
    assert (
        f"the unfinished work of 2 of them was salvaged: `stella fleet --resume {killed} --from-salvage`"
        in said
    )
    card = text_of(browser, 'article.task[data-task-id="loader"] .salvage')  # on the card, no click needed
    assert f"salvaged: refs/stella/salvage/{killed}/loader/{first}" in card
    assert "restore: git cherry-pick --no-commit 5b0e61d2c9a4" in card

    docs = '#timeline-chart rect.bar[data-task="docs"]'
    docs_attempt = css(browser, docs)[0].get_attribute("data-attempt")
    click(browser, docs)
    until(browser, lambda d: "Attempt 1 of docs" in text_of(d, ".attempt-title"), "the clicked attempt")
    assert browser.execute_script("return location.hash") == f"#/runs/{killed}?attempt={docs_attempt}"
