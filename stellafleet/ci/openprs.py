"""The pull requests --watch opened that are still open once their branches landed locally or were
cleaned: GitHub keeps them, and their branches on the remote, until someone closes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stellafleet.core.status import MergeStatus


def open_pull_requests(run: dict[str, Any], branches: Sequence[str]) -> dict[str, int]:
    """branch -> the pull request --watch opened for it, for those of branches GitHub has not merged
    (`stella merge --via-gh`): landed locally or cleaned, they stay open, their branches on the remote."""
    through_gh = {
        row["branch"]
        for row in run["merges"]
        if str(row.get("strategy") or "").startswith("gh ") and row.get("status") == MergeStatus.MERGED
    }
    prs = {row["branch"]: row["pr_number"] for row in run["ci"] if row.get("pr_number") is not None}
    return {b: int(prs[b]) for b in sorted(set(branches)) if b in prs and b not in through_gh}


def open_pull_requests_note(prs: dict[str, int], onto: str) -> str:
    named = ", ".join(f"PR #{number} ({branch})" for branch, number in prs.items())
    return (
        f"still open on GitHub, their branches on the remote: {named}; push {onto} and close them "
        "(`gh pr close N --delete-branch`), or land them through GitHub with `stella merge --via-gh`"
    )
