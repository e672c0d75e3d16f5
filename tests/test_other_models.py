"""Two other open models on two other slices, from a user's files, through the checks the
default stacks get: IBM Granite 3B Code Instruct 128K (multi-head attention, 32 KV heads) on
v5litepod-4 with its `weights_index`, and Gemma 2B it (multi-query, 1 KV head) on v6e-1 with
`weights_gib`. Each deployment is a TPUSERVE_CONFIG file naming its own `config.json` (the
upstream files shipped in config/models/, copied beside the user's file as a user would hold
them) and is synthesized once for the session: the VM stacks, flex and the fleet.

Applied to each, as to the default: the accelerator and model reach every stack; the VM,
queued-resource and node-pool requests pass their discovery documents; the provider's
expanders map every attribute; the fleet's bundle passes the Kubernetes and CRD schemas; its
read-back plans nothing; the boot script passes bash -n and shellcheck; no secret reaches the
output; every string Terraform evaluates is a genuine reference; the synth summary names it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.conftest import CANARIES, synth
from tests.fakes.discovery import Discovery
from tests.gcloud import provider_requests as pr
from tests.render.fleet.test_schemas import CUSTOM, K8S_VERSION, SCHEMAS
from tests.stacks.test_fleet_readback import changes, flatten, second_plan
from tests.stacks.test_terraform_strings import REFERENCE, split_template, strings
from tpuserve.accelerators import accelerator
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.planner.arithmetic import kv_bytes_per_token, load_geometry
from tpuserve.render import fleet_bundle
from tpuserve.render.boot_script import render_startup, vllm_command
from tpuserve.render.queued_resource_body import build_body, check_body
from tpuserve.settings import Deployment, load
from tpuserve.settings.model_inputs import model_inputs
from tpuserve.synth_summary import summarize

MODELS = DEFAULT_CONFIG.parent / "models"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Case:
    model: str
    accelerator: str
    zone: str
    weights: str          # the [capacity] line naming the weights
    extra: str            # other settings the model needs
    weights_bytes: int    # what the plan must take as the weights


CASES = {
    # metadata.total_size of the shipped index: 6,965,007,360 bytes.
    "granite-v5e-4": Case("ibm-granite/granite-3b-code-instruct-128k", "v5litepod-4",
                          "us-west4-a", f'weights_index = "model/{INDEX}"', "", 6_965_007_360),
    # 4.67 GiB: the shipped index's metadata.total_size, 5,012,344,832 bytes, rounded.
    "gemma2b-v6e-1": Case("google/gemma-2b-it", "v6e-1", "us-east5-a", "weights_gib = 4.67",
                          "max_model_len = 8192\n", round(4.67 * 2**30)),
}


@dataclass(frozen=True)
class Synth:
    case: Case
    deployments: dict[str, Deployment]
    docs: dict[str, dict[str, Any]]
    outdir: Path
    warnings: list[str]


def user_file(tmp: Path, case: Case) -> Path:
    """The user's TPUSERVE_CONFIG and their copy of the model's files beside it."""
    (tmp / "model").mkdir()
    for name in ("config.json", INDEX):
        shutil.copyfile(MODELS / case.model / name, tmp / "model" / name)
    user = tmp / "user.toml"
    user.write_text(
        f'[gcp]\nzone = "{case.zone}"\n[tpu]\naccelerator_type = "{case.accelerator}"\n'
        f'[vllm]\nmodel = "{case.model}"\n{case.extra}'
        f'[capacity]\nmodel_geometry = "model/config.json"\n{case.weights}\n'
        f'[stacks.fleet.vllm]\nimage = "{IMAGE}"\n'
        '[stacks.fleet.fleet]\nprovisioning = ["flex", "spot", "ondemand"]\n')
    return user


@pytest.fixture(scope="module")
def synthesized_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synth]:
    """Each case synthesized once: every stack of the deployment."""
    out = {}
    for name, case in CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        loaded = load(environ={"TPUSERVE_CONFIG": str(user_file(tmp, case))})
        outdir = tmp / "cdktf.out"
        docs = synth(loaded.deployments, outdir)
        out[name] = Synth(case, loaded.deployments, docs, outdir, list(loaded.warnings))
    return out


@pytest.fixture(params=list(CASES))
def s(request: pytest.FixtureRequest, synthesized_cases: dict[str, Synth]) -> Synth:
    return synthesized_cases[request.param]


def _res(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return doc.get("resource", {}).get(kind, {})


def _vm(s: Synth, stack: str) -> dict[str, Any]:
    return _res(s.docs[stack], "google_tpu_v2_vm")["tpu_node"]


def _tpu_pools(s: Synth) -> dict[str, dict[str, Any]]:
    return {k: p for k, p in _res(s.docs["fleet"], "google_container_node_pool").items()
            if k.startswith("tpu_pool_")}


# ------------------------------------------------------------------ the model, from its files


def test_the_model_is_sized_from_the_users_files(s: Synth) -> None:
    for name, d in s.deployments.items():
        assert d.vllm.model == s.case.model, name
        inputs = model_inputs(d)
        assert inputs.weights_bytes == s.case.weights_bytes, name
        config = json.loads((MODELS / s.case.model / "config.json").read_text())
        assert inputs.geometry_path == s.outdir.parent / "model" / "config.json", name
        # Its own geometry: per token, 2 (K and V) x layers x KV heads x head_dim x 2 bytes.
        heads = config["num_key_value_heads"]
        head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
        assert kv_bytes_per_token(load_geometry(inputs.geometry_path)) == (
            2 * config["num_hidden_layers"] * heads * head_dim * 2), name
    # Nothing here is Gemma 4 E2B's: no measured rule of SPEC is claimed for this model.
    assert not [w for w in s.warnings if "8.97 GiB" in w]


# ------------------------------------------------------------------ every stack takes the slice


def test_one_stack_per_provisioning_model_and_only_google_beta(s: Synth) -> None:
    assert set(s.docs) == {"base", "spot", "ondemand", "flex", "fleet"}
    for name, doc in s.docs.items():
        assert doc["terraform"]["required_providers"]["google-beta"]["version"] == "6.50.0"
        assert set(doc["terraform"]["required_providers"]) <= {"google-beta", "external"}, name
        for block in ("resource", "data"):
            for kind, items in doc.get(block, {}).items():
                if kind.startswith("google_"):
                    for rname, body in items.items():
                        assert body.get("provider") == "google-beta", (name, kind, rname)


@pytest.mark.parametrize("stack", ["spot", "ondemand"])
def test_the_tpu_vm_takes_the_slice_and_the_model(s: Synth, stack: str) -> None:
    a = accelerator(s.case.accelerator)
    vm = _vm(s, stack)
    assert (vm["accelerator_type"], vm["runtime_version"], vm["zone"]) == (
        a.accelerator_type, a.family.runtime_version, s.case.zone)
    assert vm["scheduling_config"] == {"spot": stack == "spot"}
    assert vm["labels"]["model"] == s.case.model.lower().replace("/", "-").replace(".", "-")
    assert vm["metadata"]["enable-oslogin"] == "TRUE"
    assert vm["shielded_instance_config"] == {"enable_secure_boot": True}
    script = vm["metadata"]["startup-script"]
    assert shlex.join(vllm_command(s.deployments[stack])) in script
    assert f"--tensor-parallel-size {a.chips} " in script
    assert f"--model {s.case.model}" in script or shlex.quote(s.case.model) in script
    assert "gemma-4" not in script.lower()


def test_the_flex_body_takes_the_slice_and_passes_its_checks(s: Synth) -> None:
    d = s.deployments["flex"]
    body = build_body(d, render_startup(d))
    check_body(f"projects/{d.gcp.project}/locations/{s.case.zone}", body)
    [spec] = body["tpu"]["nodeSpec"]
    assert spec["node"]["acceleratorType"] == s.case.accelerator
    assert spec["node"]["runtimeVersion"] == accelerator(s.case.accelerator).family.runtime_version
    qr = _res(s.docs["flex"], "terraform_data")["queued_resource"]
    assert pr.unescape(qr["input"]["body"]) == body  # the synthesized stack carries that body


def test_the_fleet_pools_and_pods_take_the_slice(s: Synth) -> None:
    a = accelerator(s.case.accelerator)
    pools = _tpu_pools(s)
    assert set(pools) == {"tpu_pool_flex", "tpu_pool_spot", "tpu_pool_ondemand"}
    assert {p["node_config"]["machine_type"] for p in pools.values()} == {a.machine_type}
    objects = fleet_bundle.render_objects(s.deployments["fleet"])
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Deployment"
            and o["metadata"]["name"] == "vllm"]
    assert pods, [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    [vllm] = [c for c in pods[0]["containers"] if c["name"] == "vllm"]
    assert vllm["resources"]["requests"]["google.com/tpu"] == a.chips
    assert vllm["resources"]["limits"]["google.com/tpu"] == a.chips
    selector = pods[0]["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-accelerator"] == a.family.gke_accelerator
    assert selector["cloud.google.com/gke-tpu-topology"] == a.topology
    assert s.case.model in json.dumps(vllm)
    # The default's one-chip v5e machine appears nowhere in another slice's fleet.
    assert "ct5lp-hightpu-1t" not in json.dumps(s.docs["fleet"])


# ------------------------------------------------------------------ the requests Google reads


def test_every_attribute_is_mapped_and_the_requests_pass_their_documents(s: Synth) -> None:
    tpu = Discovery.load("tpu", pr.TPU_V2_VERSION)
    for stack in ("spot", "ondemand"):
        vm = _vm(s, stack)
        assert pr.unmapped(vm, pr.TPU_V2_VM) == set(), stack
        req = pr.tpu_v2_vm_request(vm, s.docs[stack]["provider"]["google-beta"][0])
        assert req.body["acceleratorType"] == s.case.accelerator
        # expandTpuV2VmName also writes the output-only name (the gcloud comparison lists it,
        # VM_OURS_ONLY): the API takes the id from nodeId; the rest is checked as sent.
        body = {k: v for k, v in req.body.items() if k != "name"}
        tpu.check_request(req.method, req.path, {k: [v] for k, v in req.query.items()}, body)
    fleet = s.docs["fleet"]
    container = Discovery.load("container", pr.CONTAINER_VERSION)
    for name, pool in _res(fleet, "google_container_node_pool").items():
        assert pr.unmapped(pool, pr.NODE_POOL) == set(), name
        req = pr.node_pool_request(pool, fleet["provider"]["google-beta"][0], "c")
        container.check_request(req.method, req.path, {}, req.body)
    d = s.deployments["flex"]
    qr = Discovery.load("tpu", "v2alpha1")
    qr.check_request("POST", f"/v2alpha1/projects/{d.gcp.project}/locations/{s.case.zone}/"
                     "queuedResources", {"queuedResourceId": ["tpuserve-flex"]},
                     build_body(d, render_startup(d)))


# ------------------------------------------------------------------ the fleet's bundle and plan


def test_the_fleet_bundle_passes_the_kubernetes_and_crd_schemas(s: Synth) -> None:
    objects = fleet_bundle.render_objects(s.deployments["fleet"])
    kinds = set()
    for o in objects:
        group = o["apiVersion"].rpartition("/")[0]
        kinds.add((group, o["kind"]))
        if (group, o["kind"]) in CUSTOM:
            schema = json.loads((SCHEMAS / group / CUSTOM[(group, o["kind"])]).read_text())
            jsonschema.validators.validator_for(schema)(schema).validate(o)
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    assert ("inference.networking.k8s.io", "InferencePool") in kinds


@pytest.mark.parametrize("first", ["system_pool", "tpu_pool_flex", "tpu_pool_spot",
                                   "tpu_pool_ondemand"])
def test_the_fleets_second_plan_changes_nothing(s: Synth, first: str) -> None:
    doc = s.docs["fleet"]
    cluster = doc["resource"]["google_container_cluster"]["cluster"]
    pools = doc["resource"]["google_container_node_pool"]
    assert second_plan(cluster, pools[first]) == {}
    pool = pools[first]
    assert changes(pool["node_config"], flatten(pool, pool["node_config"])) == {}


# ------------------------------------------------------------------ scripts, strings, secrets


def test_the_boot_script_is_bash_and_shellcheck_clean(s: Synth, tmp_path: Path) -> None:
    path = tmp_path / "boot.sh"
    path.write_text(render_startup(s.deployments["spot"]))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([str(SHELLCHECK), "--shell=bash", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout


def test_every_template_sequence_is_a_genuine_reference(s: Synth) -> None:
    for stack, tf in s.docs.items():
        for path, text in strings(tf):
            for seq in split_template(text)[1]:
                assert REFERENCE.fullmatch(seq), f"{stack}{path}: {seq[:80]!r} is evaluated"


def test_no_secret_value_reaches_the_output(s: Synth) -> None:
    for name, doc in s.docs.items():
        assert not _res(doc, "google_secret_manager_secret_version"), name
        assert "secret_data" not in json.dumps(doc), name
    for path in s.outdir.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            for canary in CANARIES.values():
                assert canary not in text, path


def test_the_synth_summary_names_the_slice(s: Synth) -> None:
    lines = {name: summarize(name, doc) for name, doc in s.docs.items()}
    assert lines["spot"].startswith(f"spot      TPU VM tpuserve-spot ({s.case.accelerator}, "
                                    "spot)")
    assert lines["flex"].startswith("flex      flex-start queued resource")
    assert lines["fleet"].startswith("fleet     GKE fleet:")
    chips = int(s.case.accelerator.rsplit("-", 1)[1])
    replica = "one-chip" if chips == 1 else f"{chips}-chip"  # what one replica is, not one chip
    assert f" {replica} replicas in " in lines["fleet"], lines["fleet"]
    assert lines["base"].startswith("base      long-lived base")


# ------------------------------------------------------------------ the shipped files' sources


def _git_blob(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


def test_every_shipped_model_file_is_the_blob_its_readme_row_cites() -> None:
    readme = (MODELS / "README.md").read_text()
    shipped = sorted(p for p in MODELS.rglob("*") if p.is_file() and p.parent != MODELS)
    assert {p.relative_to(MODELS).as_posix() for p in shipped} >= {
        f"{c.model}/{name}" for c in CASES.values() for name in ("config.json", INDEX)}
    for path in shipped:
        rel = path.relative_to(MODELS).as_posix()
        rows = [r for r in readme.splitlines() if r.startswith("|") and f"`{rel}`" in r]
        assert len(rows) == 1, rel
        assert f"git blob `{_git_blob(path)}`" in rows[0], f"{rel} differs from its cited blob"
        assert re.search(r"commit `[0-9a-f]{40}`|the same repository and commit", rows[0]), rel
