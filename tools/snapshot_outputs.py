"""Save every user-visible output of one checkout, to diff two revisions byte for byte.

    .venv/bin/python tools/snapshot_outputs.py OUT_DIR [--review BASE HEAD] [--repo DIR]

Runs only the project's public entry points (main.py as cdktf runs it, `python -m tpuserve`),
so the same script snapshots an old and a new revision alike:

  OUT_DIR/<config>/<stack>.tf.json       the synthesized Terraform of each stack
  OUT_DIR/<config>/<stack>.startup.sh    the boot script embedded in it (metadata or QR body)
  OUT_DIR/<config>/<stack>.nginx.conf    the proxy config embedded in that script
  OUT_DIR/<config>/plan.json             `tpuserve plan --json`
  OUT_DIR/review.json                    `tpuserve review --json BASE HEAD` (with --review)

<config> is `default` (the embedded config) and the non-default configs below. Compare two
snapshots with `diff -r OLD NEW`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Non-default configs chosen to reach the branches the default does not: an open API port with
# TLS off and no cache, a user network with the guard off and other vLLM flags, a longer flex
# run in another project and zone.
CONFIGS: dict[str, str] = {
    "open-no-cache": """
[access]
api_source_ranges = ["203.0.113.0/24"]
ssh_source_ranges = ["198.51.100.7/32"]
tls = "off"
[cache]
enabled = false
[vllm]
max_model_len = 16384
enable_prefix_caching = false
""",
    "own-network": """
[gcp]
project = "acme-serving-1"
network = "shared-vpc"
deployment = "acme"
[vllm]
tool_call_parser = ""
kv_cache_memory_bytes = 5923602432
image = "vllm/vllm-tpu@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
[vllm.env]
NUM_PRECOMPILE_WORKERS = 2
[stacks.spot]
max_run_hours = 0
[stacks.ondemand]
max_run_hours = 24
""",
    "long-flex": """
[gcp]
project = "other-proj-7"
zone = "us-central1-a"
subnet_cidr = "10.80.0.0/20"
[access]
api_key_proxy = false
[capacity]
expected_clients = 8
expected_context = 4096
[stacks.flex]
max_run_duration = "3d"
""",
}


def _startup_scripts(doc: dict[str, Any]) -> list[str]:
    """Every boot script in a synthesized stack: TPU VM metadata or a queued-resource body."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k == "startup-script" and isinstance(v, str):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(doc)
    return found


def _nginx_conf(script: str) -> str:
    """The value of the script's NGINX_CONF_TEXT= assignment, unquoted as bash would."""
    start = script.find("\nNGINX_CONF_TEXT=")
    if start < 0:
        return ""
    lexer = shlex.shlex(script[start + len("\nNGINX_CONF_TEXT="):], posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return lexer.get_token() or ""


def _env(repo: Path, config: Path | None, outdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TPUSERVE_") and k not in ("HF_TOKEN", "CDKTF_OUTDIR")}
    env["CDKTF_OUTDIR"] = str(outdir)
    env["PYTHONHASHSEED"] = "0"
    if config is not None:
        env["TPUSERVE_CONFIG"] = str(config)
    return env


def snapshot_config(repo: Path, python: str, name: str, config: Path | None, out: Path) -> None:
    dest = out / name
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        cdk_out = Path(tmp) / "cdktf.out"
        env = _env(repo, config, cdk_out)
        synth = subprocess.run([python, "main.py"], cwd=repo, env=env, capture_output=True,
                               text=True)
        (dest / "synth.stderr").write_text(synth.stderr)
        if synth.returncode:
            sys.exit(f"{name}: main.py exited {synth.returncode}:\n{synth.stderr}")
        for stack_dir in sorted((cdk_out / "stacks").iterdir()):
            text = (stack_dir / "cdk.tf.json").read_text()
            (dest / f"{stack_dir.name}.tf.json").write_text(text)
            scripts = _startup_scripts(json.loads(text))
            for i, script in enumerate(scripts):
                suffix = "" if i == 0 else f".{i}"
                (dest / f"{stack_dir.name}{suffix}.startup.sh").write_text(script)
                (dest / f"{stack_dir.name}{suffix}.nginx.conf").write_text(_nginx_conf(script))
        plan = subprocess.run([python, "-m", "tpuserve", "plan", "--json"], cwd=repo, env=env,
                              capture_output=True, text=True)
        (dest / "plan.json").write_text(plan.stdout + (f"\n# exit {plan.returncode}\n"
                                                       + plan.stderr if plan.returncode else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    parser.add_argument("--review", nargs=2, metavar=("BASE", "HEAD"))
    args = parser.parse_args()
    repo: Path = args.repo.resolve()
    python = str(repo / ".venv" / "bin" / "python")
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    configs = out / "configs"
    configs.mkdir()
    snapshot_config(repo, python, "default", None, out)
    for name, text in CONFIGS.items():
        path = configs / f"{name}.toml"
        path.write_text(text)
        snapshot_config(repo, python, name, path, out)
    if args.review:
        base, head = args.review
        env = _env(repo, None, out / "unused")
        result = subprocess.run([python, "-m", "tpuserve", "review", "--json", base, head],
                                cwd=repo, env=env, capture_output=True, text=True)
        (out / "review.json").write_text(result.stdout + (
            f"\n# exit {result.returncode}\n" + result.stderr if result.returncode else ""))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
