from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.needs import missing
from helpers.observatory import Serve, serving

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Serve a ledger in this process on a free port; returns a fetch(path, headers=None) function."""
    yield from serving()


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or (name if os.path.isabs(name) and os.access(name, os.X_OK) else None)
        if found:
            return found
    return None


def _browser_or_reason() -> tuple[str, str] | str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    chromium = _find(("/usr/bin/chromium", "chromium", "chromium-browser"))
    driver = _find(("/usr/bin/chromedriver", "chromedriver"))
    if chromium is None or driver is None:
        return "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
    return chromium, driver


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium (through chromedriver) for the session's browser tests: starting one takes
    seconds of a 2-core machine. Tests take it as `browser` (test_observatory_browser.py), which gives it
    to each on a blank page with its console log emptied; each test's observatory has its own port, so
    no page's storage is another's."""
    found = _browser_or_reason()
    if isinstance(found, str):
        missing(found)
    chromium_path, driver_path = found
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
