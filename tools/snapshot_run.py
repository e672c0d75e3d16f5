"""How tools/snapshot_outputs.py runs the checkout under test: a clean environment, a
bounded run, and the text it records of one command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def child_env(repo: Path, config: Path | None, outdir: Path) -> dict[str, str]:
    # Nothing of the caller's shell that the CLI reads: no TPUSERVE_*, no credentials or
    # endpoint overrides, a fixed terminal width (rich wraps help and tables to it), UTC.
    drop = ("HF_TOKEN", "CDKTF_OUTDIR", "OPENAI_API_KEY", "KUBECONFIG", "COLUMNS", "LINES",
            "NO_COLOR", "FORCE_COLOR", "TERM", "PYTHONPATH", "PYTHONSTARTUP", "TZ")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TPUSERVE_", "CLOUDSDK_", "GOOGLE_", "_TYPER", "TYPER_"))
           and k not in drop}
    env["CDKTF_OUTDIR"] = str(outdir)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = str(repo)  # the checkout under test, never the venv's editable install
    env["COLUMNS"], env["TERM"], env["TZ"] = "100", "dumb", "UTC"
    env["NO_COLOR"] = "1"
    if config is not None:
        env["TPUSERVE_CONFIG"] = str(config)
    return env


def execute(argv: list[str], repo: Path, env: dict[str, str],
          timeout: float) -> subprocess.CompletedProcess[str]:
    """The command's result; one that outlives TIMEOUT is killed and reads as exit 124 (as
    timeout(1) says), so a hang in the revision under test is a difference, not a hung tool."""
    try:
        return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        def text(part: str | bytes | None) -> str:
            return part.decode(errors="replace") if isinstance(part, bytes) else part or ""

        return subprocess.CompletedProcess(argv, 124, text(e.stdout),
                                           text(e.stderr) + f"\n# timed out after {timeout} s\n")


def run_text(argv: list[str], repo: Path, env: dict[str, str], timeout: float = 600) -> str:
    """stdout, then `# exit N` and stderr when the command failed."""
    r = execute(argv, repo, env, timeout)
    text = r.stdout + (f"\n# exit {r.returncode}\n{r.stderr}" if r.returncode else "")
    return text.replace(str(repo), "<REPO>")
