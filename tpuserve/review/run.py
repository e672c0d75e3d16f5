"""`review()`: check out both revisions, synthesize them side by side, read their configs,
and compare. The I/O around the pure `build_review`."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .compare import build_review
from .config_facts import config_environ, config_facts
from .model import Review
from .revision_facts import RevisionFacts
from .revisions import WORKING_TREE, checkout, project_location, resolve_commit
from .synthesis import read_synthesis, synthesize


def review(
    base: str,
    head: str | None = None,
    *,
    project_dir: Path | None = None,
    config: Path | None = None,
    attachments: Sequence[tuple[str, str]] = (),
    head_synthesis: Path | None = None,
) -> Review:
    """Review BASE against HEAD (a commit, or None for the working tree) of the project.

    `head_synthesis`: a cdktf output directory to use as HEAD's Terraform instead of running
    HEAD's main.py here (the PR workflow synthesizes the PR in a job of its own, so the job
    that writes the review runs no PR code).
    """
    project = (project_dir or Path.cwd()).resolve()
    top, prefix = project_location(project)
    revisions = [(base, resolve_commit(top, base))]
    revisions.append((WORKING_TREE, None) if head is None else (head, resolve_commit(top, head)))
    workdir = Path(tempfile.mkdtemp(prefix="tpuserve-review-"))
    try:
        with contextlib.ExitStack() as stack:
            trees = []
            for i, (_, commit) in enumerate(revisions):
                if commit is None:
                    trees.append(project)
                else:
                    tree = stack.enter_context(checkout(top, commit, workdir, f"tree{i}"))
                    trees.append(tree / prefix)
            with ThreadPoolExecutor(max_workers=2) as pool:  # the two synths run side by side
                futures = [pool.submit(synthesize, tree, workdir / f"out{i}", config=config)
                           for i, tree in enumerate(trees)
                           if i == 0 or head_synthesis is None]
                syntheses = [f.result() for f in futures]
            if head_synthesis is not None:
                syntheses.append(read_synthesis(head_synthesis))
            env = config_environ(config)
            facts = [
                RevisionFacts(label, commit, synthesis, config_facts(tree, env))
                for (label, commit), tree, synthesis in zip(revisions, trees, syntheses,
                                                            strict=True)
            ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return build_review(facts[0], facts[1], attachments)
