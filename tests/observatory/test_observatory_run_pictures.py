"""The run page's pictures in real headless Chromium: timeline, plan graph, spend, live log, attention.

Same requirements as test_observatory_browser.py (chromium, chromedriver, selenium): skipped without them,
failed under CI=true. Set OBSERVATORY_SCREENSHOT_DIR=docs/img to regenerate the documentation's pictures.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import Scripts, wait_for, write_config
from helpers.observatory import threaded
from test_observatory_browser import XSS, assert_inert, browser, css, observatory, text_of, until
from test_observatory_browser import click as click_real
from test_observatory_first_view import MARK, big_run
from test_observatory_first_view import RUN_ID as BIG_RUN_ID
from test_observatory_first_view import TASKS as BIG_TASKS

from stellafleet.core.paths import StatePaths
from stellafleet.observatory.server import ObservatoryServer
from stellafleet.proc.pids import pid_alive
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_fleet import RUN_ID, build_sample_fleet

pytestmark = pytest.mark.browser
__all__ = ["browser", "observatory"]  # the fixtures, shared with the other browser tests

PLAN = """
[[tasks]]
id = "xss"
title = "Summarise with markup"
prompt = "Report a summary with markup"

[[tasks]]
id = "broken"
prompt = "This one fails"

[[tasks]]
id = "tail"
title = "Writes its log slowly"
prompt = "Print, wait, print"

[[tasks]]
id = "after"
prompt = "Runs after broken"
depends_on = ["broken"]

[[tasks]]
id = "next"
prompt = "Runs after xss"
depends_on = ["xss"]
"""


def bars(driver: Any) -> list[dict[str, Any]]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#timeline-chart rect.bar')].map(r => ({"
            "attempt: +r.dataset.attempt, task: r.dataset.task, lane: +r.dataset.lane,"
            "outcome: r.dataset.outcome, x: +r.getAttribute('x'), w: +r.getAttribute('width')}))"
        )
    )


def attempts_started(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
    except sqlite3.Error:
        return 0  # the ledger is being created


def start_fleet(repo: Path, tmp_path: Path, spawned: list[Any]) -> tuple[subprocess.Popen[str], Path]:
    scripts = Scripts(tmp_path / "scripts")
    gates = tmp_path / "gates"
    gates.mkdir()
    write_config(
        repo,
        run="echo default",
        tasks={
            # the first wave's three attempts all wait for gate one: they overlap, so three lanes
            "xss": scripts.python(
                "xss", f"wait_file({str(gates / 'one')!r})\nreport(summary={XSS!r}, spend_usd=0.25, steps=2)"
            ),
            "broken": scripts.python(
                "broken", f"print('it broke')\nwait_file({str(gates / 'one')!r})\nsys.exit(3)"
            ),
            "tail": scripts.python(
                "tail",
                "print('first line', flush=True)\n"
                f"wait_file({str(gates / 'one')!r})\n"
                "print('second line', flush=True)\n"
                f"wait_file({str(gates / 'two')!r})\n"
                "report(summary='tail done', spend_usd=0.5, steps=1)",
            ),
            "next": scripts.python("next", "report(summary='next done', spend_usd=0.125, steps=1)"),
        },
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    argv = [sys.executable, "-m", "stellafleet", "fleet", "--plan", str(plan), "--pipeline", "command"]
    fleet = subprocess.Popen(
        [*argv, "--max-concurrency", "3"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    spawned.append(fleet)
    return fleet, gates


def test_real_fleet_timeline_graph_spend_and_live_log(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any, tmp_path: Path, spawned: list[Any]
) -> None:
    fleet, gates = start_fleet(git_repo, tmp_path, spawned)
    db = StatePaths(git_repo).fleet_db
    wait_for(db)
    url = observatory(git_repo)
    deadline = time.monotonic() + 60
    while not attempts_started(db) >= 3:  # open the page on the run, not on a ledger still empty
        assert time.monotonic() < deadline, "the fleet started no attempts"
        time.sleep(0.05)
    browser.get(url + "#/runs/latest")
    until(browser, lambda d: len(bars(d)) == 3, "the first wave's three bars", timeout=60)
    browser.execute_script("window.__marker = 'same page'")
    tail = next(bar for bar in bars(browser) if bar["task"] == "tail")
    click_real(browser, f'#timeline-chart rect.bar[data-attempt="{tail["attempt"]}"]')
    until(browser, lambda d: "first line" in text_of(d, "#log-text"), "the running worker's log")
    assert "second line" not in text_of(browser, "#log-text")
    (gates / "one").write_text("go")
    until(browser, lambda d: "second line" in text_of(d, "#log-text"), "a new log line without a reload")
    assert "following" in text_of(browser, ".log-view[data-kind='log'] .log-status")
    (gates / "two").write_text("go")
    until(browser, lambda d: "failed" in text_of(d, "h2.run-title"), "the run's end", timeout=60)
    assert fleet.wait(timeout=60) == 1

    with sqlite3.connect(db) as conn:
        attempts = conn.execute("SELECT id, task_id FROM attempts ORDER BY id").fetchall()
        total = conn.execute("SELECT spend_usd FROM runs").fetchone()[0]
    until(browser, lambda d: len(bars(d)) == len(attempts) == 4, "one bar per attempt")
    shown = bars(browser)
    assert sorted(b["attempt"] for b in shown) == [a[0] for a in attempts]
    assert len({b["lane"] for b in shown}) == 3  # wave 1 ran three at once; `next` reused a free slot
    assert [b["x"] for b in shown] == sorted(b["x"] for b in shown)  # drawn in start order
    assert next(b for b in shown if b["task"] == "next")["lane"] == 0
    for lane in {b["lane"] for b in shown}:  # bars sharing a lane never overlap
        in_lane = sorted((b for b in shown if b["lane"] == lane), key=lambda b: b["x"])
        assert all(a["x"] + a["w"] <= b["x"] + 0.5 for a, b in itertools.pairwise(in_lane))
    assert len(attr(browser, "#timeline-chart .wave-line", "data-wave")) == 2
    assert {b["task"]: b["outcome"] for b in shown}["broken"] == "failed"

    assert len(css(browser, "#graph-chart g.node")) == 5
    froms, tos = (
        attr(browser, "#graph-chart .edge", "data-from"),
        attr(browser, "#graph-chart .edge", "data-to"),
    )
    edges = list(zip(froms, tos, strict=True))
    assert sorted(edges) == [("broken", "after"), ("xss", "next")]  # one edge per dependency
    assert attr(browser, '#graph-chart g.node[data-task="after"]', "data-caused-by") == ["broken"]
    assert "cause" in str(attr(browser, '#graph-chart .edge[data-to="after"]', "class")[0])

    end_usd = attr(browser, "#spend-chart polyline.spend-line", "data-end-usd")
    assert len(end_usd) == 1 and float(str(end_usd[0])) == pytest.approx(total) == pytest.approx(0.875)
    assert "$0.875" in text_of(browser, "#spend-chart .spend-total")
    assert "broken" in attr(browser, "#attention .attention-item", "data-task")

    xss = next(b for b in shown if b["task"] == "xss")
    click_real(browser, f'#timeline-chart rect.bar[data-attempt="{xss["attempt"]}"]')
    until(browser, lambda d: text_of(d, "#attempt-summary") == XSS, "the markup summary, as text")
    assert browser.execute_script("return window.__marker") == "same page"
    assert_inert(browser)
    browser.save_screenshot(str(tmp_path / "real-fleet-pictures.png"))


def attr(driver: Any, selector: str, name: str) -> list[str | None]:
    """An attribute of every match, read in one script (a live page redraws between WebDriver calls)."""
    script = "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute(arguments[1]))"
    return list(driver.execute_script(script, selector, name))


def click(driver: Any, selector: str) -> None:
    driver.execute_script(
        "document.querySelector(arguments[0]).dispatchEvent(new MouseEvent('click', {bubbles: true}))",
        selector,
    )


def _shoot(driver: Any, selector: str, name: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException

    out = os.environ.get("OBSERVATORY_SCREENSHOT_DIR")
    if not out:
        return
    for _ in range(5):  # the live page may redraw the element between finding and shooting it
        try:
            driver.execute_script("document.querySelector(arguments[0]).scrollIntoView()", selector)
            driver.find_element("css selector", selector).screenshot(str(Path(out) / name))
            return
        except StaleElementReferenceException:
            continue


@pytest.fixture
def sample_fleet(git_repo: Path) -> Iterator[str]:
    """The sample fleet's live run served in this process (its URL), its fleet alive while pid 1 runs,
    whenever pid 1 started. The run began 12 minutes ago: on a machine up for less than about 7, no process
    can have started it by stella's rule for a reused pid (pid_alive: none started more than
    LEDGER_SPAWN_GRACE_S after its run), so pid 1 counted as gone and the run's quiet attempt unshown."""
    db = StatePaths(git_repo).fleet_db
    build_sample_fleet(db, live_pid=1)
    server = ObservatoryServer(("127.0.0.1", 0), db)
    server.alive = lambda pid, _started_at_ms: pid_alive(pid, None)
    with threaded() as serve:
        yield serve(server).url


def test_sample_fleet_pictures_and_attention(sample_fleet: str, browser: Any) -> None:
    """A mid-sized live run (tests/doc pictures): the quiet attempt, the failure, the red CI branch."""
    url = sample_fleet
    browser.set_window_size(1400, 1000)
    browser.get(url + "#/runs/" + RUN_ID)
    until(browser, lambda d: len(bars(d)) == 15, "the sample run's bars")
    assert attr(browser, "#attention .attention-item", "data-kind") == ["quiet", "failed", "red_ci"]
    assert "nothing new for" in text_of(browser, '#attention .attention-item[data-kind="quiet"]')
    assert len({b["lane"] for b in bars(browser)}) == 4
    assert len(attr(browser, "#graph-chart g.node", "data-task")) == 18
    causes = sorted(attr(browser, "#graph-chart .edge.cause", "data-to"))
    assert causes == ["ast", "codegen", "docs", "errors"]
    click(browser, '#graph-chart g.node[data-task="codegen"]')  # a skip opens the failure behind it
    until(browser, lambda d: "tests failed" in text_of(d, "#attempt-error"), "the failure behind the skip")
    click(browser, '#attention .attention-item[data-kind="quiet"]')
    until(browser, lambda d: "[e2e] attempt" in text_of(d, "#log-text"), "the quiet attempt's log")
    _shoot(browser, "#attention", "observatory-attention.png")
    _shoot(browser, "#timeline-box", "observatory-timeline.png")
    _shoot(browser, "#attempt-panel", "observatory-log.png")
    _shoot(browser, "#graph-box", "observatory-graph.png")
    _shoot(browser, "#spend-box", "observatory-spend.png")
    browser.execute_script("location.hash = '#/'")
    until(browser, lambda d: css(d, "tr.run-row svg.spark polyline"), "the spend sparkline")
    _shoot(browser, "#runs-card", "observatory-runs-sparkline.png")
    assert_inert(browser)


def test_a_big_run_draws_its_first_view_and_brings_details_when_opened(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    """A run too big to list its task cards at once: bars and graph from the lean first view; the task
    list and an attempt's summary and commits only when they are opened."""
    db = StatePaths(git_repo).fleet_db
    roles = big_run(db)
    with sqlite3.connect(db) as conn:
        attempts = conn.execute("SELECT count(*) FROM attempts").fetchone()[0]
    url = observatory(git_repo)
    browser.get(url + "#/runs/" + BIG_RUN_ID)
    until(browser, lambda d: len(bars(d)) == attempts, "one bar per attempt")
    assert len(css(browser, "#graph-chart g.node")) == BIG_TASKS
    assert not css(browser, "article.task")  # folded: no task card is built before it is opened
    click_real(browser, "details.waves > summary")
    until(browser, lambda d: len(css(d, "article.task")) == BIG_TASKS, "the task cards, once opened")
    assert MARK in text_of(browser, 'article.task[data-task-id="t3"] .summary')
    click_real(browser, f'#timeline-chart rect.bar[data-attempt="{roles["committed"]}"]')
    until(browser, lambda d: text_of(d, "#attempt-summary") == MARK, "the opened attempt's summary")
    assert "Make t3 pass" in text_of(browser, "#attempt-panel .commits")
    assert "red" in text_of(browser, "#attempt-panel .attempt-ci")
    assert_inert(browser)


def test_a_live_big_runs_open_task_list_follows_the_fleet(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    """The folded task list of a live big run, once opened, is refreshed on the page's polls."""
    db = StatePaths(git_repo).fleet_db
    big_run(db, live=True)
    url = observatory(git_repo)
    browser.get(url + "#/runs/" + BIG_RUN_ID)
    until(browser, lambda d: css(d, "details.waves > summary"), "the folded task list")
    assert browser.find_element("id", "live-indicator").is_displayed()
    click_real(browser, "details.waves > summary")
    until(browser, lambda d: len(css(d, "article.task")) == BIG_TASKS, "the task cards, once opened")
    with Ledger.open(db) as ledger:
        ledger.attempts.start(BIG_RUN_ID, "t6", pipeline="plain")
    status = 'article.task[data-task-id="t6"] .task-head .badge'
    until(browser, lambda d: text_of(d, status) == "running", "the new attempt in the open list")
    assert len(css(browser, "article.task")) == BIG_TASKS
    assert_inert(browser)
