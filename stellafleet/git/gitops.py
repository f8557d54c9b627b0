"""Every git call stella makes goes through the one runner here; nothing outside stellafleet/git runs git."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from stellafleet.core.errors import DiskFull, GitError, StellaError
from stellafleet.proc import runner

if TYPE_CHECKING:  # imported where used: a worker never scans for git processes
    import psutil


# The folder of a shared worker's git guard (git/guard.py), first on its PATH: stella's own git, and the
# hooks it runs, use the real git behind it.
GUARD_VAR = "STELLA_GIT_GUARD"
PROGRAM = "git"  # its name on PATH (the guard's script has it too)


def unguarded(env: Mapping[str, str]) -> dict[str, str]:
    """env with no trace of the git guard: its folder off PATH and the variable naming it gone (together,
    since a guard left on PATH without its variable would find itself as the real git)."""
    folder = env.get(GUARD_VAR)
    if not folder:
        return dict(env)
    kept = {key: value for key, value in env.items() if key != GUARD_VAR}
    if "PATH" in env:
        kept["PATH"] = os.pathsep.join(part for part in env["PATH"].split(os.pathsep) if part != folder)
    return kept


def git_program() -> str:
    """The real git: the first on PATH that is not the git guard."""
    found = shutil.which(PROGRAM, path=unguarded(os.environ).get("PATH", os.defpath))
    if found is None:
        raise StellaError("git is not installed or not on PATH: install git and try again")
    return found


def _git_env(env: Mapping[str, str] | None) -> dict[str, str]:
    # No optional locks: a `git status` of ours never holds index.lock, where the user's git would fail.
    return {**unguarded(os.environ), "GIT_OPTIONAL_LOCKS": "0", **(env or {})}


def git_status(
    *args: str, cwd: Path | str, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> tuple[int, str, str]:
    """The one place git runs: (exit status, stdout, stderr); a git that cannot start raises GitError."""
    program = git_program()
    try:
        # Part of our own work, not a command to stop: it stays in our session (a Ctrl-C reaches it).
        done = runner.run([program, *args], cwd=cwd, env=_git_env(env), input=stdin, session=False)
    except OSError as exc:
        raise GitError(f"git {args[0] if args else ''}: {exc}") from None
    return done.returncode, done.stdout, done.stderr


def git_started(*args: str, cwd: Path | str) -> runner.Process:
    """git started now and left waiting for its input (runner.Process.finish feeds it)."""
    program = git_program()
    try:
        return runner.start([program, *args], cwd=cwd, env=_git_env(None), stdin=runner.PIPE, session=False)
    except OSError as exc:
        raise GitError(f"git {args[0] if args else ''}: {exc}") from None


def last_words(text: str, retcode: int) -> str:
    """The last line of git's output: what it says went wrong (else its exit status)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else f"exit status {retcode}"


def git(
    *args: str,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    check: bool = True,
) -> str:
    """Run git in cwd and return stdout; a failure raises GitError with git's own message."""
    retcode, out, err = git_status(*args, cwd=cwd, env=env, stdin=stdin)
    if check and retcode != 0:
        if "No space left on device" in err:  # a full disk is the user's to free, not a git failure
            raise DiskFull(Path(cwd))
        raise GitError(f"git {' '.join(args[:2])}: {last_words(err or out, retcode)}")
    return out


def identity(name: str) -> dict[str, str]:
    """The environment that makes `name <stella@localhost>` a commit's author and committer."""
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": "stella@localhost",
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": "stella@localhost",
    }


def git_fields(*args: str, cwd: Path | str, env: Mapping[str, str] | None = None) -> list[str]:
    """The fields of a `-z` listing (NUL-separated; empty fields dropped)."""
    return [field for field in git(*args, cwd=cwd, env=env).split("\0") if field]


def git_ok(*args: str, cwd: Path | str) -> bool:
    return git_status(*args, cwd=cwd)[0] == 0


def git_path(root: Path, *args: str) -> Path:
    """A path `git rev-parse` prints (relative ones are relative to root), made absolute."""
    path = Path(git("rev-parse", *args, cwd=root).strip())
    return path if path.is_absolute() else (root / path).resolve()


def repo_root(cwd: Path | str) -> Path:
    """The top of the work tree containing cwd; a clear error outside a repository."""
    if not Path(cwd).is_dir():
        raise StellaError(f"{cwd}: no such directory")
    try:
        out = git("rev-parse", "--show-toplevel", cwd=cwd)
    except GitError:
        raise StellaError(
            f"{Path(cwd).resolve()} is not inside a git repository: run stella in a repository "
            "(or create one with `git init` and make a first commit)"
        ) from None
    return Path(out.strip())


def common_dir(root: Path) -> Path:
    return git_path(root, "--git-common-dir")


def ref_commit(root: Path, ref: str) -> str | None:
    """The commit ref names, or None when it names none (a deleted branch, a typo)."""
    out = git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}", cwd=root, check=False).strip()
    return out or None


def branch_tips(root: Path, branches: Sequence[str]) -> dict[str, str]:
    """Each of branches that exists -> the commit it points at, in one git call."""
    if not branches:
        return {}
    refs = [f"refs/heads/{branch}" for branch in branches]
    listed = git("for-each-ref", "--format=%(refname) %(objectname)", *refs, cwd=root).splitlines()
    tips = dict(line.split(" ", 1) for line in listed)
    return {branch: tips[ref] for branch, ref in zip(branches, refs, strict=True) if ref in tips}


def has_commits(root: Path) -> bool:
    return ref_commit(root, "HEAD") is not None


def resolve_commit(root: Path, ref: str) -> str:
    """The full SHA of ref; a clear error when it names no commit."""
    sha = ref_commit(root, ref)
    if sha is None:
        raise StellaError(f"{ref!r} does not name a commit in {root}")
    return sha


def head_commit(root: Path) -> str:
    return git("rev-parse", "HEAD", cwd=root).strip()


def current_branch(root: Path) -> str | None:
    out = git("symbolic-ref", "-q", "--short", "HEAD", cwd=root, check=False).strip()
    return out or None


def head_detached(root: Path, git_dir: Path) -> bool:
    """Whether root's HEAD is detached, from git_dir's HEAD file when it can (called under index.lock)."""
    try:
        text = (git_dir / "HEAD").read_text().strip()
    except OSError:
        text = ""
    if text.startswith("ref: "):
        return False
    if is_object_id(text):
        return True
    return current_branch(root) is None


def refuse_detached_head(root: Path, *, allowed: bool = False) -> None:
    """StellaError when HEAD is detached (unless allowed: --allow-detached), for a shared-tree commit."""
    if allowed or current_branch(root) is not None:
        return
    at = git("rev-parse", "--short=12", "HEAD", cwd=root, check=False).strip() or "?"
    raise StellaError(
        f"HEAD is detached (at {at}): this shared-tree commit would go onto it, where only the reflog "
        "keeps it once a branch is checked out; check out a branch again (`git switch -` goes back to "
        "it) and commit again, or start the run with --allow-detached to commit onto a detached HEAD",
        exit_code=1,
    )


def branch_exists(root: Path, branch: str) -> bool:
    return git_ok("show-ref", "--verify", "-q", f"refs/heads/{branch}", cwd=root)


def ensure_excluded(root: Path, patterns: Sequence[str]) -> list[str]:
    """Add patterns to .git/info/exclude (never a tracked file); returns those added."""
    exclude = common_dir(root) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text().splitlines() if exclude.exists() else []
    missing = [p for p in patterns if p not in existing]
    if missing:
        with exclude.open("a") as fh:
            if existing and existing[-1] != "":
                fh.write("\n")
            fh.write("# stella fleet state\n" if "# stella fleet state" not in existing else "")
            fh.write("".join(f"{p}\n" for p in missing))
    return missing


def status_porcelain(path: Path, *, untracked: str = "normal") -> list[str]:
    """`git status --porcelain` lines for a work tree (empty when clean)."""
    out = git("status", "--porcelain", f"--untracked-files={untracked}", cwd=path)
    return [line for line in out.splitlines() if line]


def changed_paths(path: Path) -> list[str]:
    """Every file that differs from HEAD in a work tree (both sides of a rename), relative to it."""
    paths: list[str] = []
    rest = iter(git_fields("status", "--porcelain", "-z", "--untracked-files=all", cwd=path))
    for entry in rest:
        paths.append(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:
            paths.append(next(rest, ""))  # a rename's or copy's source follows as its own field
    return [p for p in dict.fromkeys(paths) if p]


def unresolved_merge(root: Path) -> tuple[bool, list[str]]:
    """(a merge is in progress: MERGE_HEAD exists, the paths with unresolved conflicts) of root's tree."""
    merging = git_path(root, "--git-path", "MERGE_HEAD").exists()
    return merging, conflicted_paths(root)


def conflicted_paths(root: Path) -> list[str]:
    """The paths with unresolved conflicts in root's index, unquoted (`-z`)."""
    return git_fields("diff", "--name-only", "-z", "--diff-filter=U", cwd=root)


def _git_processes() -> list[int]:
    """The pids of running git processes (Linux: read from /proc, the fast way; elsewhere psutil)."""
    if not os.path.isdir("/proc/self"):
        import psutil

        return [p.pid for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("git")]
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry.name}/comm", "rb") as fh:
                if fh.read(3) == b"git":
                    found.append(int(entry.name))
    return found


def git_processes_in(root: Path, *, started_before: float) -> list[psutil.Process]:
    """The git processes working in root's work tree that may have started before a time (time.time())."""
    import psutil

    from stellafleet.proc.pids import started_after

    top = str(root.resolve())
    found: list[psutil.Process] = []
    for pid in _git_processes():
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(pid)
            if started_after(proc.create_time(), started_before):
                continue
            if f"{proc.cwd()}{os.sep}".startswith(top + os.sep):  # root or below it
                found.append(proc)
    return found


def users_commits(root: Path) -> list[psutil.Process]:
    """The `git commit`s running in root's work tree (a shared worker's git refuses commit: the user's)."""
    import psutil

    found = []
    for proc in git_processes_in(root, started_before=float("inf")):
        with contextlib.suppress(psutil.Error):
            words = [arg for arg in proc.cmdline()[1:] if not arg.startswith("-")]
            if words[:1] == ["commit"]:
                found.append(proc)
    return found


def branch_delete(root: Path, branch: str) -> None:
    """Delete branch, merged or not (callers decide what may go)."""
    git("branch", "-D", branch, cwd=root)


def is_ancestor(root: Path, commit: str, of: str) -> bool:
    return git_ok("merge-base", "--is-ancestor", commit, of, cwd=root)


class CommitInfo(NamedTuple):  # a tuple: as ledger.commits.record takes each commit
    sha: str
    message: str
    committed_at_ms: int


def commits_between(root: Path, base: str, tip: str) -> list[CommitInfo]:
    records = git_fields("log", "-z", "--reverse", "--format=%H%x1f%ct%x1f%s", f"{base}..{tip}", cwd=root)
    fields = [record.split("\x1f", 2) for record in records]
    return [CommitInfo(sha, subject, int(ctime) * 1000) for sha, ctime, subject in fields]


def files_of_commits(root: Path, shas: Sequence[str]) -> list[str]:
    """The files those commits change (each against its first parent; a rename as both its paths)."""
    if not shas:
        return []
    listed = git_fields(
        "log", "--no-walk=unsorted", "-z", "--name-only", "--no-renames", "--format=", *shas, cwd=root
    )
    return list(dict.fromkeys(listed))


def commit_subject(root: Path, sha: str) -> str | None:
    """The subject line of commit sha in root's repository (None: no such commit)."""
    retcode, out, _ = git_status("log", "-1", "--format=%s", f"{sha}^{{commit}}", "--", cwd=root)
    return out.strip() if retcode == 0 else None


def main_worktree_root(cwd: Path | str) -> Path:
    """The main working tree's root, even from inside a linked worktree (stella's state lives there)."""
    root = repo_root(cwd)
    common = common_dir(root)
    return common.parent if common.name == ".git" else root


def commits_ahead(root: Path, base: str, tip: str) -> int:
    return int(git("rev-list", "--count", f"{base}..{tip}", cwd=root).strip() or 0)


# Pushing must never wait for a password or a host-key question: it fails instead, with git's words.
_NON_INTERACTIVE_ENV = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never"}


def remote_branch_exists(root: Path, remote: str, branch: str) -> bool | None:
    """Whether remote has branch now (None: the remote could not be asked)."""
    code, out, _err = git_status("ls-remote", "--heads", remote, f"refs/heads/{branch}", cwd=root)
    return None if code != 0 else bool(out.strip())


def remote_names(root: Path) -> list[str]:
    return [line.strip() for line in git("remote", cwd=root).splitlines() if line.strip()]


def remote_url(root: Path, remote: str) -> str | None:
    retcode, out, _ = git_status("remote", "get-url", remote, cwd=root)
    return out.strip() if retcode == 0 and out.strip() else None


def default_branch(root: Path, remote: str) -> str | None:
    """The remote's default branch (what its HEAD points at), or None when it cannot be told."""
    out = git("symbolic-ref", "-q", "--short", f"refs/remotes/{remote}/HEAD", cwd=root, check=False).strip()
    if out.startswith(f"{remote}/"):
        return out[len(remote) + 1 :]
    retcode, stdout, _ = git_status("ls-remote", "--symref", remote, "HEAD", cwd=root, env=_push_env())
    if retcode == 0:
        for line in stdout.splitlines():
            if line.startswith("ref: refs/heads/") and line.endswith("\tHEAD"):
                return line[len("ref: refs/heads/") : -len("\tHEAD")]
    return None


def _push_env() -> dict[str, str]:
    env = dict(_NON_INTERACTIVE_ENV)
    if not os.environ.get("GIT_SSH_COMMAND") and not os.environ.get("GIT_SSH"):
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    return env


def push(root: Path, remote: str, branch: str, *, force: bool = False) -> None:
    """Push branch to the same name on remote, without prompting; GitError with the remote's reason."""
    refspec = f"refs/heads/{branch}:refs/heads/{branch}"
    args = ["push", "--porcelain", *(["--force"] if force else []), remote, refspec]
    retcode, out, err = git_status(*args, cwd=root, env=_push_env())
    flag, summary = "", ""  # git's porcelain flag ("!": rejected) and summary of the branch's update
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1].endswith(f":refs/heads/{branch}"):
            flag, summary = parts[0], parts[2]
    if retcode == 0 and flag != "!":
        return
    # The remote's own words ("remote: ..." lines from a hook) say why; keep them with git's summary.
    err_lines = [line.strip() for line in err.splitlines() if line.strip()]
    remote_lines = [line[len("remote:") :].strip() for line in err_lines if line.startswith("remote:")]
    remote_lines = [line for line in remote_lines if line]
    other = [line for line in err_lines if not line.startswith("remote:")]
    if not summary and not remote_lines:
        # The remote was never reached: git's first fatal line says why.
        fatal = [line for line in other if line.startswith(("fatal:", "error:"))]
        reason = (fatal or other or [f"exit status {retcode}"])[0]
        raise GitError(f"push of {branch} to {remote} failed: {reason}")
    reason = summary or (other[-1] if other else f"exit status {retcode}")
    if remote_lines:
        reason += " — remote says: " + " / ".join(remote_lines[-3:])
    raise GitError(f"push of {branch} to {remote} was rejected: {reason}")


def ls_files(root: Path, pathspecs: Sequence[str] = ()) -> list[str]:
    """Tracked files and untracked, not ignored ones matching pathspecs, relative to root."""
    args = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    return git_fields(*args, "--", *pathspecs, cwd=root)


def grep(
    root: Path,
    pattern: str,
    pathspecs: Sequence[str] = (),
    *,
    ignore_case: bool = False,
    fixed: bool = False,
) -> str:
    """`git grep -n` output (path:line:text) for an extended regex; empty when nothing matches."""
    args = ["grep", "-n", "-I", "--no-color", "--full-name", "--untracked", "-F" if fixed else "-E"]
    if ignore_case:
        args.append("-i")
    retcode, out, err = git_status(*args, "-e", pattern, "--", *pathspecs, cwd=root)
    if retcode == 1 and not err.strip():
        return ""
    if retcode != 0:
        raise GitError(f"git grep: {last_words(err, retcode)}")
    return out


def diff(root: Path, paths: Sequence[str] = (), *, staged: bool = False) -> str:
    cached = ["--cached"] if staged else []
    return git("diff", "--no-color", "--no-ext-diff", *cached, "--", *paths, cwd=root)


def head_from_files(git_dir: Path) -> str | None:
    """HEAD's commit read straight from the ref files, or None when that is unsafe (then ask git)."""
    try:
        text = (git_dir / "HEAD").read_text().strip()
        if not text.startswith("ref: "):
            sha = text
        else:
            common = git_dir
            if (git_dir / "commondir").exists():
                common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
            if (common / "reftable").exists():
                return None
            sha = (common / text[len("ref: ") :].strip()).read_text().strip()
    except OSError:
        return None
    return sha if is_object_id(sha) else None


def is_object_id(text: str) -> bool:
    """Whether text is a full object id as git writes it (SHA-1 or SHA-256, lowercase hex)."""
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)
