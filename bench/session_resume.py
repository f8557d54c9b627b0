"""What a check round sends that is not in the provider's prompt cache, resumed against cold: the engine
(real worker processes) reads F files of K KiB each (default 3 of 16) and finishes; its check is red; the
round either goes on in its session (only the red check is new) or starts cold (`resume_max_tokens = 0`),
where the agent reads the same files again to rebuild what it knew. Figures: the round's uncached input
tokens per the scripted model server's cache accounting (the longest prefix of an earlier request is
cached, 4 characters a token), its first request's and the whole round's.

    python bench/session_resume.py [--files 3] [--kib 16]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from stellafleet.core.config import load_config
from stellafleet.core.paths import StatePaths
from stellafleet.core.status import FollowUpReason
from stellafleet.plan.model import PlanTask
from stellafleet.run.dispatch import Dispatcher
from stellafleet.run.executor import LocalExecutor
from stellafleet.run.serve import Server
from stellafleet.run.steps import AttemptState, AttemptStep, FollowUp, RunSettings
from stellafleet.run.steps.sessions import Sessions
from stellafleet.state.ledger import Ledger
from stellafleet.testing.model_server import CHARS_PER_TOKEN, ScriptedModelServer, prompt_text
from stellafleet.testing.sample_ledger import add_run

RED = "stella ran your check `make test` and it is red (exit 1): 2 tests failed in test_parser.py"
TASK = PlanTask("t1", "Fix the parser so that nested lists parse", "parser")


class OneRound(AttemptStep):
    """A red check's one round, as the Check step asks for it."""

    def __init__(self) -> None:
        self.rounds = 0

    def released(self, attempt: AttemptState) -> FollowUp | None:
        self.rounds += 1
        return FollowUp(FollowUpReason.CHECK, RED) if self.rounds == 1 else None


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": name, "arguments": arguments}],
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def repo(root: Path, files: int, kib: int) -> list[str]:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    names = []
    for n in range(files):
        name = f"src/mod{n}.py"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(
            "".join(f"def f{n}_{i}(x):\n    return x + {i}\n" for i in range(kib * 1024 // 30))
        )
        names.append(name)
    env = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", *env, "commit", "-q", "-m", "files"], cwd=root, check=True)
    return names


def round_uncached(root: Path, names: list[str], *, cold: bool) -> tuple[int, int, int]:
    """The round's uncached input tokens (its first request's, all of its requests') and all it sent."""
    reads = [call("read_file", path=name) for name in names]
    round_steps = [*reads, call("finish", summary="fixed")] if cold else [call("finish", summary="fixed")]
    with ScriptedModelServer([*reads, call("finish", summary="done"), *round_steps]) as server:
        config = StatePaths(root).config_file
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            '[engine]\nprovider = "anthropic"\nmodel = "scripted"\n'
            f'base_url = "{server.anthropic_base_url}"\n'
            f"[fleet]\nresume_max_tokens = {0 if cold else 150000}\n"
        )
        with Ledger.open(StatePaths(root).fleet_db) as ledger:
            head = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
            ).stdout
            add_run(ledger, "r-bench", base_commit=head.strip(), root=str(root), pipeline="plain")
            ledger.tasks.add("r-bench", [TASK], {TASK.id: 1})
            settings = RunSettings(root, "r-bench", head.strip(), "plain", config=load_config(root))
            steps = [Sessions(settings, ledger), OneRound()]
            Server(Dispatcher(settings, ledger, LocalExecutor(), lambda event: None, steps)).execute(TASK)
        first_round = len(names) + 1
        counts = [server.uncached_tokens(i) for i in range(first_round, len(server.requests))]
        sent = sum(len(prompt_text(r.body)) // CHARS_PER_TOKEN for r in server.requests[first_round:])
    return counts[0], sum(counts), sent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--kib", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for cold in (False, True):
            root = Path(tmp) / ("cold" if cold else "resumed")
            results[cold] = round_uncached(root, repo(root, args.files, args.kib), cold=cold)
    all_resumed, all_cold = results[False][1], results[True][1]
    print(f"check round after reading {args.files} files of {args.kib} KiB: uncached input tokens")
    for label, (first, whole, sent) in (("resumed", results[False]), ("cold", results[True])):
        print(
            f"  {label + ' session:':<17} first request {first:>7,}  whole round {whole:>7,}  (sent {sent:,})"
        )
    print(f"  ratio cold / resumed (whole round): {all_cold / max(all_resumed, 1):.1f}x")


if __name__ == "__main__":
    main()
