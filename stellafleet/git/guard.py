"""The git guard of shared-tree workers: `git` first on their PATH, a small shell script that runs the real
git itself only for the subcommands that read (READ_ONLY) and hands every other one to `python -m
stellafleet.git.guard`, which runs it when it writes nothing outside the task's claims and refuses it in one
line otherwise (docs/claims.md)."""

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
from stellafleet.git import gitops, guardforms, hookstash
from stellafleet.proc import runner

# What the script runs without Python: these read, or write only git objects (hash-object -w, commit-tree,
# mktree, merge-tree), which no worker's files, index or refs see. `--output=FILE` (diff, log, show, ...) is
# the one write among their options: the script hands it to Python, which judges FILE as a path.
READ_ONLY = (
    "status|diff|diff-files|diff-index|diff-tree|log|show|whatchanged|shortlog|blame|annotate|grep|range-diff"
    "|ls-files|ls-tree|ls-remote|rev-parse|rev-list|cat-file|describe|name-rev|for-each-ref|show-ref"
    "|show-branch|merge-base|cherry|check-ignore|check-attr|check-mailmap|check-ref-format|var|version|help"
    "|count-objects|fsck|verify-commit|verify-tag|verify-pack|show-index|get-tar-commit-id|patch-id"
    "|stripspace|column|fmt-merge-msg|hash-object|commit-tree|mktree|merge-tree"
)
# Every form of these is refused: they write the index, HEAD or refs, or take in every file
_REFUSED = {"stash", "clean", "switch", "rebase", "merge", "pull", "cherry-pick", "revert", "commit", "add"}
_REFUSED |= {"stage", "rm", "mv", "am", "read-tree", "update-ref", "update-index", "bisect", "filter-branch"}
_REFUSED |= {"replace", "push", "pack-refs"}
_PRUNES = ("gc", "prune", "prune-packed", "repack", "maintenance")  # may delete objects still needed
_BY_PATH = ("checkout", "restore", "reset", "checkout-index")  # refused by the paths they name
# refused unless in a form that only reads (guardforms.reads)
_READ_FORMS = ["symbolic-ref", "sparse-checkout", "config", "branch", "tag", "notes", "reflog", "worktree"]
_READ_FORMS += ["remote", "submodule", "lfs"]
_WRITE_FILES = {"merge-file", "archive", "format-patch", "bundle", "init", "clone"}  # by what they write
SHARED = "*"  # every subcommand but READ_ONLY goes to Python
ISOLATED = "commit"  # an isolated worker's own commit: its hooks under the hook lock (serialize_hooks)
# git's global options that take the next argument as their value
_VALUED = ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--config-env")
_ALIAS_DEPTH = 10  # an alias of an alias ...: git's own loop check stops a loop; this stops the guard's

_MARK = "# stella's git guard"  # in the script's head: how the guard tells itself from the real git
_SCRIPT = """#!/bin/sh
{mark} for a shared-tree worker: see docs/claims.md ("The git guard").
skip= reads=
for arg in "$@"; do
  if [ -n "$skip" ]; then skip=; continue; fi
  if [ -n "$reads" ]; then
    case $arg in
      --) break ;;
      --output|--output=*) exec {python} -P -m stellafleet.git.guard "$@" ;;
    esac
    continue
  fi
  case $arg in
    {valued}) skip=1 ;;
    -*) ;;
    {read_only}) reads=1 ;;
    {diverted}) exec {python} -P -m stellafleet.git.guard "$@" ;;
    *) break ;;
  esac
done
exec {git} "$@"
"""

COMMIT = "stella commit -m MSG PATH..."
MOVES_HEAD = f"it moves HEAD under every worker): commit your files with {COMMIT}"
_REFS = f"it writes refs every worker shares): commit your files with {COMMIT}"
_WHY = {
    "stash": f"other workers' edits live here): use {COMMIT}",
    "commit": f"it commits the shared index, with other workers' files): use {COMMIT}",
    "add": f"it stages into the user's own index): {COMMIT} stages exactly what it commits",
    "rm": f"it stages into the user's own index): use a plain rm, then {COMMIT}",
    "mv": f"it stages into the user's own index): use a plain mv, then {COMMIT}",
    "clean": f"it deletes other workers' new files): remove your own files with rm, then {COMMIT}",
    "reset": f"it resets other workers' edits too): restore only your own files by path, then {COMMIT}",
    "read-tree": f"it rewrites the user's own index): {COMMIT} stages exactly what it commits",
    "update-index": f"it stages into the user's own index): {COMMIT} stages exactly what it commits",
    "sparse-checkout": f"it removes tracked files from the shared tree): edit your files, then {COMMIT}",
    **dict.fromkeys(("update-ref", "branch", "tag", "notes", "reflog", "replace", "worktree"), _REFS),
    "config": (
        "it changes the repository's or your git config, for you and every worker, for good): give a "
        f"setting to one command with git -c NAME=VALUE; commit your files with {COMMIT}"
    ),
    "stage": f"it stages into the user's own index): {COMMIT} stages exactly what it commits",
    "push": f"it writes refs, this repository's or a remote's): commit your files with {COMMIT}",
    "pack-refs": _REFS,
    "lfs": f"it rewrites files across the shared tree, or the user's index or config): use {COMMIT}",
}
_PRUNED = (
    "it can delete objects another worker's commit in progress or a salvage needs): run it after the fleet"
)
_UNKNOWN = (
    "the guard runs only what it knows writes nothing beyond the task's claims): read with status, diff, log "
    f"or show; commit your files with {COMMIT}"
)
_UNCLAIMED_FILE = (
    "this task did not claim it; another worker may be editing it): write outside the shared tree, or to a "
    "file this task claimed"
)
_NESTED = (
    "a repository in the shared tree shows in every worker's status): make it outside, e.g. under $TMPDIR"
)
_FETCH_REF = (
    "it writes a ref every worker shares): fetch into refs/remotes/ (git fetch REMOTE), or git ls-remote"
)
_FETCH_FLAG = "it deletes tags or changes the depth of the history under every worker): fetch without it"
# the options of checkout, restore, reset and checkout-index that take the next argument as their value
_VALUED_BY_PATH = {"-s", "--source", "-b", "-B", "--orphan", "--conflict", "--pathspec-from-file", "--prefix"}
_UNSEEN_PATCH = f"the guard cannot see its files): save it to a file, git apply FILE, then {COMMIT}"
_QUIET = {"-q", "--quiet", "--progress", "--no-progress"}  # all a plain `git checkout` may have: it reports


def install(folder: Path, diverted: str = SHARED) -> Path:
    """The guard script written as folder/git, for this python and the real git, handing the diverted
    subcommands (`a|b`, or `*`: all but READ_ONLY) to this module; returns folder."""
    text = _SCRIPT.format(
        mark=_MARK,
        valued="|".join(_VALUED),
        read_only=READ_ONLY,
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
    argv: Sequence[str],
    cwd: Path,
    claimed: Sequence[str],
    top: Path,
    *,
    private_index: bool = False,
    depth: int = 0,
) -> str | None:
    """Why this git call is refused in the shared tree (None: it runs). claimed: the task's claims;
    private_index: GIT_INDEX_FILE names an index of its own, where add, rm and mv stage nothing of yours."""
    options, sub, args = split(argv)
    here = _directory(options, cwd)
    if not sub or sub in READ_ONLY.split("|"):
        return _written(
            sub, guardforms.option_value(guardforms.before_paths(args), "", "--output"), here, claimed, top
        )
    if sub in _READ_FORMS:
        if guardforms.reads(sub, args):
            return None
        return f"git {sub} is refused in the shared tree except to read ({_WHY.get(sub, MOVES_HEAD)}"
    if private_index and sub in ("add", "stage", "rm", "mv"):
        return None
    if sub == "apply":
        return _apply_refusal(args, here, claimed, top)
    if sub in _WRITE_FILES:
        return _written(sub, guardforms.files_written(sub, args), here, claimed, top)
    if sub == "fetch":
        return _fetch_refusal(options, args, cwd)
    if sub in _PRUNES:
        return f"git {sub} is refused in the shared tree ({_PRUNED}"
    if sub in _REFUSED:
        return f"git {sub} is refused in the shared tree ({_WHY.get(sub, MOVES_HEAD)}"
    if sub in _BY_PATH:
        return _by_path_refusal(sub, args, here, claimed, top)
    if depth >= _ALIAS_DEPTH:
        return f"git {sub} is refused in the shared tree (an alias of {depth} aliases: {_UNKNOWN}"
    return _alias_refusal(argv, cwd, claimed, top, private_index=private_index, depth=depth)


def _by_path_refusal(
    sub: str, args: Sequence[str], here: Path, claimed: Sequence[str], top: Path
) -> str | None:
    """A checkout, restore, reset or checkout-index runs when it names only claimed paths, or only reports."""
    hard = [arg for arg in args if arg in ("--hard", "--merge", "--keep")]
    if sub == "reset" and hard:
        return f"git reset {hard[0]} is refused in the shared tree ({_WHY['reset']}"
    paths = _paths(sub, args, here)
    if paths is None:
        return f"git {sub} of a branch or commit is refused in the shared tree ({MOVES_HEAD}"
    if not paths:
        if _only_reports(sub, args):
            return None
        return f"git {sub} of the whole tree is refused in the shared tree ({_WHY['reset']}"
    return _unclaimed(sub, paths, here, claimed, top)


def _alias_refusal(
    argv: Sequence[str], cwd: Path, claimed: Sequence[str], top: Path, *, private_index: bool, depth: int
) -> str | None:
    """A git command the guard has no rule for is refused; an alias is judged by what it expands to (git
    config alias.NAME, as the real git reads it), a shell alias (`!...`) refused; so is a word that is
    neither."""
    options, sub, args = split(argv)
    if sub in gitops.git_status("--list-cmds=main,others", cwd=cwd)[1].split():
        return f"git {sub} is refused in the shared tree ({_UNKNOWN}"
    code, out, _ = gitops.git_status(
        *_repository_options(options), "config", "--get", f"alias.{sub}", cwd=cwd
    )
    value = out.strip()
    if code != 0:  # git's help.autocorrect may run its guess of a command instead, unguarded
        return f"git {sub} is refused in the shared tree (no git command or alias has that name): git help -a"
    if value.startswith("!"):
        return (
            f"git {sub} is refused in the shared tree (it is the shell alias `{value}`, whose commands the "
            "guard cannot see): run the git commands it stands for"
        )
    try:
        expanded = shlex.split(value)
    except ValueError:
        return None  # git cannot split it either: it says so and runs nothing
    why = refusal(
        [*options, *expanded, *args], cwd, claimed, top, private_index=private_index, depth=depth + 1
    )
    if why is None or depth:
        return why  # an alias of an alias is named by the first
    return f"git {sub} is the alias `{value}`: {why}"


def _repository_options(options: Sequence[str]) -> list[str]:
    """The global options that say which repository and config git reads (not --help, --paginate, ...)."""
    kept: list[str] = []
    pending = False
    for option in options:
        if pending or option.startswith(("--git-dir=", "--work-tree=", "--config-env=")):
            kept.append(option)
            pending = False
        elif option in ("-C", "-c", "--git-dir", "--work-tree", "--config-env"):
            kept.append(option)
            pending = True
    return kept


def _written(sub: str, files: Sequence[str], here: Path, claimed: Sequence[str], top: Path) -> str | None:
    """The refusal naming the first file or folder a command would write in the shared tree that the task
    did not claim (outside the tree it runs)."""
    root = top.resolve()
    for name in files:
        target = (here / name).resolve()
        if not target.is_relative_to(root):
            continue
        rel = target.relative_to(root).as_posix()
        if rel in claimed:
            continue
        if sub in ("init", "clone"):
            return f"git {sub} into {rel} is refused in the shared tree ({_NESTED}"
        return f"git {sub} writing {rel} is refused in the shared tree ({_UNCLAIMED_FILE}"
    return None


_FETCH_VALUED = {"--depth", "--deepen", "--shallow-since", "--shallow-exclude", "--refmap", "-o", "-j"}
_FETCH_VALUED |= {"--server-option", "--upload-pack", "--jobs", "--negotiation-tip", "--filter"}
# fetch's options that delete local tags, aim it at a local branch or make the repository shallow
_FETCH_WRITES = {"--prune-tags", "-P", "--refmap", "--update-head-ok", "-u", "--depth", "--deepen"}
_FETCH_WRITES |= {"--shallow-since", "--shallow-exclude", "--unshallow", "--update-shallow"}


def _fetch_refusal(options: Sequence[str], args: Sequence[str], cwd: Path) -> str | None:
    """`git fetch` runs when it writes only remote-tracking refs (refs/remotes/), FETCH_HEAD and new tags,
    which no worker's tree, index or branch reads. A refspec into any other ref (`main:other`, `. HEAD~1:x`),
    a remote configured to fetch into one (a mirror), and the options that prune tags or make the history
    shallow are refused."""
    flags = [arg.partition("=")[0] for arg in args if arg.startswith("-")]
    writes = [flag for flag in flags if flag in _FETCH_WRITES]
    if writes:
        return f"git fetch {writes[0]} is refused in the shared tree ({_FETCH_FLAG}"
    words = guardforms.words_of(args, _FETCH_VALUED)
    every = {"--all", "--multiple"} & set(flags) or not words
    specs = [] if every else words[1:]
    # what the remote is configured to fetch into counts too (git updates those refs on every fetch of it)
    asked = ("--get-regexp", r"^remote\..*\.fetch$") if every else ("--get-all", f"remote.{words[0]}.fetch")
    _, out, _ = gitops.git_status(*_repository_options(options), "config", *asked, cwd=cwd)
    specs += [line.rpartition(" ")[2] if every else line for line in out.splitlines()]
    for spec in specs:  # [+]SRC:DST (a negative refspec, ^SRC, has no DST)
        target = spec.partition(":")[2]
        if target and not target.startswith("refs/remotes/"):
            return f"git fetch into {target} is refused in the shared tree ({_FETCH_REF}"
    return None


def _only_reports(sub: str, args: Sequence[str]) -> bool:
    """A checkout or checkout-index that names no path and writes nothing (`git checkout` alone reports)."""
    if sub == "checkout":
        return set(args) <= _QUIET
    return sub == "checkout-index" and not {"-a", "--all", "--stdin"} & set(args)


def _paths(sub: str, args: Sequence[str], cwd: Path) -> list[str] | None:
    """The paths a checkout, restore, reset or checkout-index names (with those its --pathspec-from-file
    lists); None when it names a branch or commit to move to."""
    before = list(args[: args.index("--")]) if "--" in args else list(args)
    after = list(args[len(before) + 1 :])
    if sub == "checkout" and any(_moves_head(arg) for arg in before):
        return None
    positional = guardforms.words_of(before, _VALUED_BY_PATH)
    listed = _pathspec_file(args, cwd)
    if (
        sub in ("checkout", "reset")
        and positional
        and gitops.git_ok("rev-parse", "--verify", "-q", f"{positional[0]}^{{commit}}", cwd=cwd)
    ):
        positional = positional[1:]  # the commit the paths come from
        if not positional and not after and not listed:
            return None
    return positional + after + listed


def _moves_head(arg: str) -> bool:
    """A checkout option that makes or moves to a branch, or detaches HEAD (short ones in a cluster too)."""
    if arg.startswith("--"):
        return arg.partition("=")[0] in ("--orphan", "--detach")
    return arg.startswith("-") and any(letter in "bBd" for letter in arg[1:])


def _pathspec_file(args: Sequence[str], cwd: Path) -> list[str]:
    """The paths a --pathspec-from-file names (both forms); none when it cannot be read (stdin too)."""
    name = next((arg.partition("=")[2] for arg in args if arg.startswith("--pathspec-from-file=")), None)
    if name is None and "--pathspec-from-file" in args[:-1]:
        name = args[list(args).index("--pathspec-from-file") + 1]
    if not name or name == "-":
        return []
    try:
        text = (cwd / name).read_text(errors="replace")
    except OSError:
        return []
    return [path for path in text.split("\0" if "--pathspec-file-nul" in args else "\n") if path]


_APPLY_VALUED = ("-p", "-C", "--directory", "--include", "--exclude", "--whitespace", "--build-fake-ancestor")


def _apply_refusal(args: Sequence[str], cwd: Path, claimed: Sequence[str], top: Path) -> str | None:
    """`git apply` runs when it only reports (--check, --stat, ...) or patches only claimed files (the patch's
    paths, as `git apply --numstat` names them, are relative to the top of the tree)."""
    options = {arg for arg in args if arg.startswith("-")}
    if options & {"--check", "--stat", "--numstat", "--summary"} and "--apply" not in options:
        return None
    if options & {"--index", "--cached", "-3", "--3way"}:
        return f"git apply to the index is refused in the shared tree ({_WHY['add']}"
    if not guardforms.words_of(args, _APPLY_VALUED):
        return f"git apply of a patch on stdin is refused in the shared tree ({_UNSEEN_PATCH}"
    # --numstat alone applies nothing and checks nothing (--check would fail the patch read backwards)
    listed = [arg for arg in args if arg not in ("--apply", "--check")]
    at = listed.index("--") if "--" in listed else len(listed)
    paths: list[str] = []
    # git apply names a rename by its new path only: read backwards too, the patch names the path it removes
    for direction in ("--no-reverse", "--reverse"):
        asked = [*listed[:at], direction, *listed[at:]]
        code, out, _ = gitops.git_status("apply", "--numstat", "-z", *asked, cwd=cwd)
        if code != 0:
            return None  # git itself refuses it
        paths += _numstat_paths(out)
    return _unclaimed("apply", paths, top, claimed, top)


def _numstat_paths(out: str) -> list[str]:
    """The paths of `git apply --numstat -z` records: `added TAB deleted TAB path`."""
    return [record.split("\t", 2)[2] for record in out.split("\0") if record.count("\t") >= 2]


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
