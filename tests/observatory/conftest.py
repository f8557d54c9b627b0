from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.observatory import Serve, serving


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Serve a ledger in this process on a free port; returns a fetch(path, headers=None) function."""
    yield from serving()
