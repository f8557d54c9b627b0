"""Issue 49 item 13, in real headless Chromium (as the other browser tests): the timeline's wave labels do
not overlap when waves are short, and a graph edge that skips a wave runs between the middle wave's boxes,
never behind one. The page's own modules (/static/timeline.js, /static/graph.js) draw hand-made pictures.

Same requirements as test_observatory_browser.py (chromium, chromedriver, selenium): skipped without them,
failed under CI=true."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.observatory import threaded
from test_observatory_browser import browser, until

from stellafleet.core.paths import StatePaths
from stellafleet.observatory.server import ObservatoryServer
from stellafleet.state.ledger import Ledger

pytestmark = pytest.mark.browser
__all__ = ["browser"]

DRAW = """
const [module, picture, done] = arguments;
import(module).then((m) => {
  const chart = module.endsWith("timeline.js")
    ? m.renderTimeline(picture, { width: 900, live: false, now_ms: 0, selected: null, onSelect() {} })
    : m.renderGraph(picture, { selected: null, onSelect() {} });
  document.body.replaceChildren(chart);
  done(true);
}, (error) => done(String(error)));
"""


@pytest.fixture
def page(git_repo: Path, browser: Any) -> Iterator[Any]:
    """A blank observatory page (this process serves it) that pictures are drawn on."""
    db = StatePaths(git_repo).fleet_db
    db.parent.mkdir(parents=True, exist_ok=True)
    Ledger.open(db).close()
    with threaded() as serve:
        browser.get(serve(ObservatoryServer(("127.0.0.1", 0), db)).url)
        until(browser, lambda d: d.execute_script("return document.readyState") == "complete", "the page")
        yield browser


def _draw(page: Any, module: str, picture: dict[str, Any]) -> None:
    assert page.execute_async_script(DRAW, f"/static/{module}", picture) is True


def test_short_waves_labels_do_not_overlap(page: Any) -> None:
    starts = [0, 30_000, 30_400, 31_000, 31_200, 31_300, 60_000]  # waves 20-26: five of them within 1.3 s
    waves = [{"wave": 20 + i, "start_ms": ms} for i, ms in enumerate(starts)]
    lane = {"label": "slot 1"}
    _draw(
        page, "timeline.js", {"lanes": [lane], "bars": [], "waves": waves, "start_ms": 0, "end_ms": 120_000}
    )
    boxes = page.execute_script(
        "return [...document.querySelectorAll('#timeline-chart text.wave-label')].map((t) => {"
        "const b = t.getBBox();"
        "return {wave: +t.dataset.wave, text: t.textContent, x: b.x, end: b.x + b.width}; })"
    )
    boxes.sort(key=lambda box: box["x"])
    assert all(a["end"] <= b["x"] for a, b in itertools.pairwise(boxes)), boxes
    assert {box["wave"] for box in boxes} >= {20, 25, 26}  # the long waves keep their labels
    assert boxes[0]["text"] == "wave 20"
    lines = page.execute_script("return document.querySelectorAll('#timeline-chart line.wave-line').length")
    titled = page.execute_script(
        "return document.querySelectorAll('#timeline-chart line.wave-line title').length"
    )
    assert lines == 7 and titled == 7 - len(boxes)  # a wave with no room for its label: its line says it


def _node(task_id: str, col: int, row: int) -> dict[str, Any]:
    return {"id": task_id, "col": col, "row": row, "wave": col + 1, "status": "succeeded", "attempt": None,
            "parent": None, "caused_by": None, "title": "", "expands": False}  # fmt: skip


def test_an_edge_that_skips_a_wave_runs_between_the_middle_waves_boxes(page: Any) -> None:
    nodes = [_node("a", 0, 0), *(_node(f"m{i}", 1, i) for i in range(3)), _node("c", 2, 2)]
    edges = [{"from": "a", "to": "c", "cause": False, "emitted": False}]
    edges += [{"from": "a", "to": f"m{i}", "cause": False, "emitted": False} for i in range(3)]
    _draw(page, "graph.js", {"rows": 3, "columns": 3, "nodes": nodes, "edges": edges})
    hits = page.execute_script(
        "const path = document.querySelector('#graph-chart .edge[data-to=\"c\"]');"
        "const boxes = [...document.querySelectorAll('#graph-chart g.node')]"
        "  .filter((g) => g.dataset.task.startsWith('m')).map((g) => g.querySelector('rect').getBBox());"
        "const hits = []; const length = path.getTotalLength();"
        "for (let s = 0; s <= length; s += 2) { const p = path.getPointAtLength(s);"
        "  for (const b of boxes) if (p.x > b.x && p.x < b.x + b.width && p.y > b.y && p.y < b.y + b.height)"
        "    hits.push([p.x, p.y]); }"
        "return hits;"
    )
    assert hits == []
