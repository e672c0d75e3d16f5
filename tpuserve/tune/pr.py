"""`--pr`: commit the overlay on a new branch and open a pull request with `gh` when it is on
PATH; otherwise print the commands that would do it. The overlay's work tree is checked before
the search starts (`check`), and a failed step switches the repository back to the branch it
was on."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tpuserve.ops_error import EXIT_USAGE, OpsError

CALL_TIMEOUT_S = 120.0


def commands(files: list[str], report: Path, branch: str, title: str,
             back: list[str] | None = None) -> list[list[str]]:
    """The steps, run in the repository's root: FILES are relative to it."""
    return [
        ["git", "switch", "-c", branch],
        ["git", "add", "--", *files],
        ["git", "commit", "-m", title, "--", *files],
        ["git", "push", "-u", "origin", branch],
        ["gh", "pr", "create", "--head", branch, "--title", title, "--body-file", str(report)],
        back or ["git", "switch", "-"],
    ]


def _existing(path: Path) -> Path:
    """PATH's nearest existing ancestor directory (the overlay and its folder may not exist
    before the search writes them)."""
    p = path.absolute().parent
    while not p.is_dir() and p != p.parent:
        p = p.parent
    return p


def _git(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpsError(f"--pr: git is not usable ({exc})", exit_code=EXIT_USAGE) from None


def repo_root(path: Path, flag: str = "--write") -> Path:
    """The git work tree that will hold PATH; OpsError (exit 2) when there is none."""
    done = _git(_existing(path), "rev-parse", "--show-toplevel")
    if done.returncode != 0 or not done.stdout.strip():
        raise OpsError(f"--pr: {flag} {path}: the overlay would not be inside a git work tree, "
                       "so it could not be committed; give --write a path in your repository",
                       exit_code=EXIT_USAGE)
    return Path(done.stdout.strip())


def _relative(path: Path, root: Path) -> str:
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root))


def _back(root: Path) -> tuple[list[str], str]:
    """The command that puts the repository back where it is now, and its words."""
    branch = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    if branch.returncode == 0 and branch.stdout.strip():
        name = branch.stdout.strip()
        return ["git", "switch", name], name
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    return ["git", "switch", "--detach", head], f"commit {head[:12]}"


def open_pr(files: list[Path], report: Path, branch: str, title: str,
            log: Callable[[str], None]) -> bool:
    """Run the commands in the files' repository (True), or print them when gh is missing."""
    root = repo_root(files[0])
    back, where = _back(root)
    cmds = commands([_relative(f, root) for f in files], report.absolute(), branch, title,
                    back)
    if shutil.which("gh") is None:
        log("gh is not on PATH; to open the pull request run, in " + str(root) + ":")
        for c in cmds:
            log("  " + shlex.join(c))
        return False
    switched = False
    for c in cmds:
        why, out = _run(c, root)
        if why is not None:
            if switched and c is not back:
                again = _run(back, root)[0]
                why += (f"; switched the repository back to {where}" if again is None else
                        f"; switching back to {where} failed too ({again})")
            raise OpsError(f"--pr: `{shlex.join(c)}` {why}")
        switched = switched or c is cmds[0]
        if c[0] == "gh" and out:
            log(f"pull request: {out}")
    return True


def _run(c: list[str], root: Path) -> tuple[str | None, str]:
    """Run C in ROOT: (None, its output) when it succeeded, else why it did not (one line)."""
    try:
        done = subprocess.run(c, cwd=root, capture_output=True, text=True,
                              timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed ({exc})", ""
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[:300]
        return f"exited {done.returncode}: {said}", ""
    return None, done.stdout.strip()
