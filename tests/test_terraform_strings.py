"""Real Terraform reads the synthesized startup script back byte for byte.

Terraform interpolates `${...}` and `%{...}` in every string of a .tf.json file; a bash
script is full of them. Terraform itself (no provider needed) evaluates the synthesized value
here and must give back exactly the rendered script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tpuserve.startup import render_startup

TERRAFORM = shutil.which("terraform")


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
@pytest.mark.parametrize("stack", ["spot", "ondemand"])
def test_terraform_evaluates_the_script_to_the_rendered_text(
    synthesized, deployments, tmp_path: Path, stack: str
) -> None:
    vm = synthesized[stack]["resource"]["google_tpu_v2_vm"]["tpu_node"]
    value = vm["metadata"]["startup-script"]
    (tmp_path / "main.tf.json").write_text(json.dumps({"output": {"script": {"value": value}}}))
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    env.pop("TF_CLI_CONFIG_FILE", None)
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "check": True}
    subprocess.run([TERRAFORM, "init", "-input=false", "-no-color"], **run)
    subprocess.run([TERRAFORM, "apply", "-auto-approve", "-input=false", "-no-color"], **run)
    out = subprocess.run([TERRAFORM, "output", "-json", "script"], **run).stdout
    assert json.loads(out) == render_startup(deployments[stack])
