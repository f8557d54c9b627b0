"""The engine's tools (files, search, git, commit, finish, an opt-in shell), each with its JSON Schema
parameters, and the workspace they may touch: every path confined to it, every shared-tree write claimed."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import posixpath
import tomllib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any, TypeVar

from stellafleet.core.paths import EXCLUDED_DIRS
from stellafleet.core.schemaerrors import article
from stellafleet.engine.errors import Finished, FormatError, Parked, ToolFailure
from stellafleet.engine.messages import ToolSpec
from stellafleet.engine.settings import DEFAULT_KEY_ENV
from stellafleet.git import gitops
from stellafleet.proc import runner
from stellafleet.proc.group import group_exists

ClaimFn = Callable[[str], None]  # raises ClaimConflict when another live worker holds the path
LeaveOpen = Callable[[], None]  # called within a span: it is not closed, as what the call started runs on
SpanFn = Callable[[], AbstractContextManager[LeaveOpen]]  # a write span recorded around its body
WRITING_TOOLS = frozenset({"write_file", "edit_file", "commit", "shell"})  # the tools that can write the tree


@dataclass
class Workspace:
    root: Path
    claim: ClaimFn | None = None
    span: SpanFn | None = None  # in a shared tree: when this worker could write it (run/steps/unclaimed.py)
    written: dict[str, None] = field(default_factory=dict)  # every path written, in order
    uncommitted: dict[str, None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    def relative(self, given: str) -> str:
        """The normalised workspace-relative spelling of a path the model gave, or ToolFailure."""
        if not isinstance(given, str) or not given.strip():
            raise ToolFailure("path is empty: give a path relative to the workspace")
        text = given.strip().replace("\\", "/")
        if text.startswith(("/", "~")) or PureWindowsPath(given).drive:
            raise ToolFailure(f"{given}: absolute paths are refused; give a path relative to the workspace")
        normal = posixpath.normpath(text)
        if normal == ".." or normal.startswith("../"):
            raise ToolFailure(f"{given}: the path climbs out of the workspace; stay inside it")
        return normal

    def resolve(self, given: str) -> tuple[Path, str]:
        """(absolute path, workspace-relative path) after following symlinks; refused if it leaves."""
        rel = self.relative(given)
        full = (self.root / rel).resolve()
        if full != self.root and not full.is_relative_to(self.root):
            raise ToolFailure(f"{given}: the path leads outside the workspace through a symlink; refused")
        real_rel = full.relative_to(self.root).as_posix() if full != self.root else "."
        return full, real_rel

    def resolve_for_write(self, given: str) -> tuple[Path, str]:
        full, rel = self.resolve(given)
        first = rel.split("/", 1)[0]
        if rel == "." or first == ".git" or any((rel + "/").startswith(d) for d in EXCLUDED_DIRS):
            raise ToolFailure(f"{given}: writing there is refused (repository or stella state, not work)")
        if full.is_dir():
            raise ToolFailure(f"{given}: is a directory; name a file")
        return full, rel


_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
_JSON_TYPE.update(dict.fromkeys((int, float), "a number"))


def _kind(value: Any) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def param(kind: str, description: str) -> dict[str, Any]:
    if kind == "array":
        return {"type": "array", "items": {"type": "string"}, "description": description}
    return {"type": kind, "description": description}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    run: Callable[[dict[str, Any]], str]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            self.name,
            self.description,
            {"type": "object", "properties": self.params, "required": list(self.required)},
        )

    def check(self, args: Any) -> dict[str, Any]:
        """The arguments, type-checked (numbers and booleans given as text are accepted); FormatError."""
        takes = ", ".join(self.params) or "no arguments"
        if not isinstance(args, dict):
            raise FormatError(
                f"{self.name}: the arguments must be a JSON object, not {_kind(args)} ({takes})"
            )
        unknown = [k for k in args if k not in self.params]
        if unknown:
            raise FormatError(f"{self.name}: unknown argument {unknown[0]!r} (it takes: {takes})")
        missing = [k for k in self.required if args.get(k) is None]
        if missing:
            raise FormatError(f"{self.name}: missing required argument {missing[0]!r} (it takes: {takes})")
        kinds = {key: self.params[key]["type"] for key, value in args.items() if value is not None}
        return {key: _coerce(self.name, key, kind, args[key]) for key, kind in kinds.items()}


def _coerce(tool: str, key: str, kind: str, value: Any) -> Any:
    """value as an argument of this kind (numbers and booleans may come as text); FormatError if it is not."""
    text = value.strip().lower() if isinstance(value, str) else None
    if kind == "string" and text is not None:
        return value
    if kind == "integer" and not isinstance(value, bool):
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return int(value)
        if text is not None and text.lstrip("-").isdigit():
            return int(value)
    if kind == "boolean" and (isinstance(value, bool) or text in ("true", "false")):
        return value if text is None else text == "true"
    if kind == "array" and text is not None:
        return [value]
    if kind == "array" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise FormatError(f"{tool}: argument {key!r} must be {article(kind)}, got {_kind(value)}")


Committer = Callable[[list[str], str], str]  # (paths, message) -> commit SHA

MAX_RESULT_CHARS = 30_000
READ_LINES = 2000
MAX_MATCHES = 200
MAX_FILES = 500
MAX_ENTRIES = 1000
SECRET_ENV = tuple(DEFAULT_KEY_ENV.values())  # variables a shell command must not see (provider keys)


ToolMethod = TypeVar("ToolMethod", bound=Callable[..., str])
# Each tool's (description, parameters, required ones), in the order the model is shown them.
TOOL_DEFS: dict[str, tuple[str, dict[str, dict[str, Any]], tuple[str, ...]]] = {}
PATH = param("string", "a path relative to the workspace")


def tool(
    description: str, required: tuple[str, ...] = (), **params: dict[str, Any]
) -> Callable[[ToolMethod], ToolMethod]:
    """Makes a Toolbox method (named as the tool) a tool with this description and these parameters."""

    def mark(method: ToolMethod) -> ToolMethod:
        TOOL_DEFS[method.__name__] = (description, params, required)
        return method

    return mark


class Toolbox:
    def __init__(
        self,
        workspace: Workspace,
        *,
        committer: Committer | None = None,
        shell: bool = False,
        shell_timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        secret_env: tuple[str, ...] = SECRET_ENV,
        plan_out: Path | None = None,
    ) -> None:
        self.workspace = workspace
        self.plan_out = plan_out  # an expanding task's: where emit_tasks writes its plan fragment
        self.committer = committer
        self.shell_timeout = shell_timeout
        self.left_running = False  # the call's command left processes running, which may write later
        given = os.environ if env is None else env
        self._env = {name: value for name, value in given.items() if name not in secret_env}
        offered = {"shell": shell, "emit_tasks": plan_out is not None}  # the opt-in tools
        self.tools = {
            name: Tool(name, description, params, required, getattr(self, name))
            for name, (description, params, required) in TOOL_DEFS.items()
            if offered.get(name, True)
        }

    @property
    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self.tools.values()]

    def call(self, name: str, args: Any) -> str:
        """Run a tool; FormatError/ToolFailure/StellaError/OSError are for the caller to report."""
        tool = self.tools.get(name)
        if tool is None:
            raise FormatError(f"unknown tool {name!r}: the tools are {', '.join(self.tools)}")
        span = self.workspace.span if name in WRITING_TOOLS else None
        self.left_running = False
        with span() if span is not None else contextlib.nullcontext(lambda: None) as leave_open:
            text = tool.run(tool.check(args))
            if self.left_running:
                leave_open()
        if len(text) > MAX_RESULT_CHARS:
            more = len(text) - MAX_RESULT_CHARS
            text = f"{text[:MAX_RESULT_CHARS]}\n... [output truncated: {more} more characters]"
        return text

    @tool(
        f"Read a text file, with line numbers (up to {READ_LINES} lines per call).",
        ("path",),
        path=PATH,
        start_line=param("integer", "first line to read (1-based; default 1)"),
        end_line=param("integer", "last line to read (inclusive)"),
    )
    def read_file(self, args: dict[str, Any]) -> str:
        full, rel = self.workspace.resolve(args["path"])
        if full.is_dir():
            raise ToolFailure(f"{rel} is a directory: use list_dir")
        if not full.exists():
            raise ToolFailure(f"{rel}: no such file")
        data = full.read_bytes()
        if b"\0" in data[:8192]:
            return f"{rel} is a binary file ({len(data)} bytes); not shown"
        lines = data.decode("utf-8", errors="replace").splitlines()
        start = max(int(args.get("start_line", 1)), 1)
        end = min(int(args.get("end_line", start + READ_LINES - 1)), start + READ_LINES - 1, len(lines))
        if not lines:
            return f"{rel} is empty"
        if start > len(lines):
            raise ToolFailure(f"{rel} has only {len(lines)} lines; start_line {start} is past the end")
        shown: list[str] = []
        budget = MAX_RESULT_CHARS - 200  # room for the note below
        for n in range(start, end + 1):
            line = f"{n:>6}\t{lines[n - 1]}"
            budget -= len(line) + 1
            if budget < 0 and shown:
                end = n - 1
                break
            shown.append(line[: MAX_RESULT_CHARS - 200])
        body = "\n".join(shown)
        if start > 1 or end < len(lines):
            more = f"; read on with start_line={end + 1}" if end < len(lines) else ""
            body += f"\n(lines {start}-{end} of {len(lines)}{more})"
        return body

    def _write(self, given: str, content: str) -> str:
        full, rel = self.workspace.resolve_for_write(given)
        if self.workspace.claim is not None:  # the implicit claim of a shared tree; ClaimConflict goes back
            self.workspace.claim(rel)
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(content, encoding="utf-8")
        self.workspace.written[rel] = self.workspace.uncommitted[rel] = None
        return rel

    @tool(
        "Create or overwrite a file with the given content (parent directories are created).",
        ("path", "content"),
        path=PATH,
        content=param("string", "the whole new content of the file"),
    )
    def write_file(self, args: dict[str, Any]) -> str:
        content: str = args["content"]
        rel = self._write(args["path"], content)
        return f"wrote {rel} ({len(content.splitlines())} lines)"

    @tool(
        "Replace an exact piece of text in a file. old_text must occur exactly once (include enough "
        "surrounding lines), unless replace_all is true.",
        ("path", "old_text", "new_text"),
        path=PATH,
        old_text=param("string", "the exact text to replace, whitespace included, without line numbers"),
        new_text=param("string", "the replacement text"),
        replace_all=param("boolean", "replace every occurrence (default false)"),
    )
    def edit_file(self, args: dict[str, Any]) -> str:
        full, rel = self.workspace.resolve_for_write(args["path"])
        old, new = args["old_text"], args["new_text"]
        if not full.is_file():
            raise ToolFailure(f"{rel}: no such file (use write_file to create it)")
        if not old:
            raise ToolFailure("old_text is empty: give the exact text to replace")
        text = full.read_text(encoding="utf-8", errors="replace")
        count = text.count(old)
        if count == 0:
            raise ToolFailure(
                f"old_text was not found in {rel}: read the file again and copy the text exactly, "
                "whitespace included and without line numbers"
            )
        if count > 1 and not args.get("replace_all", False):
            raise ToolFailure(
                f"old_text occurs {count} times in {rel}: include more surrounding lines to make it unique, "
                "or set replace_all to true"
            )
        self._write(rel, text.replace(old, new))
        return f"edited {rel}: replaced {count} occurrence{'s' if count > 1 else ''}"

    @tool(
        "List a directory's entries (directories end with /).",
        path=param("string", "a directory relative to the workspace (default: the workspace)"),
    )
    def list_dir(self, args: dict[str, Any]) -> str:
        full, rel = self.workspace.resolve(args.get("path", "."))
        if not full.is_dir():
            raise ToolFailure(f"{rel}: not a directory")
        with os.scandir(full) as it:
            names = sorted(e.name + ("/" if e.is_dir() else "") for e in it if e.name != ".git")
        if not names:
            return f"{rel} is empty"
        extra = f"\n... and {len(names) - MAX_ENTRIES} more" if len(names) > MAX_ENTRIES else ""
        return "\n".join(names[:MAX_ENTRIES]) + extra

    def _under(self, given: str | None) -> str:
        if not given:
            return ""
        full, rel = self.workspace.resolve(given)
        if not full.exists():
            raise ToolFailure(f"{given}: no such file or directory")
        return "" if rel == "." else rel

    @tool(
        "Find files by glob pattern (`*` stays within a directory, `**/` crosses directories), "
        "e.g. **/*.py or src/*.rs. Ignored files are left out.",
        ("pattern",),
        pattern=param("string", "the glob pattern"),
        path=param("string", "search under this directory"),
    )
    def glob(self, args: dict[str, Any]) -> str:
        pattern = args["pattern"].strip()
        self.workspace.relative(pattern)  # refuses absolute and climbing patterns
        base = self._under(args.get("path"))
        full_pattern = f"{base}/{pattern}" if base else pattern
        found = gitops.ls_files(self.workspace.root, [f":(glob){full_pattern}"])
        # tracked but deleted in the work tree: gone
        existing = (rel for rel in sorted(set(found)) if (self.workspace.root / rel).exists())
        shown = list(itertools.islice(existing, MAX_FILES + 1))
        if not shown:
            return f"no files match {full_pattern}"
        more = f"\n... more than {MAX_FILES} files: narrow the pattern" if len(shown) > MAX_FILES else ""
        return "\n".join(shown[:MAX_FILES]) + more

    @tool(
        f"Search file contents with an extended regular expression; prints path:line:text "
        f"(at most {MAX_MATCHES} matches). Ignored and binary files are left out.",
        ("pattern",),
        pattern=param("string", "the regular expression (or plain text with fixed_strings)"),
        path=param("string", "search under this directory or file (default: everywhere)"),
        include=param("string", "only files matching this glob, e.g. *.py"),
        ignore_case=param("boolean", "match case-insensitively"),
        fixed_strings=param("boolean", "treat pattern as plain text"),
    )
    def grep(self, args: dict[str, Any]) -> str:
        base = self._under(args.get("path"))
        include = args.get("include")
        spec: list[str] = []
        if include:
            self.workspace.relative(include)
            glob = include if "/" in include else f"**/{include}"
            spec = [f":(glob){base}/{glob}" if base else f":(glob){glob}"]
        elif base:
            spec = [f":(literal){base}"]
        out = gitops.grep(
            self.workspace.root,
            args["pattern"],
            spec,
            ignore_case=bool(args.get("ignore_case", False)),
            fixed=bool(args.get("fixed_strings", False)),
        )
        if not out:
            return "no matches"
        lines = out.splitlines()
        extra = len(lines) - MAX_MATCHES
        more = f"\n... {extra} more matches: narrow the search" if extra > 0 else ""
        return "\n".join(lines[:MAX_MATCHES]) + more

    @tool("Show `git status --porcelain` of the workspace.")
    def git_status(self, args: dict[str, Any]) -> str:
        lines = gitops.status_porcelain(self.workspace.root)
        return "\n".join(lines) if lines else "clean: nothing to commit"

    @tool(
        "Show the uncommitted changes (`git diff`), optionally of one path, or the staged ones.",
        path=param("string", "limit the diff to this path"),
        staged=param("boolean", "diff the index instead"),
    )
    def git_diff(self, args: dict[str, Any]) -> str:
        paths = [self.workspace.resolve(args["path"])[1]] if args.get("path") else []
        out = gitops.diff(self.workspace.root, paths, staged=bool(args.get("staged", False)))
        return out or "no differences"

    @tool(
        "Commit files you wrote in this task (default: all of them not yet committed). Only your own "
        "files can be committed; nothing else is swept in.",
        ("message",),
        message=param("string", "the commit message"),
        paths=param("array", "the files to commit"),
    )
    def commit(self, args: dict[str, Any]) -> str:
        if self.committer is None:
            raise ToolFailure("committing is not available in this workspace")
        message = args["message"].strip()
        if not message:
            raise ToolFailure("the commit message is empty")
        wanted = [self.workspace.resolve(p)[1] for p in args["paths"]] if "paths" in args else []
        wanted = wanted or list(self.workspace.uncommitted)
        if not wanted:
            raise ToolFailure("nothing to commit: you have not written any file since your last commit")
        foreign = [p for p in wanted if p not in self.workspace.written]
        if foreign:
            mine = ", ".join(self.workspace.written) or "none yet"
            raise ToolFailure(
                f"you can only commit files you wrote in this task: {foreign[0]} is not one (yours: {mine})"
            )
        sha = self.committer(wanted, message)
        for rel in wanted:
            self.workspace.uncommitted.pop(rel, None)
        return f"committed {sha[:12]}: {', '.join(wanted)}"

    @tool(
        "End the task with a summary of what was done (and what was not). Commit your work first.",
        ("summary",),
        summary=param("string", "what you did, for the person who reviews it"),
        success=param("boolean", "false if the task could not be done (default true)"),
    )
    def finish(self, args: dict[str, Any]) -> str:
        raise Finished(args["summary"].strip(), bool(args.get("success", True)))

    @tool(
        "Ask a person one question you cannot go on without (a decision, a missing fact). The task "
        "waits for the answer, which comes as the next message; ask only what the task cannot settle.",
        ("question",),
        question=param("string", "the question, with what the person needs to answer it"),
    )
    def ask(self, args: dict[str, Any]) -> str:
        raise Parked(args["question"].strip())

    @tool(
        "Run a shell command in the workspace (no input; output truncated). Its writes take no "
        "claims and its commits are not recorded: prefer the file and commit tools.",
        ("command",),
        command=param("string", "the command line, run by /bin/sh"),
    )
    def shell(self, args: dict[str, Any]) -> str:
        # Its own process group, stopped at once on the timeout or Ctrl-C: whatever it started, not only sh.
        argv = ["/bin/sh", "-c", args["command"]]
        pids: list[int] = []
        root, env = self.workspace.root, self._env
        done = runner.run(argv, cwd=root, env=env, timeout=self.shell_timeout, on_start=pids.append)
        if done.timed_out:
            raise ToolFailure(f"the command ran longer than {self.shell_timeout:g} s and was stopped")
        # what it left running in the background (`server >log &`) may write the tree after it returns
        self.left_running = bool(pids) and group_exists(pids[0])
        output = (done.stdout + done.stderr).strip()
        return f"exit status {done.returncode}\n{output}" if output else f"exit status {done.returncode}"

    @tool(
        "Add tasks to the run, to start once this task has succeeded: a plan fragment in TOML "
        "([[tasks]] tables with id, prompt and optionally title, depends_on, claims, isolation, "
        'pipeline, model, timeout; an optional [defaults] table) or JSON ({"tasks": [...]}). '
        "depends_on names another task of the fragment by its id, or a task this one depends on. "
        "Their ids become <this task>.<id>; tasks that depend on this one wait for all of them. "
        "Calling it again replaces the fragment; the fleet checks it when this task ends, and a "
        "problem in it fails this task.",
        ("fragment",),
        fragment=param("string", "the whole fragment, TOML or JSON"),
    )
    def emit_tasks(self, args: dict[str, Any]) -> str:
        text: str = args["fragment"]
        try:
            data = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise ToolFailure(f"the fragment is not valid TOML or JSON: {exc}") from None
        tasks = data.get("tasks") if isinstance(data, dict) else None
        if not isinstance(tasks, list):
            raise ToolFailure('the fragment has no tasks: write [[tasks]] tables (TOML) or {"tasks": [...]}')
        assert self.plan_out is not None  # the tool exists only with it
        partial = self.plan_out.with_name(self.plan_out.name + ".part")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, self.plan_out)  # a fragment is never read half-written
        return f"the fragment holds {len(tasks)} tasks; they run once this task has succeeded"
