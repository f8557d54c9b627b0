"""Fixtures of the run tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fleet import RUN

from stellafleet.core.paths import StatePaths
from stellafleet.state.ledger import Ledger
from stellafleet.testing.sample_ledger import add_run


@pytest.fixture
def ledger(git_repo: Path) -> Iterator[Ledger]:
    """git_repo's ledger, holding run RUN (a test adds its tasks)."""
    with Ledger.open(StatePaths(git_repo).fleet_db) as opened:
        add_run(opened, RUN, root=str(git_repo))
        yield opened
