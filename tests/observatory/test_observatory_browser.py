"""The observatory in real headless Chromium: runs listed, a run opened, model text inert, live updates.

Needs chromium and chromedriver (Debian: `apt-get install chromium chromium-driver`) and the `selenium`
package (the `dev` extra). Without them the tests skip, except under CI=true where they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers.fleet import Scripts, wait_for, write_config

from stellafleet.core.paths import StatePaths
from stellafleet.core.status import AttemptEnd
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run, build_sample_ledger, sample_task

pytestmark = pytest.mark.browser

XSS = '<script>window.__pwned=1</script> <img src=x onerror="window.__pwned=2">'


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The session's headless Chromium (tests/observatory/conftest.py) on a blank page, its console log
    read empty, so what an earlier test's page logged is not this test's."""
    blank(chromium)
    yield chromium
    blank(chromium)  # off this test's page before its observatory stops (its polls would log errors)


def blank(driver: Any) -> None:
    driver.get("about:blank")
    driver.get_log("browser")  # reading the log empties it


@pytest.fixture
def observatory(spawned: list[subprocess.Popen[str]]) -> Callable[[Path], str]:
    """Start `stella observatory --port 0` in a repository; returns its URL."""

    def start(repo: Path) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stellafleet", "observatory", "--port", "0"],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        spawned.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("stella observatory: http://127.0.0.1:"), (
            line,
            proc.stderr and proc.stderr.read(),
        )
        return line.split()[2]

    return start


@contextmanager
def quick_idle_poll(driver: Any) -> Iterator[None]:
    """Pages loaded meanwhile wait a twentieth of any timeout of 10 s or more: the list's idle poll (10 s,
    app.js) comes in half a second. The browser's clock moved on, as a FakeClock moves the server's; the
    poll itself (its timer, request and redraw) is still the page's own."""
    script = (
        "const realSetTimeout = window.setTimeout;"
        "window.setTimeout = (fn, ms, ...args) => realSetTimeout(fn, ms >= 10000 ? ms / 20 : ms, ...args);"
    )
    added = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})
    try:
        yield
    finally:  # the browser is the session's: the next test's pages keep their own timers
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", added)


def until(driver: Any, check: Callable[[Any], Any], what: str, timeout: float = 20.0) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d: Any) -> Any:
        try:
            return check(d)
        except StaleElementReferenceException:
            return False  # the page re-rendered under us: look again

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(safe, message=f"waited for {what}")


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def _fresh(action: Callable[[], Any]) -> Any:
    """action(), again if a live page redrew the element between finding and using it."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(9):
        try:
            return action()
        except StaleElementReferenceException:
            continue
    return action()


def text_of(driver: Any, selector: str) -> str:
    return str(_fresh(lambda: "\n".join(e.text for e in css(driver, selector))))


def click(driver: Any, selector: str) -> None:
    """Click the first match (found afresh if the page redraws it meanwhile)."""
    _fresh(lambda: css(driver, selector)[0].click())


def task_status(driver: Any, task_id: str) -> str:
    return text_of(driver, f'article.task[data-task-id="{task_id}"] .task-head .badge')


def assert_inert(driver: Any) -> None:
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    assert driver.execute_script("return document.scripts.length") == 1  # only /static/app.js
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []


def test_hand_built_ledger_lists_opens_escapes_and_updates_live(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any, tmp_path: Path, spawned: list[Any]
) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], text=True)
    spawned.append(worker)
    db = StatePaths(git_repo).fleet_db
    ids = build_sample_ledger(db, live_pid=worker.pid)
    url = observatory(git_repo)

    browser.get(url)
    until(browser, lambda d: len(css(d, "tr.run-row")) == 3, "three runs")
    rows = [row.get_attribute("data-run-id") for row in css(browser, "tr.run-row")]
    assert rows == [ids["running"], ids["failed"], ids["ok"]]
    running_row = text_of(browser, f'tr.run-row[data-run-id="{ids["running"]}"]')
    assert "running" in running_row and "live" in running_row and "$0.05 / $5.00" in running_row
    ok_row = text_of(browser, f'tr.run-row[data-run-id="{ids["ok"]}"]')
    assert "succeeded" in ok_row and "3 ok" in ok_row and "$2.40 / $6.00" in ok_row and "main @" in ok_row
    assert "1 skipped" in text_of(browser, f'tr.run-row[data-run-id="{ids["failed"]}"]')
    docs_copy = os.environ.get("OBSERVATORY_SCREENSHOT_DIR")  # a directory: regenerates docs/img/*.png
    if docs_copy:
        browser.find_element("id", "runs-card").screenshot(str(Path(docs_copy) / "observatory.png"))
    browser.execute_script("window.__marker = 'same page'")

    # a new run appears while the page is open (a fleet is live, so the list polls)
    with Ledger.open(db) as ledger:
        add_run(
            ledger,
            "r-20261130-235959-ffff",
            argv=["stella", "fleet", "x"],
            root=str(git_repo),
            pid=worker.pid,
        )
        ledger.runs.finish("r-20261130-235959-ffff", "succeeded", exit_code=0)
    until(browser, lambda d: len(css(d, "tr.run-row")) == 4, "the new run without a reload")

    click(browser, f'tr.run-row[data-run-id="{ids["running"]}"] a.run-link')
    until(browser, lambda d: task_status(d, "bump") == "running", "the running task")
    assert task_status(browser, "notes") == "pending"
    assert "Bump the version and changelog" in text_of(browser, 'article.task[data-task-id="bump"]')

    # the fleet moves on while the page is open: the page follows without a reload
    with Ledger.open(db) as ledger:
        attempt = ledger.get_run(ids["running"])["attempts"][0]["id"]
        ledger.spend.add(attempt, 0.40, input_tokens=20_000, output_tokens=1_000, steps=4)
        ledger.attempts.finish(attempt, AttemptEnd(outcome="succeeded", exit_code=0, summary=XSS))
        ledger.tasks.set_status(ids["running"], "bump", "succeeded")
        ledger.tasks.set_status(ids["running"], "notes", "running")
        (tmp_path / "notes.log").write_text("[stella] setup: npm ci\nadded 120 packages\n")
        second = ledger.attempts.start(
            ids["running"], "notes", pipeline="command", log_path=str(tmp_path / "notes.log")
        )
        ledger.attempts.set_setup_started(second)  # its worktree's setup runs: the card says so
        ledger.attempts.set_pid(second, worker.pid)
    until(browser, lambda d: task_status(d, "bump") == "succeeded", "the finished attempt")
    # the task runs (its status) before its attempt is recorded and in setup: a poll may fall between
    phase = 'article.task[data-task-id="notes"] .phase'
    until(browser, lambda d: text_of(d, phase).endswith(" · added 120 packages"), "the attempt in setup")
    assert text_of(browser, phase).startswith("in setup · ")
    summary = text_of(browser, 'article.task[data-task-id="bump"] .summary')
    assert summary == XSS  # shown as text, literally
    assert "$0.45 / $5.00" in text_of(browser, "dl.kv")
    assert_inert(browser)

    with Ledger.open(db) as ledger:
        ledger.attempts.finish(
            second, AttemptEnd(outcome="failed", exit_code=1, summary="no notes", error="boom <b>")
        )
        ledger.tasks.set_status(ids["running"], "notes", "failed", "command failed")
        ledger.runs.finish(ids["running"], "failed", exit_code=1, reason="1 failed")
    until(browser, lambda d: "failed" in text_of(d, "h2.run-title"), "the run's end")
    assert "boom <b>" in text_of(browser, 'article.task[data-task-id="notes"] pre.error')
    until(browser, lambda d: not d.find_element("id", "live-indicator").is_displayed(), "live indicator off")
    assert browser.execute_script("return window.__marker") == "same page"

    # a finished run with an isolated branch, commits and CI; docs was stacked on reader, then went stale
    with Ledger.open(db) as ledger:
        docs = next(a for a in ledger.get_run(ids["ok"])["attempts"] if a["task_id"] == "docs")
        ledger.attempts.set_start(docs["id"], "5f3b8f2" + "0" * 33, [("reader", "a1b2c3d" + "0" * 33)])
        ledger.tasks.set_stale(ids["ok"], "docs", "reader changed after it started")
    browser.execute_script(f"location.hash = '#/runs/{ids['ok']}'")
    until(browser, lambda d: len(css(d, "section.wave")) == 3, "three waves")
    assert "fleet/docs-5c1d7e9a0b2f4a6c" in text_of(browser, "#branches-table")
    pr = css(browser, "#branches-table a")[0]
    assert pr.text == "PR #412" and pr.get_attribute("href") == "https://github.com/example/shop/pull/412"
    assert len(css(browser, "#commits-table tbody tr")) == 3
    assert "Rewrote docs/receipts.md twice" in text_of(browser, 'article.task[data-task-id="docs"] .summary')
    start = text_of(browser, 'article.task[data-task-id="docs"] .start')
    assert start.startswith("start 5f3b8f2") and "parents: reader a1b2c3d" in start
    assert text_of(browser, 'article.task[data-task-id="docs"] .tag.stale') == "stale"
    browser.save_screenshot(str(tmp_path / "observatory-run.png"))
    if docs_copy:
        browser.find_element("id", "run-view").screenshot(str(Path(docs_copy) / "observatory-run.png"))

    browser.execute_script("location.hash = '#/'")
    until(browser, lambda d: len(css(d, "tr.run-row")) == 4, "back to the list")
    assert_inert(browser)
    assert browser.execute_script("return window.__marker") == "same page"
    browser.save_screenshot(str(tmp_path / "observatory.png"))
    assert (tmp_path / "observatory.png").stat().st_size > 10_000


def test_empty_state_explains_how_to_start(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    url = observatory(git_repo)
    with quick_idle_poll(browser):
        browser.get(url)
        until(browser, lambda d: css(d, "#empty-state"), "the empty state")
        text = text_of(browser, "#empty-state")
        assert "No fleet runs recorded yet" in text and 'stella fleet "' in text
        # the first fleet shows up without a reload, at the list's next idle poll
        with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
            add_run(
                ledger,
                "r-20261130-000000-abcd",
                pipeline="plain",
                argv=["stella", "fleet", "x"],
                root=str(git_repo),
            )
            ledger.tasks.add("r-20261130-000000-abcd", [sample_task("t1", "x")], {"t1": 1})
        until(browser, lambda d: len(css(d, "tr.run-row")) == 1, "the first run", timeout=30)


def test_real_fleet_run_shows_and_updates_live(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any, tmp_path: Path, spawned: list[Any]
) -> None:
    """`stella fleet` with the command pipeline writes the ledger; the page follows it to the end."""
    scripts = Scripts(tmp_path / "scripts")
    gate = tmp_path / "gate"
    write_config(
        git_repo,
        run="echo default",
        tasks={
            "xss": scripts.python(
                "xss", f"report(summary={XSS!r}, spend_usd=0.25, input_tokens=900, steps=2)"
            ),
            "docs": scripts.python(
                "docs",
                "(WS / 'docs.md').write_text('# docs\\n')\n"
                "subprocess.run(['git', 'add', 'docs.md'], check=True)\n"
                "subprocess.run(['git', 'commit', '-qm', 'Rewrite the docs page'], check=True)\n"
                "print('docs rewritten')",
            ),
            "broken": "echo 'it broke' && exit 3",
            "slow": scripts.python("slow", f"wait_file({str(gate)!r})\nprint('slow done')"),
        },
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[[tasks]]\nid = "xss"\ntitle = "Summarise with markup"\nprompt = "Report a summary with markup"\n\n'
        '[[tasks]]\nid = "docs"\ntitle = "Rewrite the docs page"\nprompt = "Rewrite docs"\n'
        'isolation = "isolated"\n\n'
        '[[tasks]]\nid = "broken"\nprompt = "This one fails"\n\n'
        '[[tasks]]\nid = "after"\nprompt = "Runs after broken"\ndepends_on = ["broken"]\n\n'
        '[[tasks]]\nid = "slow"\nprompt = "Waits for the go-ahead"\n'
    )
    fleet = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stellafleet",
            "fleet",
            "--plan",
            str(plan),
            "--pipeline",
            "command",
            "--max-concurrency",
            "4",
        ],
        cwd=git_repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    spawned.append(fleet)
    db = StatePaths(git_repo).fleet_db
    wait_for(db)
    url = observatory(git_repo)
    browser.get(url)
    until(browser, lambda d: len(css(d, "tr.run-row")) == 1, "the fleet's run")
    run_id = css(browser, "tr.run-row")[0].get_attribute("data-run-id")
    assert "running" in text_of(browser, "tr.run-row") and "live" in text_of(browser, "tr.run-row")
    browser.execute_script("window.__marker = 'same page'")
    click(browser, "a.run-link")
    until(browser, lambda d: task_status(d, "xss") == "succeeded", "the markup task's end")
    until(browser, lambda d: task_status(d, "broken") == "failed", "the failing task")
    until(browser, lambda d: task_status(d, "docs") == "succeeded", "the isolated task")
    until(browser, lambda d: task_status(d, "slow") == "running", "the slow task, started beside them")
    assert text_of(browser, 'article.task[data-task-id="xss"] .summary') == XSS
    assert "it broke" in text_of(browser, 'article.task[data-task-id="broken"] .summary')
    assert "command failed: exit status 3" in text_of(
        browser, 'article.task[data-task-id="broken"] pre.error'
    )
    assert_inert(browser)

    gate.write_text("go")
    until(browser, lambda d: task_status(d, "slow") == "succeeded", "the slow task's end", timeout=60)
    until(browser, lambda d: task_status(d, "after") == "skipped", "the dependent's skip")
    assert "dependency failed: broken" in text_of(browser, 'article.task[data-task-id="after"] .reason')
    until(browser, lambda d: "failed" in text_of(d, "h2.run-title"), "the run's end status")
    assert fleet.wait(timeout=60) == 1
    branches = text_of(browser, "#branches-table")
    assert "fleet/docs-" in branches and ".stella/worktrees/docs-" in branches
    assert "Rewrite the docs page" in text_of(browser, "#commits-table")
    assert "$0.25" in text_of(browser, "dl.kv")
    assert browser.execute_script("return window.__marker") == "same page"
    assert_inert(browser)
    browser.save_screenshot(str(tmp_path / "observatory-real-fleet.png"))

    browser.execute_script("location.hash = '#/'")
    until(browser, lambda d: "failed" in text_of(d, f'tr.run-row[data-run-id="{run_id}"]'), "the list")
    row = text_of(browser, f'tr.run-row[data-run-id="{run_id}"]')
    assert "3 ok" in row and "1 failed" in row and "1 skipped" in row and "command" in row


def test_a_page_past_the_last_one_shows_the_last_page(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    """A stale or hand-typed `#/?page=N` beyond the runs lands on the last page, not an empty table."""
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        for n in range(30):
            run_id = f"r-20261130-0000{n:02d}-abcd"
            add_run(ledger, run_id, argv=["stella", "fleet", "x"], root=str(git_repo))
            ledger.runs.finish(run_id, "succeeded", exit_code=0)
    url = observatory(git_repo)
    for page in ("9", "99999999999999999999999"):
        # the previous page's table shows the same rows: marked, it is told apart from the one drawn now
        browser.execute_script("document.getElementById('runs-table')?.classList.add('drawn-before')")
        browser.get(url + "#/?page=" + page)
        until(
            browser,
            lambda d: (
                len(css(d, "#runs-table:not(.drawn-before) tr.run-row")) == 5
                and d.execute_script("return location.hash") == "#/?page=2"
            ),
            f"the last page drawn for page={page}",
        )
        assert "26–30 of 30 runs (page 2 of 2)" in text_of(browser, "#pager")
        assert not browser.find_element("id", "banner").is_displayed()


def test_a_malformed_run_link_says_no_such_run(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    """A hand-edited `#/runs/...` with a broken %-escape is an unknown run, not a page stuck on Loading."""
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, "r-20261130-000000-abcd", argv=["stella", "fleet", "x"], root=str(git_repo))
    url = observatory(git_repo)
    browser.get(url + "#/runs/%E0%A4%A")
    until(browser, lambda d: "no run matches" in text_of(d, "#run-body"), "the unknown-run message")
    assert "%E0%A4%A" in text_of(browser, "#run-body")
    browser.execute_script("location.hash = '#/'")
    until(browser, lambda d: len(css(d, "tr.run-row")) == 1, "the list again")


def test_long_unbroken_ids_and_titles_wrap_inside_the_page(
    git_repo: Path, observatory: Callable[[Path], str], browser: Any
) -> None:
    """A 128-character task id and an unbroken title wrap instead of widening the page."""
    run_id = "r-20261130-000000-abcd"
    long_id = "x" * 120 + ".long_id"
    with Ledger.open(StatePaths(git_repo).fleet_db) as ledger:
        add_run(ledger, run_id, argv=["stella", "fleet", "x"], root=str(git_repo))
        ledger.tasks.add(run_id, [sample_task(long_id, "x", "y" * 200)], {long_id: 1})
        ledger.runs.finish(run_id, "succeeded", exit_code=0)
    url = observatory(git_repo)
    browser.get(url + "#/runs/" + run_id)
    until(browser, lambda d: css(d, "article.task"), "the task card")
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0
