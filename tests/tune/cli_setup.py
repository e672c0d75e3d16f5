"""What the CLI tests of `tpuserve tune` share: a user's config with a small [tune] table, the
toy node in place of the TPU-API one, and a git repository with a bare origin for --pr."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.tune.toy_node import ToyNode, base_values
from tpuserve.settings import load
from tpuserve.tune.candidates import sets_for

# 2 x 2 x 2 candidates: batched tokens, workers, memory (0.93 untested, SPEC 4's ceiling 0.92).
TUNE = """
[tune]
max_num_batched_tokens = [4096, 8192]
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1, 4]
gpu_memory_utilization = [0.92, 0.93]
"""


def toy_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str = TUNE,
            ) -> dict[str, Any]:
    """TEXT as the user's config (TPUSERVE_CONFIG), the CLI's node a toy (seed 2), the working
    directory TMP_PATH."""
    cfg = tmp_path / "mine.toml"
    cfg.write_text(text)
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    box: dict[str, Any] = {"node": ToyNode(2, sets_for(d), base_values(d))}
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: box["node"])
    monkeypatch.chdir(tmp_path)
    return {"env": env, "cfg": cfg, "box": box, "node": box["node"], "tmp": tmp_path,
            "state": tmp_path / ".tpuserve" / "tune-flex.json"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def git_repo(tmp_path: Path) -> Path:
    """A work tree on `main` with one commit and a bare `origin` beside it (nothing leaves
    TMP_PATH)."""
    origin, work = tmp_path / "origin.git", tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    for k, v in (("user.name", "t"), ("user.email", "t@example.invalid")):
        git(work, "config", k, v)
    (work / "README").write_text("x\n")
    git(work, "add", "README")
    git(work, "commit", "-qm", "init")
    git(work, "remote", "add", "origin", str(origin))
    return work
