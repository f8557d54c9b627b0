"""What a test needs from the machine (a tool, an IPv6 loopback, a Linux file): without it the test skips,
except under CI=true, where a missing need is a failure (a broken runner must not pass as a green run)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(reason: str) -> NoReturn:
    """The test cannot run here: fail under CI=true, skip otherwise, saying why."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"cannot run under CI: {reason}")
    pytest.skip(reason)
