"""`tune --pr`: the overlay committed by its path relative to the repository's root (from a
subdirectory too), and a failed step switching the repository back to the branch it was on.
A fake `gh`; pushes go only to a local bare repository."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import assert_one_line_error, invoke
from tests.tune.cli_setup import git, git_repo
from tests.tune.toy_node import ToyNode, base_values
from tpuserve.settings import load
from tpuserve.tune.candidates import sets_for

TUNE = """
[tune]
max_num_batched_tokens = [4096]
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1, 4]
gpu_memory_utilization = [0.93]
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    work = git_repo(tmp_path)
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TUNE)
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    node = ToyNode(2, sets_for(d), base_values(d))
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: node)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text("#!/bin/sh\necho https://github.invalid/o/r/pull/1\n")
    (bin_dir / "gh").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    sub = work / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    return {"work": work, "env": env}


def _tune(repo: dict[str, Any]) -> Any:
    return invoke("tune", "flex", "--contexts", "1024", "--clients", "1", "--yes", "--pr",
                  "--write", "o.toml", "--out", "out", env=repo["env"])


def test_pr_from_a_subdirectory_commits_the_overlay_by_its_path_in_the_repo(
        repo: dict[str, Any]) -> None:
    r = _tune(repo)
    assert r.exit_code == 0, r.stderr
    branch = next(b.strip() for b in git(repo["work"], "branch", "--list").splitlines()
                  if "tune-flex-" in b)
    assert "sub/o.toml" in git(repo["work"], "show", "--name-only", "--format=", branch)
    assert git(repo["work"], "branch", "--show-current").strip() == "main"


def test_a_failed_commit_switches_the_repository_back(repo: dict[str, Any]) -> None:
    hook = repo["work"] / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho refused by the hook >&2\nexit 1\n")
    hook.chmod(0o755)
    r = _tune(repo)
    assert r.exit_code == 1, r.stderr
    assert_one_line_error(r, "git commit", "refused by the hook",
                          "switched the repository back to main")
    assert git(repo["work"], "branch", "--show-current").strip() == "main"
