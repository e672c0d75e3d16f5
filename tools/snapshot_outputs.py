"""Save every user-visible output of one checkout, to diff two revisions byte for byte.

    .venv/bin/python tools/snapshot_outputs.py OUT_DIR [--review BASE HEAD] [--repo DIR]

Runs only the project's public entry points (main.py as cdktf runs it, `python -m tpuserve`),
so the same script snapshots an old and a new revision alike:

  OUT_DIR/<config>/<stack>.tf.json       the synthesized Terraform of each stack
  OUT_DIR/<config>/<stack>.startup.sh    the boot script embedded in it (metadata or QR body)
  OUT_DIR/<config>/<stack>.nginx.conf    the proxy config embedded in that script
  OUT_DIR/<config>/fleet.k8s-bundle.yaml the fleet's Kubernetes bundle (terraform_data inputs)
  OUT_DIR/<config>/synth.stderr          synth's warnings
  OUT_DIR/<config>/plan.json             `tpuserve plan --json` (its default stack)
  OUT_DIR/<config>/plan.<stack>.json     `tpuserve plan --json --stack STACK`, every stack
  OUT_DIR/status/<scenario>.*            `tpuserve status [STACK] [--json]` against the fakes
  OUT_DIR/help/<command>.txt             `tpuserve [COMMAND] --help`
  OUT_DIR/review.json, review.md         `tpuserve review [--json] BASE HEAD` (with --review)

<config> is `default` (the embedded config) and the non-default configs below. Every output
that exits non-zero ends with `# exit N` and its stderr. Compare two snapshots with
`diff -r OLD NEW`.

The fakes (tests/fakes/) are imported from THIS script's checkout, not from --repo: they are
the test bench, not the code under test. Status runs see a frozen clock (a sitecustomize.py
that fixes time.time and datetime.now; the fakes' createTime and guest attributes are fixed
too). The only normalization: the fakes' ephemeral loopback ports are written as <PORT:name>
the temp directory of a run as <TMP>, and the --repo path as <REPO> (in a warning's traceback
line).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from snapshot_run import child_env, execute, run_text
from snapshot_status import FLEET_IMAGE, snapshot_status

_PICKER = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0@sha256:" + "cd" * 32
_ADAPTER = ("gcr.io/gke-release/custom-metrics-stackdriver-adapter:v0.16.9-gke.0@sha256:"
            + "ef" * 32)
# Non-default configs chosen to reach the branches the default does not: an open API port with
# TLS off and no cache, a user network with the guard off and other vLLM flags, the fleet's own
# settings moved, a second deployment, a longer flex run in another project and zone.
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
    # The fleet's own settings moved off their defaults (pools, scaling, CIDRs, a domain,
    # pinned picker and adapter images), so the bundle and the cluster render other values.
    "fleet-tuned": f"""
[fleet]
min_replicas = 2
max_replicas = 6
provisioning = ["spot"]
queue_target = 4
scale_up_period_s = 1200
scale_down_window_s = 1800
pods_cidr = "10.112.0.0/14"
services_cidr = "10.116.0.0/20"
proxy_only_cidr = "10.130.0.0/23"
system_machine_type = "e2-standard-8"
release_channel = "STABLE"
domain = "llm.example.com"
picker_image = "{_PICKER}"
adapter_image = "{_ADAPTER}"
[stacks.fleet.vllm]
image = "{FLEET_IMAGE}"
max_model_len = 8192
""",
    # A second deployment beside the first: every name, the base and the project differ.
    "second-deployment": """
[gcp]
project = "team-b-serving"
deployment = "tpuserve-b"
subnet_cidr = "10.72.0.0/20"
[monitoring]
email = "oncall@example.com"
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


def _k8s_bundles(doc: dict[str, Any]) -> dict[str, str]:
    """{terraform_data name: its input.bundle}: the YAML the fleet's apply step is given."""
    found: dict[str, str] = {}
    for name, res in sorted(doc.get("resource", {}).get("terraform_data", {}).items()):
        bundle = res.get("input", {}).get("bundle") if isinstance(res, dict) else None
        if isinstance(bundle, str):
            found[name] = bundle
    return found


def snapshot_config(repo: Path, python: str, name: str, config: Path | None, out: Path) -> None:
    dest = out / name
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        cdk_out = Path(tmp) / "cdktf.out"
        env = child_env(repo, config, cdk_out)
        synth = execute([python, "main.py"], repo, env, 600)
        failed = f"# exit {synth.returncode}\n" if synth.returncode else ""
        (dest / "synth.stderr").write_text(
            failed + synth.stderr.replace(tmp, "<TMP>").replace(str(repo), "<REPO>"))
        if synth.returncode:  # recorded (a difference to see), and the rest still snapshotted
            print(f"{name}: main.py exited {synth.returncode}", file=sys.stderr)
        stacks = []
        stacks_dir = cdk_out / "stacks"
        for stack_dir in sorted(stacks_dir.iterdir() if stacks_dir.is_dir() else []):
            stacks.append(stack_dir.name)
            text = (stack_dir / "cdk.tf.json").read_text()
            (dest / f"{stack_dir.name}.tf.json").write_text(text)
            doc = json.loads(text)
            scripts = _startup_scripts(doc)
            for i, script in enumerate(scripts):
                suffix = "" if i == 0 else f".{i}"
                (dest / f"{stack_dir.name}{suffix}.startup.sh").write_text(script)
                (dest / f"{stack_dir.name}{suffix}.nginx.conf").write_text(_nginx_conf(script))
            bundles = _k8s_bundles(doc)
            if bundles:
                # k8s_bundle (applied) and k8s_teardown (deleted) hold the same text today;
                # saved once, with a note when they differ.
                first = next(iter(bundles.values()))
                (dest / f"{stack_dir.name}.k8s-bundle.yaml").write_text(first)
                for res, text_b in bundles.items():
                    if text_b != first:
                        (dest / f"{stack_dir.name}.{res}.k8s-bundle.yaml").write_text(text_b)
        (dest / "plan.json").write_text(run_text([python, "-m", "tpuserve", "plan", "--json"],
                                             repo, env))
        for stack in stacks:
            if stack == "base":
                continue
            (dest / f"plan.{stack}.json").write_text(
                run_text([python, "-m", "tpuserve", "plan", "--json", "--stack", stack], repo, env))


# ------------------------------------------------------------------------------- help texts

COMMANDS = ("status", "wait", "endpoint", "smoke", "bench", "rotate-key", "recover", "plan",
            "review")


def snapshot_help(repo: Path, python: str, out: Path) -> None:
    dest = out / "help"
    dest.mkdir()
    env = child_env(repo, None, out / "unused")
    (dest / "tpuserve.txt").write_text(run_text([python, "-m", "tpuserve", "--help"], repo, env))
    for command in COMMANDS:
        (dest / f"{command}.txt").write_text(
            run_text([python, "-m", "tpuserve", command, "--help"], repo, env))


# ------------------------------------------------------------------------------------ main


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
    snapshot_help(repo, python, out)
    snapshot_status(repo, python, out)
    if args.review:
        base, head = args.review
        env = child_env(repo, None, out / "unused")
        review = [python, "-m", "tpuserve", "review", base, head, "--repo", str(repo)]
        (out / "review.json").write_text(run_text([*review, "--json"], repo, env))
        (out / "review.md").write_text(run_text(review, repo, env))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
