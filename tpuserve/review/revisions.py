"""The git side of a review: where the project is, which commit a revision names, and a
detached worktree of it for as long as the review needs one."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

WORKING_TREE = "working tree"


class ReviewError(Exception):
    """A review that cannot start (bad revision, not a git repository): one line."""


def _git(cwd: Path, *args: str) -> str:
    # Hooks off: a review must not run code from the repository's hooks.
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise ReviewError(f"git {' '.join(args)}: {detail}")
    return proc.stdout.strip()


def project_location(project_dir: Path) -> tuple[Path, str]:
    """(repository top level, the project's path inside it, '' at the top)."""
    if not (project_dir / "main.py").is_file():
        raise ReviewError(f"{project_dir}: no main.py here; run review in the project directory "
                          "or pass --repo")
    top = Path(_git(project_dir, "rev-parse", "--show-toplevel"))
    prefix = _git(project_dir, "rev-parse", "--show-prefix")
    return top, prefix


def resolve_commit(top: Path, rev: str) -> str:
    try:
        return _git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ReviewError:
        raise ReviewError(f"{rev!r} is not a commit in {top} (fetch it first: "
                          f"git fetch origin {rev})") from None


@contextlib.contextmanager
def checkout(top: Path, commit: str, workdir: Path, name: str) -> Iterator[Path]:
    """A detached git worktree of `commit` at workdir/name, removed afterwards."""
    path = workdir / name
    _git(top, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        with contextlib.suppress(ReviewError):
            _git(top, "worktree", "remove", "--force", str(path))
        with contextlib.suppress(ReviewError):
            _git(top, "worktree", "prune")
