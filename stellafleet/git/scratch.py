"""`stella commit`'s scratch directories in the system temp folder, and their removal once their process
is gone: a kill leaves them behind, a copy of the repository's index each, so each is a journal record.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from stellafleet.state import journal

log = logging.getLogger(__name__)
_serial = itertools.count()


@contextlib.contextmanager
def directory(prefix: str) -> Iterator[str]:
    """A temporary directory named prefix..., in the journal of this process's `stella commit`."""
    owner = journal.current()
    tmp = tempfile.mkdtemp(prefix=prefix)
    name = None if owner is None else f"scratch-{owner.name}-{next(_serial)}"
    try:
        if owner is not None and name is not None:
            owner.write(name, "scratch", path=tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if owner is not None and name is not None:
            owner.drop(name)


def repair(root: Path, records: Sequence[journal.Record]) -> bool:
    """Remove the scratch directories of commits that are gone."""
    for record in records:
        path = record.data.get("path")
        if isinstance(path, str) and Path(path).is_absolute():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s (left by a stella commit that is gone)", path)
    return True
