"""The lean provider import and the ordinary one synthesize identical JSON."""

from __future__ import annotations

import json
import sys

from tpuserve.paths import REPO_ROOT

ROOT = REPO_ROOT


def test_lean_import_is_in_use() -> None:
    from stacks import cdk

    assert cdk.IMPORT_MODE == "lean"
    pkg = sys.modules["cdktf_cdktf_provider_google_beta"]
    assert not hasattr(pkg, "google_workflows_workflow")  # the other ~1,600 stayed unloaded


def test_full_import_synthesizes_identical_json(synthesized, full_import_synth) -> None:
    figures, outdir = full_import_synth  # started in the background (conftest.py)
    assert figures["mode"] == "full"
    full = {p.name: json.loads((p / "cdk.tf.json").read_text())
            for p in (outdir / "stacks").iterdir()}
    assert full == synthesized
