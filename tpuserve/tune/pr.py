"""`--pr`: commit the overlay and the report on a new branch and open a pull request with `gh`
when it is on PATH; otherwise print the commands that would do it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tpuserve.ops_error import EXIT_USAGE, OpsError

CALL_TIMEOUT_S = 120.0


def commands(files: list[Path], report: Path, branch: str, title: str) -> list[list[str]]:
    return [
        ["git", "switch", "-c", branch],
        ["git", "add", "--", *map(str, files)],
        ["git", "commit", "-m", title, "--", *map(str, files)],
        ["git", "push", "-u", "origin", branch],
        ["gh", "pr", "create", "--head", branch, "--title", title, "--body-file", str(report)],
        ["git", "switch", "-"],
    ]


def repo_root(path: Path) -> Path:
    """The git work tree holding PATH; OpsError (exit 2) when there is none."""
    try:
        done = subprocess.run(["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpsError(f"--pr: git is not usable ({exc})", exit_code=EXIT_USAGE) from None
    if done.returncode != 0:
        raise OpsError(f"--pr: {path} is not inside a git work tree; give --write a path in "
                       "your repository", exit_code=EXIT_USAGE)
    return Path(done.stdout.strip())


def open_pr(files: list[Path], report: Path, branch: str, title: str,
            log: Callable[[str], None]) -> bool:
    """Run the commands in the files' repository (True), or print them when gh is missing."""
    root = repo_root(files[0])
    cmds = commands(files, report, branch, title)
    if shutil.which("gh") is None:
        log("gh is not on PATH; to open the pull request run, in " + str(root) + ":")
        for c in cmds:
            log("  " + shlex.join(c))
        return False
    for c in cmds:
        try:
            done = subprocess.run(c, cwd=root, capture_output=True, text=True,
                                  timeout=CALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OpsError(f"--pr: `{shlex.join(c)}` failed ({exc})") from None
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout).split())[:300]
            raise OpsError(f"--pr: `{shlex.join(c)}` exited {done.returncode}: {why}")
        if c[0] == "gh" and done.stdout.strip():
            log(f"pull request: {done.stdout.strip()}")
    return True
