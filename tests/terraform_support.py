"""Real Terraform on built-in outputs: what Terraform makes of a string (escape-pass tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

TERRAFORM = shutil.which("terraform")


def apply_outputs(outputs: dict[str, str], workdir: Path) -> dict[str, str]:
    """Each value as a Terraform output, applied once: {name: what Terraform made of it}."""
    (workdir / "main.tf.json").write_text(json.dumps(
        {"output": {name: {"value": value} for name, value in outputs.items()}}))
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    env.pop("TF_CLI_CONFIG_FILE", None)
    run = {"cwd": workdir, "env": env, "capture_output": True, "text": True, "check": True}
    subprocess.run([TERRAFORM, "init", "-input=false", "-no-color"], **run)
    subprocess.run([TERRAFORM, "apply", "-auto-approve", "-input=false", "-no-color"], **run)
    got = json.loads(subprocess.run([TERRAFORM, "output", "-json"], **run).stdout)
    return {name: v["value"] for name, v in got.items()}
