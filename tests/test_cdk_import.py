"""The lean provider import and the ordinary one synthesize identical JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_lean_import_is_in_use() -> None:
    from stacks import cdk

    assert cdk.IMPORT_MODE == "lean"
    pkg = sys.modules["cdktf_cdktf_provider_google_beta"]
    assert not hasattr(pkg, "google_workflows_workflow")  # the other ~1,600 stayed unloaded


def test_full_import_synthesizes_identical_json(synthesized, tmp_path: Path) -> None:
    env = {**os.environ, "TPUSERVE_CDK_IMPORT": "full"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "synth"), "--once", "full", str(tmp_path)],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )
    assert json.loads(proc.stdout.splitlines()[-1])["mode"] == "full"
    full = {p.name: json.loads((p / "cdk.tf.json").read_text())
            for p in (tmp_path / "stacks").iterdir()}
    assert full == synthesized
