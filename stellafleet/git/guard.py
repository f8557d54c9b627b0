"""The git guard of shared-tree workers: `git` first on their PATH, a small shell script that runs the real
git for everything but what would change files or the index outside the task's claims, or move HEAD.
Those it hands to `python -m stellafleet.git.guard`, which refuses them in one line (docs/claims.md)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from stellafleet.core.errors import StellaError
from stellafleet.core.workercontext import WorkerContext
from stellafleet.git import gitops, hookstash
from stellafleet.proc import runner

# Every form of these is refused; checkout, restore and reset are refused by what they name.
_REFUSED = "stash|clean|switch|rebase|merge|pull|cherry-pick|revert|commit|add|rm|mv"
_BY_PATH = ("checkout", "restore", "reset")
SHARED = f"{_REFUSED}|{'|'.join(_BY_PATH)}"
ISOLATED = "commit"  # an isolated worker's own commit: its hooks under the hook lock (serialize_hooks)
# git's global options that take the next argument as their value
_VALUED = ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--config-env")

_MARK = "# stella's git guard"  # in the script's head: how the guard tells itself from the real git
_SCRIPT = """#!/bin/sh
{mark} for a shared-tree worker: see docs/claims.md ("The git guard").
skip=
for arg in "$@"; do
  if [ -n "$skip" ]; then skip=; continue; fi
  case $arg in
    {valued}) skip=1 ;;
    -*) ;;
    {diverted}) exec {python} -P -m stellafleet.git.guard "$@" ;;
    *) break ;;
  esac
done
exec {git} "$@"
"""

COMMIT = "stella commit -m MSG PATH..."
MOVES_HEAD = f"it moves HEAD under every worker): commit your files with {COMMIT}"
_WHY = {
    "stash": f"other workers' edits live here): use {COMMIT}",
    "commit": f"it commits the shared index, with other workers' files): use {COMMIT}",
    "add": f"it stages into the user's own index): {COMMIT} stages exactly what it commits",
    "rm": f"it stages into the user's own index): use a plain rm, then {COMMIT}",
    "mv": f"it stages into the user's own index): use a plain mv, then {COMMIT}",
    "clean": f"it deletes other workers' new files): remove your own files with rm, then {COMMIT}",
    "reset": f"it resets other workers' edits too): restore only your own files by path, then {COMMIT}",
}


def install(folder: Path, diverted: str = SHARED) -> Path:
    """The guard script written as folder/git, for this python and the real git, handing the diverted
    subcommands (`a|b`) to this module; returns folder."""
    text = _SCRIPT.format(
        mark=_MARK,
        valued="|".join(_VALUED),
        diverted=diverted,
        python=shlex.quote(sys.executable),
        git=shlex.quote(gitops.git_program()),
    )
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".git.{os.getpid()}.tmp"
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(
        tmp, folder / gitops.PROGRAM
    )  # a worker starting now sees the old script or the new one, whole
    return folder


def guarded_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """env with the guard's folder first on PATH, and named so stella's own git skips it."""
    path = os.pathsep.join(part for part in (str(folder), env.get("PATH", os.defpath)) if part)
    return {**env, "PATH": path, gitops.GUARD_VAR: str(folder)}


def _real_git() -> str:
    """The git to hand over to: the first on PATH that is not a guard (exec'ing itself, it would loop)."""
    found = gitops.git_program()
    with contextlib.suppress(OSError), open(found, "rb") as program:
        if _MARK.encode() in program.read(256):
            sys.exit(
                f"stella: the git guard found only itself as git ({found}): its folder is on PATH but "
                f"{gitops.GUARD_VAR}, which names it, was dropped from the environment; keep both or neither"
            )
    return found


def split(argv: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """git's global options, the subcommand and its arguments."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _VALUED else 1
    if i >= len(argv):
        return list(argv), "", []
    return list(argv[:i]), argv[i], list(argv[i + 1 :])


def _directory(options: Sequence[str], cwd: Path) -> Path:
    """Where git runs: cwd, moved by every -C."""
    for flag, value in itertools.pairwise(options):
        if flag == "-C":
            cwd = cwd / value
    return cwd


def refusal(
    argv: Sequence[str], cwd: Path, claimed: Sequence[str], top: Path, *, private_index: bool = False
) -> str | None:
    """Why this git call is refused in the shared tree (None: it runs). claimed: the task's claims;
    private_index: GIT_INDEX_FILE names an index of its own, where add, rm and mv stage nothing of yours."""
    options, sub, args = split(argv)
    if sub not in SHARED.split("|") or (private_index and sub in ("add", "rm", "mv")):
        return None
    if sub not in _BY_PATH:
        return f"git {sub} is refused in the shared tree ({_WHY.get(sub, MOVES_HEAD)}"
    here = _directory(options, cwd)
    hard = [arg for arg in args if arg in ("--hard", "--merge", "--keep")]
    if sub == "reset" and hard:
        return f"git reset {hard[0]} is refused in the shared tree ({_WHY['reset']}"
    paths = _paths(sub, args, here)
    if paths is None:
        return f"git {sub} of a branch or commit is refused in the shared tree ({MOVES_HEAD}"
    if not paths:
        if sub == "checkout" and not [arg for arg in args if not arg.startswith("-")]:
            return None  # `git checkout` alone only reports
        return f"git {sub} of the whole tree is refused in the shared tree ({_WHY['reset']}"
    return _unclaimed(sub, paths, here, claimed, top)


def _paths(sub: str, args: Sequence[str], cwd: Path) -> list[str] | None:
    """The pathspecs a checkout, restore or reset names; None when it names a branch or commit to move to."""
    if "--" in args:
        at = args.index("--")
        before, after = list(args[:at]), list(args[at + 1 :])
    else:
        before, after = list(args), []
    valued = {"-s", "--source", "-b", "-B", "--orphan", "--conflict", "--pathspec-from-file"}
    if sub == "checkout" and {"-b", "-B", "--orphan", "--detach"} & set(before):
        return None
    positional: list[str] = []
    skip = False
    for arg in before:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif not arg.startswith("-"):
            positional.append(arg)
    if (
        sub != "restore"
        and positional
        and gitops.git_ok("rev-parse", "--verify", "-q", f"{positional[0]}^{{commit}}", cwd=cwd)
    ):
        positional = positional[1:]  # the commit the paths come from
        if not positional and not after:
            return None
    return positional + after


def _unclaimed(sub: str, paths: Sequence[str], cwd: Path, claimed: Sequence[str], top: Path) -> str | None:
    """The refusal naming the first path the task did not claim (a directory or the top: the whole tree)."""
    root = top.resolve()
    for spec in paths:
        target = (cwd / spec).resolve()
        if target == root:
            return f"git {sub} -- {spec} is refused in the shared tree ({_WHY['reset']}"
        try:
            rel = target.relative_to(root).as_posix()
        except ValueError:
            continue  # outside the shared tree: git itself refuses it
        if rel not in claimed:
            return (
                f"git {sub} of {rel} is refused in the shared tree (this task did not claim it; another "
                f"worker may be editing it): name only files this task claimed, then {COMMIT}"
            )
    return None


def _claimed(ctx: WorkerContext) -> list[str]:
    """The paths the attempt holds (its declared claims and those taken as it wrote)."""
    from stellafleet.state.claims import ClaimStore

    if not ctx.paths.store_db.exists():
        return []
    with ClaimStore.open(ctx.paths.store_db) as store:
        return store.paths_of_attempt(ctx.run_id, ctx.attempt_id)


def _commit_in_turn(ctx: WorkerContext, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """An isolated worker's `git commit`, its hooks under the repository's hook lock, the stash kept."""
    git = [_real_git(), *argv]
    if split(argv)[1] != "commit":
        runner.become(git, gitops.unguarded(env))
    with hookstash.guarded(ctx.paths.private / hookstash.LOCK_NAME, ctx.workspace):
        done = runner.run(
            git, env=gitops.unguarded(env), stdout=runner.INHERIT, stderr=runner.INHERIT, session=False
        )
    return done.returncode


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Refuse argv in one line on stderr and in the task's log (exit 1), or run the real git."""
    try:
        ctx = WorkerContext.from_env(env)
        if not ctx.shared:
            return _commit_in_turn(ctx, argv, env)
        index = env.get("GIT_INDEX_FILE", "")
        private = (
            bool(index) and Path(index).resolve() != gitops.git_path(ctx.workspace, "--git-dir") / "index"
        )
        why = refusal(argv, Path.cwd(), _claimed(ctx), ctx.workspace, private_index=private)
    except StellaError:  # not in a worker after all: nothing to guard
        why = None
    if why is None:
        runner.become([_real_git(), *argv], gitops.unguarded(env))
    line = f"stella: {why}"
    print(line, file=sys.stderr, flush=True)
    with ctx.log_path.open("a", encoding="utf-8") as log:
        log.write(line + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
