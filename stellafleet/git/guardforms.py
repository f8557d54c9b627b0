"""How the git guard (git/guard.py) reads a git command line: its words, an option's values, the files a
command writes by name, and whether a command that can read or write only reads in the form given."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from pathlib import Path


def words_of(args: Sequence[str], valued: Collection[str] = ()) -> list[str]:
    """The arguments that are neither options nor the value of one of the valued options."""
    words: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
    return words


def before_paths(args: Sequence[str]) -> list[str]:
    """The arguments before `--` (after it, every one is a path)."""
    return list(args[: args.index("--")]) if "--" in args else list(args)


def option_value(args: Sequence[str], short: str, long: str) -> list[str]:
    """The values an option is given, as `-o V`, `-oV`, `--long=V` or `--long V`."""
    values: list[str] = []
    for arg, after in itertools.zip_longest(args, args[1:], fillvalue=""):
        if arg in (short, long) and arg:
            values.append(after)
        elif arg.startswith(f"{long}="):
            values.append(arg.partition("=")[2])
        elif short and arg.startswith(short) and len(arg) > len(short) and not arg.startswith("--"):
            values.append(arg[len(short) :])
    return [value for value in values if value]


# the options of clone and init that take the next argument as their value
_CLONE_VALUED = {"-o", "--origin", "-b", "--branch", "-u", "--upload-pack", "--reference", "--depth", "-c"}
_CLONE_VALUED |= {"--reference-if-able", "--separate-git-dir", "--shallow-since", "--shallow-exclude"}
_CLONE_VALUED |= {"--config", "--server-option", "-j", "--jobs", "--filter", "--template", "--bundle-uri"}
_INIT_VALUED = {"--template", "--separate-git-dir", "-b", "--initial-branch", "--object-format"}


def files_written(sub: str, args: Sequence[str]) -> list[str]:
    """The files or folders a merge-file, archive, format-patch, bundle create, init or clone writes."""
    if sub == "merge-file":
        return [] if {"-p", "--stdout"} & set(args) else words_of(args, ("-L",))[:1]
    if sub == "archive":
        return option_value(args, "-o", "--output")
    if sub == "format-patch":
        return [] if "--stdout" in args else option_value(args, "-o", "--output-directory") or ["."]
    if sub == "bundle":  # bundle create FILE ...: `-` is stdout
        rest = args[args.index("create") + 1 :] if "create" in args else []
        named = [arg for arg in rest if arg == "-" or not arg.startswith("-")][:1]
        return [] if named == ["-"] else named
    if sub == "init":
        return words_of(args, _INIT_VALUED)[:1] or ["."]
    # clone URL [DIR]: DIR defaults to the URL's last part (Path's name drops a trailing slash)
    words = words_of(args, _CLONE_VALUED)
    return words[1:2] or [Path(words[0]).name.removesuffix(".git") or "."] if words else []


def reads(sub: str, args: Sequence[str]) -> bool:
    """Whether a command that can read or write (the guard's _READ_FORMS) only reads in this form."""
    if sub == "config":
        return _config_reads(args)
    if sub in ("branch", "tag"):
        return _lists_refs(sub, args)
    if sub == "symbolic-ref":
        return not {"-d", "--delete"} & set(args) and len(words_of(args, ("-m",))) <= 1
    first = words_of(args, ("--ref",))[:1]  # notes' option before its verb; the others have none
    if sub == "reflog":
        return first not in (["expire"], ["delete"])
    reading = {
        "sparse-checkout": ["list"],
        "notes": ["list", "show"],
        "worktree": ["list"],
        "remote": ["show", "get-url"],
        "submodule": ["status", "summary"],
        "lfs": ["ls-files", "status", "env", "version", "ext", "locks"],
    }
    return not first or first[0] in reading[sub]


_CONFIG_WRITES = {"--add", "--unset", "--unset-all", "--replace-all", "--rename-section", "--remove-section"}
_CONFIG_READS = {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l", "--list", "--get-color"}
_CONFIG_VALUED = ("-f", "--file", "--blob", "--type", "--default", "--comment", "--value")


def _config_reads(args: Sequence[str]) -> bool:
    """`git config` that reads: a --get form, a list, a `get` or `list`, or a name alone (old and new CLI)."""
    options = {arg for arg in args if arg.startswith("-")}
    if options & (_CONFIG_WRITES | {"-e", "--edit"}):
        return False
    words = words_of(args, _CONFIG_VALUED)
    if words[:1] == ["get"] or options & (_CONFIG_READS | {"--get-colorbool"}):
        return True
    return len(words) <= 1 and words[:1] not in (["edit"], ["set"], ["unset"])


_REF_WRITES = {
    "branch": {"-d", "-D", "--delete", "-m", "-M", "--move", "-c", "-C", "--copy", "-f", "--force", "-u"}
    | {"--set-upstream-to", "--unset-upstream", "--edit-description"},
    "tag": {"-d", "--delete", "-f", "--force", "-a", "--annotate", "-s", "--sign", "-u", "--local-user", "-m"}
    | {"--message", "-F", "--file", "-e", "--edit"},
}
_LISTS = {"-l", "--list", "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"}
_REF_LISTS = {"branch": _LISTS, "tag": _LISTS | {"-n", "-v", "--verify"}}  # tag's annotation lines, verify


def _lists_refs(sub: str, args: Sequence[str]) -> bool:
    """A branch or tag command that lists (or verifies), never one that makes, moves or deletes a ref."""
    options = {arg.partition("=")[0] for arg in args if arg.startswith("-")}
    if options & _REF_WRITES[sub]:
        return False
    return not words_of(args, ("--format", "--sort")) or bool(options & _REF_LISTS[sub])
