"""The dashboard writes dollars exactly as the terminal does: dom.js fmtUsd against core money().

Needs node to run the page's own function; without it the test skips, except under CI=true where it fails.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources

from helpers.needs import missing

from stellafleet.core.spend import money

AMOUNTS = [0, 1, 1.5, 12.345, 0.003, 0.0035, 0.015, 0.004, 0.12345, 0.000042, 0.00999, 2.25, 1234.5, -0.5]


def _fmt_usd_source() -> str:
    script = (resources.files("stellafleet.observatory") / "static" / "dom.js").read_text()
    found = re.search(r"^export function fmtUsd\(x\) \{\n.*?^\}\n", script, re.S | re.M)
    assert found, "dom.js has no fmtUsd function"
    return found.group(0).removeprefix("export ")


def test_the_dashboard_formats_money_like_the_terminal() -> None:
    node = shutil.which("node")
    if node is None:
        missing("node is needed to check the dashboard's fmtUsd and is not installed")
    shown = f"{json.dumps(AMOUNTS)}.map(fmtUsd).concat([fmtUsd(null), fmtUsd(Infinity)])"
    program = _fmt_usd_source() + f"console.log(JSON.stringify({shown}));"
    out = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(out.stdout) == [money(float(a)) for a in AMOUNTS] + ["$0.00", "$?"]
