"""The requests our stacks make agree field by field with what gcloud sends for the same thing.

For each accelerator in ACCELERATORS and each provisioning model the project supports (the
spot and on-demand TPU VMs, the flex-start queued resource, and each TPU node pool of the
fleet), gcloud runs the documented command once against a local recording server
(tests/gcloud/recording_server.py, checked against the discovery document) with `--async`,
and its request is compared with ours:
- flex: the queued-resource body our provisioner POSTs (the synthesized flex stack's body);
- spot / ondemand / fleet pools: the body google-beta 6.50.0 builds from the synthesized
  resource, by its own expanders (tests/gcloud/provider_requests.py, cited per field).
Every field gcloud sends must be ours with the same value, or be listed in GCLOUD_ONLY with
the reason; every field only we send must be listed in OURS_ONLY with the reason; a listed
reason that no longer applies fails too. gcloud's inputs are the deployment's settings and
the accelerator's documented facts (ACCELERATOR_FACTS), never our synthesized output, except
the node metadata (the boot script is ours: gcloud is handed the same files).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import synth
from tests.gcloud import provider_requests as pr
from tests.gcloud.field_diff import compare
from tests.gcloud.recording_server import RecordingServer
from tpuserve.gcp.tpu.queued_resources import API_VERSION as QR_API_VERSION
from tpuserve.render import fleet_bundle
from tpuserve.settings import Deployment, load

GCLOUD = shutil.which("gcloud")
pytestmark = pytest.mark.skipif(GCLOUD is None, reason="gcloud is not installed here: the "
                                "requests it sends cannot be recorded")

# The accelerators compared: today's; extend from the accelerator table (tpuserve/kinds or
# tpuserve/accelerators.py) together with ACCELERATOR_FACTS and, where the default zone does
# not offer the type, ZONE_FOR.
ACCELERATORS = ["v5litepod-1", "v5litepod-4", "v5litepod-8", "v6e-1", "v6e-4", "v6e-8"]
# v6e is offered for spot and flex in us-east5-a (tpuserve/zones.py), not in the default zone.
ZONE_FOR: dict[str, str] = dict.fromkeys(("v6e-1", "v6e-4", "v6e-8"), "us-east5-a")


@dataclass(frozen=True)
class Facts:
    """What Google documents for an accelerator (vendor figures, not measured here): the
    inputs of the gcloud commands, independent of our accelerator table."""

    runtime_version: str   # Cloud TPU docs, TPU software versions (v5e: also SPEC's boot)
    gke_machine_type: str  # "Machine type (GKE API)" of cloud.google.com/tpu/docs/v5e, /v6e
    gke_topology: str      # the same tables' topology (all single-host: one VM)


ACCELERATOR_FACTS = {
    "v5litepod-1": Facts("v2-alpha-tpuv5-lite", "ct5lp-hightpu-1t", "1x1"),
    "v5litepod-4": Facts("v2-alpha-tpuv5-lite", "ct5lp-hightpu-4t", "2x2"),
    "v5litepod-8": Facts("v2-alpha-tpuv5-lite", "ct5lp-hightpu-8t", "2x4"),
    "v6e-1": Facts("v2-alpha-tpuv6e", "ct6e-standard-1t", "1x1"),
    "v6e-4": Facts("v2-alpha-tpuv6e", "ct6e-standard-4t", "2x2"),
    "v6e-8": Facts("v2-alpha-tpuv6e", "ct6e-standard-8t", "2x4"),
}
TOKEN = "recorded-token"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
COMPUTE_CLASS_KEY = "cloud.google.com/compute-class"  # stacks/fleet.py's node label and taint
PROVISIONING_LABEL = "tpuserve/provisioning"

# ---------------------------------------------------------------- the listed differences
TERRAFORM_LABELS = {
    "labels.managed_by": "the provider's default_labels (stacks/stack.py), merged into "
                         "effective_labels by tpgresource/labels.go SetLabelsDiff",
    f"labels.{pr.ATTRIBUTION_LABEL[0]}": "provider 6.50.0 adds it on create "
                                         "(add_terraform_attribution_label defaults to true)",
}
VM_OURS_ONLY = {
    **TERRAFORM_LABELS,
    "name": "expandTpuV2VmName puts the node id in the body too; the API takes nodeId from "
            "the query and the name is output-only in effect (the same id)",
}
VM_GCLOUD_ONLY = {
    "schedulingConfig.provisioningModel": "gcloud alpha writes provisioningModel beside "
        "spot (SPOT with --spot, STANDARD without); google-beta 6.50.0's scheduling_config "
        "has no provisioning_model: it sends `spot`, which v2alpha1 documents itself "
        "(\"Defines whether the node is Spot VM\"), STANDARD being the unset model",
}
QR_OURS_ONLY = {
    "tpu.nodeSpec.0.node.labels.tpuserve-generation": "added at create time "
        "(with_generation): ties the QR to the plan that made it",
}
POOL_GCLOUD_ONLY = {
    "nodePool.upgradeSettings.maxSurge": "gcloud writes GKE's default surge (1); the stack "
        "leaves upgrade_settings unset, so GKE applies the same default",
    "parent": "gcloud repeats the URL's parent in the body; the provider sends "
              "CreateNodePoolRequest{NodePool} only, the parent being the URL path",
}
# Why no pool sets placement_policy: a single-host TPU pool takes no topology. Google's own
# GKE tool passes --tpu-topology (with --placement-type=COMPACT) only when a slice spans more
# than one VM: AI-Hypercomputer/xpk src/xpk/core/nodepool.py at 367c838 ("--tpu-topology should
# not be set for single-host node pools", if system.vms_per_slice > 1; #822, 2aa1fb0, which
# removed it from single-host pools after it had been set on them); GKE's multislice page calls
# ct5lp-hightpu-4t in 2x2 a single-host TPU slice node pool. google-beta 6.50.0 could not send
# the bare topology gcloud sends anyway: placement_policy's `type` is Required
# (resource_container_node_pool.go schema; expandNodePool copies type, policy_name and
# tpu_topology into container.PlacementPolicy).
SINGLE_HOST_TOPOLOGY = ("AI-Hypercomputer/xpk src/xpk/core/nodepool.py at 367c838 (#822): no "
                        "--tpu-topology for single-host node pools")
PLACEMENT_TYPE_REQUIRED = ("google-beta v6.50.0 services/container/resource_container_node_pool"
                           ".go: placement_policy.type Required")


def _cases() -> list[tuple[str, str]]:
    fleet = load(environ={}).deployments["fleet"]
    models = ["spot", "ondemand", "flex", *[f"fleet:{m}" for m in fleet.fleet.provisioning]]
    return [(a, m) for a in ACCELERATORS for m in models]


# ---------------------------------------------------------------- synthesis per accelerator
_SYNTH: dict[str, tuple[dict[str, Deployment], dict[str, dict[str, Any]]]] = {}


def synthesized_for(accelerator: str, tmp: Path) -> tuple[dict[str, Deployment],
                                                          dict[str, dict[str, Any]]]:
    """The deployments and synthesized stacks of a user file that picks `accelerator`
    (synthesized once per accelerator and module, into `tmp`)."""
    if accelerator not in _SYNTH:
        tmp.mkdir(parents=True, exist_ok=True)  # a caller may name a directory not made yet
        user = tmp / f"{accelerator}.toml"
        zone = f'[gcp]\nzone = "{ZONE_FOR[accelerator]}"\n' if accelerator in ZONE_FOR else ""
        user.write_text(f'{zone}[tpu]\naccelerator_type = "{accelerator}"\n')
        deployments = load(environ={"TPUSERVE_CONFIG": str(user)}).deployments
        _SYNTH[accelerator] = (deployments, synth(deployments, tmp / f"out-{accelerator}"))
    return _SYNTH[accelerator]


# ---------------------------------------------------------------- running gcloud
def run_gcloud(args: list[str], *, api: str, version: str, project: str,
               workdir: Path) -> tuple[list[str], list[pr.ApiRequest]]:
    """Run one gcloud command against a recording server; its POSTs."""
    config = workdir / "gcloud-config"
    config.mkdir(exist_ok=True)
    with RecordingServer(api, version, access_token=TOKEN) as server:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
               "LANG": "C.UTF-8", "CLOUDSDK_CONFIG": str(config),
               f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api.upper()}": server.endpoint,
               "CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN, "CLOUDSDK_CORE_PROJECT": project,
               "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
               "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1"}
        cmd = [str(GCLOUD), *args, "--async", "--quiet"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                              check=False)
        assert done.returncode == 0, (
            f"{' '.join(cmd)}\nexit {done.returncode}\n{done.stderr[-3000:]}\n"
            f"refused: {server.refusals}")
        assert not server.refusals, server.refusals
        posts = [pr.ApiRequest(r.method, r.path, r.query, r.body) for r in server.creates()]
    return cmd, posts


def metadata_args(metadata: dict[str, str], workdir: Path) -> list[str]:
    """--metadata-from-file k=FILE,...: each value verbatim (no comma splitting)."""
    pairs = []
    for i, (key, value) in enumerate(sorted(metadata.items())):
        path = workdir / f"metadata-{i}"
        path.write_text(value)
        pairs.append(f"{key}={path}")
    return ["--metadata-from-file", ",".join(pairs)]


def labels_arg(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def node_args(d: Deployment, facts: Facts, metadata: dict[str, str], workdir: Path,
              version_flag: str) -> list[str]:
    """What the VM and the queued resource's node share."""
    net = ["--network", d.network_name]
    if d.subnet_name:
        net += ["--subnetwork", d.subnet_name]
    return ["--zone", d.gcp.zone, "--accelerator-type", d.tpu.accelerator_type,
            version_flag, facts.runtime_version, *net, "--tags", d.network_tag,
            *metadata_args(metadata, workdir), "--service-account", d.service_account_email,
            "--scopes", CLOUD_PLATFORM, "--labels", labels_arg(d.labels),
            "--shielded-secure-boot"]


@dataclass
class Recorded:
    case: str
    command: list[str]
    gcloud: pr.ApiRequest
    ours: pr.ApiRequest
    gcloud_only: dict[str, str]
    ours_only: dict[str, str]
    api: tuple[str, str]


def _record(accelerator: str, model: str, deployments: dict[str, Deployment],
            stacks: dict[str, dict[str, Any]], workdir: Path) -> Recorded:
    facts = ACCELERATOR_FACTS[accelerator]
    if model in ("spot", "ondemand"):
        d = deployments[model]
        resource = stacks[model]["resource"]["google_tpu_v2_vm"]["tpu_node"]
        provider = stacks[model]["provider"]["google-beta"][0]
        ours = pr.tpu_v2_vm_request(resource, provider)
        metadata = pr.unescape(resource["metadata"])
        args = ["alpha", "compute", "tpus", "tpu-vm", "create", d.node_name,
                *node_args(d, facts, metadata, workdir, "--version"),
                *(["--spot"] if d.kind.spot else [])]
        cmd, posts = run_gcloud(args, api="tpu", version=pr.TPU_V2_VERSION,
                                project=d.gcp.project, workdir=workdir)
        return Recorded(f"{accelerator}/{model}", cmd, _one(posts), ours, VM_GCLOUD_ONLY,
                        VM_OURS_ONLY, ("tpu", pr.TPU_V2_VERSION))
    if model == "flex":
        d = deployments[model]
        body = pr.unescape(stacks[model]["resource"]["terraform_data"]["queued_resource"]
                           ["input"]["body"])
        parent, _, qr_id = d.queued_resource_name.rpartition("/queuedResources/")
        ours = pr.ApiRequest("POST", f"/{QR_API_VERSION}/{parent}/queuedResources",
                             {"queuedResourceId": qr_id},
                             {**body, "tpu": {"nodeSpec": [{**spec, "node": {
                                 **spec["node"], "labels": {**spec["node"]["labels"],
                                                            "tpuserve-generation": "g1"}}}
                                 for spec in body["tpu"]["nodeSpec"]]}})
        node = body["tpu"]["nodeSpec"][0]["node"]
        args = ["alpha", "compute", "tpus", "queued-resources", "create", qr_id,
                "--node-id", d.node_name, "--provisioning-model=flex-start",
                f"--max-run-duration={d.stack.max_run_seconds}s",
                *([f"--valid-until-duration={d.stack.valid_until_seconds}s"]
                  if d.stack.valid_until_seconds else []),
                *node_args(d, facts, node["metadata"], workdir, "--runtime-version")]
        cmd, posts = run_gcloud(args, api="tpu", version=QR_API_VERSION,
                                project=d.gcp.project, workdir=workdir)
        return Recorded(f"{accelerator}/flex", cmd, _one(posts), ours, {}, QR_OURS_ONLY,
                        ("tpu", QR_API_VERSION))
    pool_model = model.split(":", 1)[1]
    # No --tpu-topology: every slice of the table is single-host, and Google's own tool leaves
    # it out for single-host pools (SINGLE_HOST_TOPOLOGY below); the multi-host form is
    # recorded apart (test_tpu_topology_is_the_multi_host_form).
    d = deployments["fleet"]
    f = d.fleet
    stack = stacks["fleet"]
    name = fleet_bundle.NODE_POOLS[pool_model]
    resource = stack["resource"]["google_container_node_pool"][f"tpu_pool_{pool_model}"]
    cluster = stack["resource"]["google_container_cluster"]["cluster"]["name"]
    ours = pr.node_pool_request(resource, stack["provider"]["google-beta"][0], cluster)
    first = f.provisioning[0] == pool_model
    capacity = {"flex": ["--flex-start", "--reservation-affinity=none",
                         f"--max-run-duration={f.flex_max_run_seconds}s",
                         "--no-enable-autorepair"],
                "spot": ["--spot", "--enable-autorepair"],
                "ondemand": ["--enable-autorepair"]}[pool_model]
    args = ["beta", "container", "node-pools", "create", name, "--cluster", d.node_name,
            "--location", d.gcp.zone, "--machine-type", facts.gke_machine_type,
            *capacity, "--num-nodes=0",
            "--enable-autoscaling", f"--total-min-nodes={f.min_replicas if first else 0}",
            f"--total-max-nodes={f.max_replicas}", "--location-policy=ANY",
            "--enable-autoupgrade", "--service-account", d.service_account_email,
            "--scopes", CLOUD_PLATFORM, "--workload-metadata=GKE_METADATA",
            "--shielded-secure-boot", "--shielded-integrity-monitoring",
            "--tags", d.network_tag, "--labels", labels_arg(d.labels),
            "--node-labels", labels_arg({PROVISIONING_LABEL: pool_model,
                                         COMPUTE_CLASS_KEY: fleet_bundle.COMPUTE_CLASS}),
            "--node-taints", f"{COMPUTE_CLASS_KEY}={fleet_bundle.COMPUTE_CLASS}:NoSchedule"]
    cmd, posts = run_gcloud(args, api="container", version=pr.CONTAINER_VERSION,
                            project=d.gcp.project, workdir=workdir)
    return Recorded(f"{accelerator}/{model}", cmd, _one(posts), ours, POOL_GCLOUD_ONLY, {},
                    ("container", pr.CONTAINER_VERSION))


def _one(posts: list[pr.ApiRequest]) -> pr.ApiRequest:
    assert len(posts) == 1, f"gcloud made {len(posts)} create requests: {posts}"
    return posts[0]


@pytest.fixture(scope="module", params=_cases(), ids=lambda c: f"{c[0]}-{c[1]}")
def recorded(request: pytest.FixtureRequest, deployments: dict[str, Deployment],
             synthesized: dict[str, dict[str, Any]],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One gcloud run per (accelerator, provisioning model), shared by the tests below."""
    accelerator, model = request.param
    with tempfile.TemporaryDirectory(prefix="gcloudreq-") as tmp:
        if deployments["spot"].tpu.accelerator_type == accelerator:
            chosen = (deployments, synthesized)  # the session's own synthesis: the default
        else:
            chosen = synthesized_for(accelerator, tmp_path_factory.mktemp(accelerator))
        yield _record(accelerator, model, *chosen, Path(tmp))


# ---------------------------------------------------------------- the tests
def test_request_matches_gcloud(recorded: Recorded) -> None:
    g, o = recorded.gcloud, recorded.ours
    assert (o.method, o.path) == (g.method, g.path), recorded.command
    assert o.query == g.query, recorded.command
    result = compare(g.body, o.body, differs=recorded.gcloud_only, ours_only=recorded.ours_only)
    print(f"\n[{recorded.case}] {' '.join(recorded.command)}\n{result.report()}")
    assert not result.unexplained and not result.stale, (
        f"{recorded.case}: {' '.join(recorded.command)}\n{result.report()}")


def test_our_request_is_one_the_api_documents(recorded: Recorded) -> None:
    """Ours passes the same discovery check gcloud's passed (fields, types, enums)."""
    from tests.fakes.discovery import Discovery

    doc = Discovery.load(*recorded.api)
    o = recorded.ours
    # The provider also writes the node id into `name`, which Node documents "Output only":
    # the server ignores it (AIP-203); the fake refuses output-only fields on purpose.
    body = {k: v for k, v in o.body.items() if not (k == "name" and "/nodes" in o.path)}
    doc.check_request(o.method, o.path, {k: [v] for k, v in o.query.items()}, json.dumps(body))


def test_tpu_topology_is_the_multi_host_form(tmp_path: Path) -> None:
    """What --tpu-topology sends (a bare placementPolicy.tpuTopology), recorded for v6e-4,
    whose ct6e-standard-4t also serves 2x4 over two VMs: ours sends no placementPolicy for its
    single-host pools (SINGLE_HOST_TOPOLOGY), and could not send gcloud's bare form through
    the provider, whose placement_policy needs a `type` (PLACEMENT_TYPE_REQUIRED)."""
    facts = ACCELERATOR_FACTS["v6e-4"]
    deployments, stacks = synthesized_for("v6e-4", tmp_path / "synth")
    d = deployments["fleet"]
    args = ["beta", "container", "node-pools", "create", "tpu-probe", "--cluster", d.node_name,
            "--location", d.gcp.zone, "--machine-type", facts.gke_machine_type,
            "--tpu-topology", facts.gke_topology, "--num-nodes=0"]
    _, posts = run_gcloud(args, api="container", version=pr.CONTAINER_VERSION,
                          project=d.gcp.project, workdir=tmp_path)
    assert _one(posts).body["nodePool"]["placementPolicy"] == {"tpuTopology": "2x2"}
    for name, pool in stacks["fleet"]["resource"]["google_container_node_pool"].items():
        assert "placement_policy" not in pool, name
        assert "placementPolicy" not in pr.node_pool_request(
            pool, stacks["fleet"]["provider"]["google-beta"][0], "c").body["nodePool"], name
