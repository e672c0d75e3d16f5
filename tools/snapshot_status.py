"""`tpuserve status [STACK] [--json]` of the checkout under test against the fakes, with the
clock frozen: the status part of tools/snapshot_outputs.py (OUT_DIR/status/<scenario>.*).

The fakes (tests/fakes/) are imported from THIS script's checkout, not from --repo: they are
the test bench, not the code under test.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from snapshot_run import child_env, execute

FLEET_IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32

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
                f'image = "{FLEET_IMAGE}"\n\n[access]\ntls = "off"\n')
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
                    env = child_env(repo, config, tmp / "unused")
                    env.update(api.environ())
                    env.update(OPENAI_API_KEY=API_KEY, TPUSERVE_TIME_SCALE="0",
                               KUBECONFIG=str(kubeconfig),
                               TPUSERVE_SNAPSHOT_NOW=repr(NOW),
                               PYTHONPATH=f"{repo}{os.pathsep}{tmp / 'site'}")
                    r = execute([python, "-m", "tpuserve", "status", *args], repo, env, 300)
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
