"""How `stella watch` tells what happens: a line per branch change and a table at the end."""

from __future__ import annotations

from typing import ClassVar, TextIO

from stellafleet.ci.model import BranchWatch, WatchResult
from stellafleet.core.status import CIState
from stellafleet.core.terminal import aligned, styled


class ConsoleReporter:
    def __init__(self, stream: TextIO, *, table: bool = True) -> None:
        from rich.console import Console

        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.table = table

    _STYLE: ClassVar[dict[CIState, str]] = {
        CIState.GREEN: "green",
        CIState.RED: "bold red",
        CIState.ERROR: "bold red",
    }

    def note(self, message: str) -> None:
        self.console.print(styled(("watch:", "dim"), f" {message}"))

    def changed(self, watch: BranchWatch) -> None:
        pr = f" PR #{watch.pr_number}" if watch.pr_number is not None else ""
        if self.console.is_terminal:
            state = (watch.state, self._STYLE.get(watch.state, "cyan"))
            self.console.print(styled((watch.branch, "bold"), f"{pr} ", state, f" {watch.phase}"))
        else:
            self.console.print(styled(f"watch: {watch.branch}{pr}: {watch.state}: {watch.phase}"))

    def finished(self, result: WatchResult) -> None:
        if not self.table or not result.branches:
            return
        from rich.table import Table

        rows = [
            (b.branch, b.pr_url or "-", str(b.state), b.conclusion or "-", b.reason or "-")
            for b in result.branches
        ]
        headers = ("branch", "PR", "state", "conclusion", "reason")
        if not self.console.is_terminal:
            for line in aligned([headers, *rows]):
                self.console.print(styled(line))
            return
        table = Table(*headers, title=f"watch: run {result.run_id}")
        for row in rows:
            table.add_row(*map(styled, row))
        self.console.print(table)
