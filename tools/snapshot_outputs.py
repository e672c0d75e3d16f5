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
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_PICKER = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0@sha256:" + "cd" * 32
_ADAPTER = ("gcr.io/gke-release/custom-metrics-stackdriver-adapter:v0.16.9-gke.0@sha256:"
            + "ef" * 32)
_FLEET_IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
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
image = "{_FLEET_IMAGE}"
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


def _env(repo: Path, config: Path | None, outdir: Path) -> dict[str, str]:
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


def _exec(argv: list[str], repo: Path, env: dict[str, str],
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


def _run(argv: list[str], repo: Path, env: dict[str, str], timeout: float = 600) -> str:
    """stdout, then `# exit N` and stderr when the command failed."""
    r = _exec(argv, repo, env, timeout)
    text = r.stdout + (f"\n# exit {r.returncode}\n{r.stderr}" if r.returncode else "")
    return text.replace(str(repo), "<REPO>")


def snapshot_config(repo: Path, python: str, name: str, config: Path | None, out: Path) -> None:
    dest = out / name
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        cdk_out = Path(tmp) / "cdktf.out"
        env = _env(repo, config, cdk_out)
        synth = _exec([python, "main.py"], repo, env, 600)
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
        (dest / "plan.json").write_text(_run([python, "-m", "tpuserve", "plan", "--json"],
                                             repo, env))
        for stack in stacks:
            if stack == "base":
                continue
            (dest / f"plan.{stack}.json").write_text(
                _run([python, "-m", "tpuserve", "plan", "--json", "--stack", stack], repo, env))


# ------------------------------------------------------------------------------- help texts

COMMANDS = ("status", "wait", "endpoint", "smoke", "bench", "rotate-key", "recover", "plan",
            "review")


def snapshot_help(repo: Path, python: str, out: Path) -> None:
    dest = out / "help"
    dest.mkdir()
    env = _env(repo, None, out / "unused")
    (dest / "tpuserve.txt").write_text(_run([python, "-m", "tpuserve", "--help"], repo, env))
    for command in COMMANDS:
        (dest / f"{command}.txt").write_text(
            _run([python, "-m", "tpuserve", command, "--help"], repo, env))


# --------------------------------------------------------------- status against the fakes

# The fakes' clock and the CLI's: a node created at 10:00, asked about at 12:00 (UTC).
CREATED = dt.datetime(2030, 1, 1, 10, 0, tzinfo=dt.UTC).timestamp()
NOW = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC).timestamp()
PROJECT, ZONE, API_KEY = "tpuserve-test", "us-west4-a", "sk-test-key-0123456789"
DEPLOYMENT = "tpuserve"
BOOT_READY = {
    "boot": "2030-01-01T10:00:00.000Z started",
    "guard": "2030-01-01T10:00:00.500Z deadline=2030-01-01T18:00:00Z from=createTime",
    "secret": "2030-01-01T10:00:01.000Z fetched",
    "cache": "2030-01-01T10:00:02.000Z hit object_bytes=1 files=2 bytes=3",
    "image": "2030-01-01T10:01:00.000Z pulled vllm/vllm-tpu:nightly",
    "container": "2030-01-01T10:01:05.000Z started",
    "startup_complete": "2030-01-01T10:08:00.000Z seen",
    "health": "2030-01-01T10:08:01.000Z ok",
    "state": "2030-01-01T10:08:01.500Z ready",
}
BOOT_FAILED = {
    "boot": "2030-01-01T10:00:00.000Z started",
    "state": "2030-01-01T10:05:00.000Z failed image pull: manifest unknown",
}
CAPACITY_EVENT = ("Node scale up in zones us-west4-a associated with this pod failed: GCE out "
                  "of resources. Pod is at risk of not being scheduled.")
METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
PICKER = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0@sha256:" + "cd" * 32

# Loaded first by every status subprocess (PYTHONPATH): the wall clock stands still at NOW.
# time.monotonic is left alone: the CLI's deadlines and pauses run on it.
SITECUSTOMIZE = """
import datetime as _dt
import os as _os
import time as _time

_NOW = float(_os.environ["TPUSERVE_SNAPSHOT_NOW"])
_time.time = lambda: _NOW
_time.time_ns = lambda: int(_NOW * 1_000_000_000)


class _FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(_NOW, tz)

    @classmethod
    def utcnow(cls):
        return cls.fromtimestamp(_NOW, _dt.UTC).replace(tzinfo=None)

    @classmethod
    def today(cls):
        return cls.fromtimestamp(_NOW)


_dt.datetime = _FrozenDatetime
"""


def _fakes() -> Any:
    """The fake modules of this script's own checkout (tests/fakes), whatever --repo is."""
    here = str(Path(__file__).resolve().parent.parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import tests.fakes.kubernetes as fk
    import tests.fakes.openai_server as oai
    import tests.fakes.tpu_api as tpu

    return tpu, oai, fk


def _seed_vm(api: Any, stack: str, attrs: dict[str, str], state: str = "READY") -> None:
    node = f"{DEPLOYMENT}-{stack}"
    api.seed_node(PROJECT, ZONE, node, external_ip="127.0.0.1")
    api.set_node_state(node, state)
    for key, value in attrs.items():
        api.set_guest_attribute(node, key, value)


def _seed_flex(api: Any, state: str, attrs: dict[str, str] | None) -> None:
    """A queued resource in STATE; with ATTRS, one that was ACTIVE and booted first (a
    SUSPENDED one then lost its node, as the API's chain does)."""
    node = f"{DEPLOYMENT}-flex"
    api.seed_queued_resource(PROJECT, ZONE, node, state="ACTIVE" if attrs else state)
    if attrs is not None:
        api.set_node_ip(node, "127.0.0.1")
        for key, value in attrs.items():
            api.set_guest_attribute(node, key, value)
        if state != "ACTIVE":
            api.set_state(node, state)


def _seed_fleet(fk: Any, kube: Any, port: int, states: list[str], *, picker_ready: int = 1,
                events: dict[int, tuple[str, str]] | None = None) -> None:
    ns, label = "tpuserve", {"app": "vllm"}
    kube.put(fk.deployment(ns, "vllm", desired=len(states), ready=states.count("ready"),
                           labels=label))
    kube.put(fk.hpa(ns, "vllm", target="8", metric=METRIC, current="3500m",
                    current_replicas=len(states), desired_replicas=len(states),
                    min_replicas=1, max_replicas=4))
    kube.put(fk.gateway(ns, "tpuserve", address="127.0.0.1", protocol="HTTP", port=port))
    picker = fk.deployment(ns, "vllm-epp", desired=1, ready=picker_ready,
                           labels={"app": "vllm-epp"})
    picker["spec"]["template"]["spec"]["containers"] = [{"name": "epp", "image": PICKER}]
    kube.put(picker)
    for i, state in enumerate(states):
        kube.put(fk.pod(ns, f"vllm-6d5f-0000{i}", label, state=state,
                        message="0/2 nodes are available: 2 node(s) didn't match Pod's node "
                        "affinity/selector." if state == "unschedulable" else ""))
    for i, (reason, message) in (events or {}).items():
        kube.put(fk.event(ns, f"vllm-6d5f-0000{i}", reason=reason, message=message))


# scenario: (argv after `status`, how to seed the TPU fake, how to seed the cluster)
STATUS_SCENARIOS: dict[str, tuple[list[str], Any, Any]] = {
    "spot-ready": (["spot", "--json"], lambda t: _seed_vm(t, "spot", BOOT_READY), None),
    "spot-ready-table": (["spot"], lambda t: _seed_vm(t, "spot", BOOT_READY), None),
    "spot-preempted": (["spot", "--json"],
                       lambda t: _seed_vm(t, "spot", BOOT_READY, "PREEMPTED"), None),
    "ondemand-boot-failed": (["ondemand", "--json"],
                             lambda t: _seed_vm(t, "ondemand", BOOT_FAILED), None),
    "flex-ready": (["flex", "--json"], lambda t: _seed_flex(t, "ACTIVE", BOOT_READY), None),
    "flex-queued": (["flex", "--json"],
                    lambda t: _seed_flex(t, "WAITING_FOR_RESOURCES", None), None),
    "flex-queued-table": (["flex"], lambda t: _seed_flex(t, "WAITING_FOR_RESOURCES", None),
                          None),
    "flex-suspended": (["flex", "--json"], lambda t: _seed_flex(t, "SUSPENDED", BOOT_READY),
                       None),
    "flex-not-deployed": (["flex", "--json"], None, None),
    "fleet-ready": (["fleet", "--json"], None,
                    lambda fk, k, port: _seed_fleet(fk, k, port, ["ready", "ready"])),
    "fleet-ready-table": (["fleet"], None,
                          lambda fk, k, port: _seed_fleet(fk, k, port, ["ready", "ready"])),
    "fleet-capacity-crashloop": (
        ["fleet", "--json"], None,
        lambda fk, k, port: _seed_fleet(fk, k, port, ["ready", "unschedulable", "crashloop"],
                                        events={1: ("FailedScaleUp", CAPACITY_EVENT)})),
    "fleet-picker-down": (["fleet", "--json"], None,
                          lambda fk, k, port: _seed_fleet(fk, k, port, ["ready"],
                                                          picker_ready=0)),
    "fleet-not-deployed": (["fleet", "--json"], None, None),
    "all-stacks": ([], lambda t: _seed_vm(t, "spot", BOOT_READY),
                   lambda fk, k, port: _seed_fleet(fk, k, port, ["ready"])),
    "all-stacks-json": (["--json"], lambda t: _seed_vm(t, "spot", BOOT_READY),
                        lambda fk, k, port: _seed_fleet(fk, k, port, ["ready"])),
}


def snapshot_status(repo: Path, python: str, out: Path) -> None:
    tpu, oai, fk = _fakes()
    dest = out / "status"
    dest.mkdir()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        server = oai.FakeOpenAIServer(oai.FakeConfig(api_key=API_KEY, max_model_len=4096))
        server.start()
        try:
            config = tmp / "user.toml"
            config.write_text(
                f'[gcp]\nproject = "{PROJECT}"\nzone = "{ZONE}"\n\n[vllm]\n'
                f"port = {server.port}\nmax_model_len = 4096\n\n"
                f'[stacks.fleet]\nprovisioning_model = "fleet"\n\n[stacks.fleet.vllm]\n'
                f'image = "{_FLEET_IMAGE}"\n\n[access]\ntls = "off"\n')
            for name, (args, seed_tpu, seed_kube) in STATUS_SCENARIOS.items():
                api = tpu.FakeTpuApi(clock=lambda: CREATED, durations={})
                kube = fk.FakeKubernetes()
                with api, kube:
                    if seed_tpu is not None:
                        seed_tpu(api)
                    if seed_kube is not None:
                        seed_kube(fk, kube, server.port)
                    kubeconfig = tmp / "kubeconfig"
                    kubeconfig.write_text(kube.kubeconfig(
                        f"gke_{PROJECT}_{ZONE}_{DEPLOYMENT}-fleet"))
                    env = _env(repo, config, tmp / "unused")
                    env.update(api.environ())
                    env.update(OPENAI_API_KEY=API_KEY, TPUSERVE_TIME_SCALE="0",
                               KUBECONFIG=str(kubeconfig),
                               TPUSERVE_SNAPSHOT_NOW=repr(NOW),
                               PYTHONPATH=f"{repo}{os.pathsep}{tmp / 'site'}")
                    r = _exec([python, "-m", "tpuserve", "status", *args], repo, env, 300)
                    ports = {api.url.rstrip("/").rsplit(":", 1)[1]: "tpu",
                             str(server.port): "openai",
                             kube.url.rsplit(":", 1)[1]: "kubernetes"}

                    def norm(text: str, ports: dict[str, str] = ports) -> str:
                        text = text.replace(tmp_name, "<TMP>").replace(str(repo), "<REPO>")
                        for port, who in ports.items():
                            text = re.sub(rf"(?<=127\.0\.0\.1:){port}(?![0-9])",
                                          f"<PORT:{who}>", text)
                        return text

                    ext = "json" if "--json" in args else "txt"
                    (dest / f"{name}.{ext}").write_text(norm(r.stdout))
                    (dest / f"{name}.stderr").write_text(
                        f"# exit {r.returncode}\n{norm(r.stderr)}")
        finally:
            server.stop()


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
        env = _env(repo, None, out / "unused")
        review = [python, "-m", "tpuserve", "review", base, head, "--repo", str(repo)]
        (out / "review.json").write_text(_run([*review, "--json"], repo, env))
        (out / "review.md").write_text(_run(review, repo, env))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
