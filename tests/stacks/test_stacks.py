"""Synth tests on the JSON of the serving stacks (spot, ondemand, flex) and of the base they
stand on: the base holds exactly the long-lived resources, no serving stack holds a secret,
bucket, identity or network, and a serving stack refers to the base by name only."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CANARIES, synth
from tpuserve.facts import IAP_RANGE
from tpuserve.render.boot_script import vllm_command
from tpuserve.settings import from_raw, load_raw

VM_STACKS = ("spot", "ondemand")
SERVING = ("spot", "ondemand", "flex")
NODE_MEMBER = "serviceAccount:${google_service_account.service_account.email}"
NODE_SA = "tpuserve-node@tpuserve-placeholder.iam.gserviceaccount.com"
# What outlives a node, and only that: the base's resources by type and address.
BASE_RESOURCES = {
    "google_compute_network": {"network"},
    "google_compute_subnetwork": {"subnetwork"},
    "google_compute_firewall": {"firewall_deny_ingress"},
    "google_service_account": {"service_account", "guard_service_account"},
    "google_secret_manager_secret": {"hf_token_secret", "api_key_secret"},
    "google_secret_manager_secret_iam_member": {"hf_token_secret_accessor",
                                                "api_key_secret_accessor"},
    "google_project_iam_member": {"log_writer", "guard_grant", "metric_writer"},
    "google_project_iam_custom_role": {"guard_role"},
    "google_cloud_tasks_queue": {"guard_queue"},
    "google_storage_bucket": {"cache_bucket", "weights_bucket"},
    "google_storage_bucket_iam_member": {"cache_bucket_object_user"},
    "terraform_data": {"teardown_guard"},
    "google_monitoring_dashboard": {"dashboard"},
    "google_monitoring_alert_policy": {"alert_not_serving", "alert_queueing", "alert_kv_pressure",
                                       "alert_ttft_p95", "alert_itl_mean", "alert_at_peak",
                                       "alert_idle"},
}
LONG_LIVED = ("google_compute_network", "google_compute_subnetwork", "google_service_account",
              "google_secret_manager_secret", "google_storage_bucket", "google_cloud_tasks_queue",
              "google_project_iam_custom_role", "google_project_iam_member")
GUARD_MEMBER = "serviceAccount:${google_service_account.guard_service_account.email}"
# Predefined roles that carry tpu.nodes.delete (basic roles and the TPU admin role).
ROLES_WITH_NODE_DELETE = {"roles/owner", "roles/editor", "roles/tpu.admin"}


def resources(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return doc.get("resource", {}).get(kind, {})


def startup_script(doc: dict[str, Any]) -> str:
    return resources(doc, "google_tpu_v2_vm")["tpu_node"]["metadata"]["startup-script"]


def test_one_stack_per_provisioning_model_and_the_base(synthesized) -> None:
    assert set(synthesized) == {"base", "spot", "ondemand", "flex", "fleet"}
    for doc in synthesized.values():
        assert doc["terraform"]["required_providers"]["google-beta"]["version"] == "6.50.0"
        assert "google" not in doc["terraform"]["required_providers"]  # never the GA provider


@pytest.mark.parametrize("stack", VM_STACKS)
def test_tpu_vm(synthesized, deployments, stack: str) -> None:
    vm = resources(synthesized[stack], "google_tpu_v2_vm")["tpu_node"]
    assert vm["name"] == f"tpuserve-{stack}"
    assert vm["accelerator_type"] == "v5litepod-1"  # explicit: the provider defaults to v2-8
    assert vm["runtime_version"] == "v2-alpha-tpuv5-lite"
    assert vm["zone"] == "us-west4-a"
    assert vm["scheduling_config"] == {"spot": stack == "spot"}
    # The base's network and subnet, by name: no cross-stack reference.
    assert vm["network_config"] == {
        "enable_external_ips": True, "network": "tpuserve-net",
        "subnetwork": "tpuserve-net-us-west4"}
    assert vm["shielded_instance_config"] == {"enable_secure_boot": True}
    assert vm["tags"] == [f"tpuserve-{stack}"]
    assert vm["labels"] == {"stack": stack, "model": "google-gemma-4-e2b-it",
                            "provisioning-model": stack, "managed-by": "tpuserve",
                            "deployment": "tpuserve"}
    assert vm["service_account"]["email"] == NODE_SA
    assert vm["service_account"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert vm["metadata"]["enable-guest-attributes"] == "TRUE"  # boot phases readable via API
    # SSH through OS Login only: IAM decides, project-wide metadata keys do not open the node.
    assert vm["metadata"]["enable-oslogin"] == "TRUE"
    assert vm["metadata"]["block-project-ssh-keys"] == "TRUE"
    # Nothing is created before the plan-time check that the base exists.
    assert vm["depends_on"] == ["data.external.base_preflight"]


@pytest.mark.parametrize("stack", VM_STACKS)
def test_startup_script_carries_the_rendered_flags(synthesized, deployments, stack) -> None:
    script = startup_script(synthesized[stack])
    assert script.startswith("#!/bin/bash")
    assert shlex.join(vllm_command(deployments[stack])) in script
    for flag in ("--max-model-len 32768", "--max-num-batched-tokens 4096",
                 "--gpu-memory-utilization 0.92", "--tool-call-parser gemma4"):
        assert flag in script
    code = [ln for ln in script.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "HF_TOKEN=" in ln]  # a mounted file, never an -e value


def test_secret_access_is_scoped_to_the_bases_own_secrets(synthesized) -> None:
    doc = synthesized["base"]
    secrets = resources(doc, "google_secret_manager_secret")
    assert secrets["hf_token_secret"]["secret_id"] == "tpuserve-hf-token"
    assert secrets["api_key_secret"]["secret_id"] == "tpuserve-api-key"
    grants = resources(doc, "google_secret_manager_secret_iam_member")
    assert set(grants) == {"hf_token_secret_accessor", "api_key_secret_accessor"}
    for key, grant in grants.items():
        assert grant["role"] == "roles/secretmanager.secretAccessor"
        secret = key.removesuffix("_accessor")
        assert grant["secret_id"] == f"${{google_secret_manager_secret.{secret}.id}}"
        assert grant["member"] == NODE_MEMBER
    # No project-wide secret access; the node's only project grants write logs and metrics.
    node_roles = {g["role"] for g in resources(doc, "google_project_iam_member").values()
                  if g["member"] == NODE_MEMBER}
    assert node_roles == {"roles/logging.logWriter", "roles/monitoring.metricWriter"}


def test_the_base_holds_exactly_the_long_lived_resources(synthesized) -> None:
    doc = synthesized["base"]
    assert {kind: set(items) for kind, items in doc["resource"].items()} == BASE_RESOURCES
    assert "data" not in doc  # the base needs nothing to exist before it


@pytest.mark.parametrize("stack", SERVING)
def test_a_serving_stack_holds_only_its_compute(synthesized, stack) -> None:
    doc = synthesized[stack]
    for kind in LONG_LIVED:
        assert not resources(doc, kind), (stack, kind)
    compute = {"spot": {"google_compute_firewall", "google_tpu_v2_vm", "terraform_data"},
               "ondemand": {"google_compute_firewall", "google_tpu_v2_vm", "terraform_data"},
               "flex": {"google_compute_firewall", "terraform_data"}}[stack]
    assert set(doc["resource"]) == compute


@pytest.mark.parametrize("stack", SERVING)
def test_a_serving_stack_deploys_alone(synthesized, stack) -> None:
    """No cross-stack reference: no remote state, no output of another stack, no reference to
    a resource the stack does not declare (cdktf would refuse to deploy it alone)."""
    doc = synthesized[stack]
    text = json.dumps(doc)
    assert "terraform_remote_state" not in text and "cross-stack" not in text
    declared = {f"{kind}.{name}" for kind, items in doc["resource"].items() for name in items}
    declared |= {f"data.{kind}.{name}" for kind, items in doc.get("data", {}).items()
                 for name in items}
    import re
    for ref in re.findall(r"(?<!\$)\$\{([a-z_]+\.[a-z_0-9]+(?:\.[a-z_0-9]+)?)", text):
        head = ".".join(ref.split(".")[:3]) if ref.startswith("data.") else ".".join(
            ref.split(".")[:2])
        if head.split(".")[0] in ("self", "path", "jsonencode(self"):
            continue
        assert head in declared, (stack, ref)


@pytest.mark.parametrize("stack", SERVING)
def test_a_missing_base_stops_the_plan_first(synthesized, stack) -> None:
    probe = synthesized[stack]["data"]["external"]["base_preflight"]
    assert probe["program"][-1].endswith("-m tpuserve.base_check preflight")
    assert probe["query"] == {
        "project": "tpuserve-placeholder", "deployment": "tpuserve", "region": "us-west4",
        "secrets": "tpuserve-hf-token,tpuserve-api-key",
        "buckets": "tpuserve-placeholder-tpuserve-xla-cache,"
                   "tpuserve-placeholder-tpuserve-weights",
        "service_accounts": NODE_SA, "base_command": "cdktf deploy base"}


@pytest.mark.parametrize("stack", ("base", *SERVING))
def test_no_secret_value_anywhere(synthesized, synth_dir: Path, stack) -> None:
    text = json.dumps(synthesized[stack])
    assert not resources(synthesized[stack], "google_secret_manager_secret_version")
    assert "secret_data" not in text
    for canary in CANARIES.values():
        for path in synth_dir.rglob("*"):
            if path.is_file():
                assert canary not in path.read_text(errors="ignore"), path


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_firewall_default_closed_api_and_iap_ssh(synthesized, stack) -> None:
    rules = resources(synthesized[stack], "google_compute_firewall")
    assert set(rules) == {"firewall_ssh"}  # no api rule without configured ranges
    ssh = rules["firewall_ssh"]
    assert ssh["source_ranges"] == [IAP_RANGE]
    assert ssh["allow"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert ssh["target_tags"] == [f"tpuserve-{stack}"]


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """spot and ondemand synthesized once with non-default access ranges, GCS state, a network
    of the user's, and (ondemand) the billing guard off."""
    raw = load_raw(environ={})
    raw["access"] = {"api_source_ranges": ["203.0.113.0/24"],
                     "ssh_source_ranges": ["198.51.100.7/32"]}
    raw["state"] = {"gcs_bucket": "team-tfstate", "gcs_prefix": "serving"}
    raw["gcp"] = {**raw["gcp"], "network": "my-vpc"}
    raw["stacks"] = {"spot": raw["stacks"]["spot"],
                     "ondemand": {**raw["stacks"]["ondemand"], "max_run_hours": 0}}
    raw["gcp"]["deployment"] = "team-a"
    return synth(from_raw(raw).deployments, tmp_path_factory.mktemp("configured"))


def test_configured_ranges_open_the_api_port(configured) -> None:
    doc = configured["spot"]
    rules = resources(doc, "google_compute_firewall")
    assert rules["firewall_api"]["source_ranges"] == ["203.0.113.0/24"]
    assert rules["firewall_api"]["allow"] == [{"protocol": "tcp", "ports": ["8000"]}]
    assert rules["firewall_api"]["target_tags"] == ["team-a-spot"]
    assert rules["firewall_api"]["name"] == "team-a-spot-allow-api"
    assert rules["firewall_ssh"]["source_ranges"] == [IAP_RANGE, "198.51.100.7/32"]


def test_buckets_are_private_protected_and_the_cache_expires(synthesized) -> None:
    doc = synthesized["base"]
    buckets = resources(doc, "google_storage_bucket")
    assert buckets["cache_bucket"]["name"] == "tpuserve-placeholder-tpuserve-xla-cache"
    assert buckets["weights_bucket"]["name"] == "tpuserve-placeholder-tpuserve-weights"
    for bucket in buckets.values():
        assert bucket["uniform_bucket_level_access"] is True
        assert bucket["public_access_prevention"] == "enforced"
        assert bucket["lifecycle"] == {"prevent_destroy": True}
    for secret in resources(doc, "google_secret_manager_secret").values():
        assert secret["lifecycle"] == {"prevent_destroy": True}
    # Deleted once unused for retention_days (the boot script renews customTime), not by age.
    assert buckets["cache_bucket"]["lifecycle_rule"] == [
        {"action": {"type": "Delete"}, "condition": {"days_since_custom_time": 30}}]
    assert "lifecycle_rule" not in buckets["weights_bucket"]
    # The node reads and writes the cache; nothing in the base grants it the weights bucket.
    [grant] = resources(doc, "google_storage_bucket_iam_member").values()
    assert grant["bucket"] == "${google_storage_bucket.cache_bucket.name}"
    assert grant["role"] == "roles/storage.objectUser"


def _iam_grants(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every IAM member/binding/policy resource of a stack, as (type, resource)."""
    return [(kind, res) for kind, items in doc.get("resource", {}).items()
            if "_iam_" in kind and "custom_role" not in kind for res in items.values()]


def _members(res: dict[str, Any]) -> list[str]:
    return [res["member"]] if "member" in res else list(res.get("members", []))


def test_the_nodes_service_account_holds_no_tpu_nodes_delete(synthesized) -> None:
    """No credential reachable from a node may delete a node."""
    doc = synthesized["base"]
    roles = resources(doc, "google_project_iam_custom_role")
    deleting = {f"${{google_project_iam_custom_role.{key}.name}}" for key, role in roles.items()
                if "tpu.nodes.delete" in role["permissions"]}
    grants = _iam_grants(doc)
    assert grants, "no grants found: the walk is broken"
    node_grants = [(kind, g) for kind, g in grants if NODE_MEMBER in _members(g)]
    assert node_grants  # logging, secrets, cache: the walk sees the node's grants
    for kind, grant in node_grants:
        assert grant["role"] not in deleting | ROLES_WITH_NODE_DELETE, (kind, grant)
        assert "cloudtasks" not in grant["role"] and "iam.serviceAccount" not in grant["role"]
        # Nothing on the guard's identity (acting as it would be deleting as it).
        assert not kind.startswith("google_service_account_iam"), grant
    # Whoever holds a role with tpu.nodes.delete is the guard, and only the guard.
    for _kind, grant in grants:
        if grant["role"] in deleting:
            assert _members(grant) == [GUARD_MEMBER]
    # The startup script cannot call the TPU API at all.
    for stack in VM_STACKS:
        assert "tpu.googleapis.com" not in startup_script(synthesized[stack])


@pytest.mark.parametrize("stack", VM_STACKS)
def test_the_billing_guard_is_a_cloud_tasks_task_armed_after_the_node(synthesized, stack) -> None:
    base, doc = synthesized["base"], synthesized[stack]
    [role] = resources(base, "google_project_iam_custom_role").values()
    assert sorted(role["permissions"]) == ["tpu.nodes.delete", "tpu.nodes.get"]
    assert role["role_id"] == "tpuserve_billing_guard"  # named for the deployment
    sa = resources(base, "google_service_account")["guard_service_account"]
    assert sa["account_id"] == "tpuserve-guard"
    queue = resources(base, "google_cloud_tasks_queue")["guard_queue"]
    assert (queue["name"], queue["location"]) == ("tpuserve-guard", "us-west4")
    assert queue["rate_limits"] == {"max_concurrent_dispatches": 1}
    arming = resources(doc, "terraform_data")["billing_guard"]
    node = f"projects/tpuserve-placeholder/locations/us-west4-a/nodes/tpuserve-{stack}"
    assert arming["input"] == {
        "node": node,
        "queue": "projects/tpuserve-placeholder/locations/us-west4/queues/tpuserve-guard",
        "service_account": "tpuserve-guard@tpuserve-placeholder.iam.gserviceaccount.com",
        "max_run_seconds": "28800",
        # The task's target: [gcp] tpu_api_endpoint, unset: Google's.
        "tpu_endpoint": "https://tpu.googleapis.com/",
    }
    # A new node (unknown id at plan) re-arms; an unchanged stack plans nothing (no timestamp).
    assert arming["triggers_replace"] == {**arming["input"],
                                          "node_id": "${google_tpu_v2_vm.tpu_node.id}"}
    # No Terraform timestamp() in any interpolation ($${ is a literal: the boot's own Python may
    # say .timestamp() in the embedded script).
    assert not re.search(r"(?<!\$)\$\{[^}]*\btimestamp\(", json.dumps(doc))
    create, destroy = arming["provisioner"]
    assert create["local-exec"]["command"].endswith("-m tpuserve.billing_guard arm")
    assert destroy["local-exec"]["command"].endswith("-m tpuserve.billing_guard disarm")
    assert destroy["local-exec"]["when"] == "destroy"
    assert arming["depends_on"] == ["google_tpu_v2_vm.tpu_node"]
    # Arm always gets the endpoint from the validated input, so the deploying shell's
    # TPUSERVE_GUARD_TPU_ENDPOINT never reaches the task; disarm builds no task and does not
    # read it (a state armed before it existed has no input.tpu_endpoint).
    assert create["local-exec"]["environment"]["TPUSERVE_GUARD_TPU_ENDPOINT"] == (
        "${self.input.tpu_endpoint}")
    assert "TPUSERVE_GUARD_TPU_ENDPOINT" not in destroy["local-exec"]["environment"]


def test_flex_has_no_billing_guard(synthesized) -> None:
    doc = synthesized["flex"]
    assert not resources(doc, "google_project_iam_custom_role")
    assert not resources(doc, "google_cloud_tasks_queue")
    assert "billing_guard" not in resources(doc, "terraform_data")


def test_the_deployment_has_a_network_of_its_own(synthesized) -> None:
    doc = synthesized["base"]
    net = resources(doc, "google_compute_network")["network"]
    assert net["name"] == "tpuserve-net"  # the deployment's, used by every serving stack
    assert net["auto_create_subnetworks"] is False
    sub = resources(doc, "google_compute_subnetwork")["subnetwork"]
    assert (sub["name"], sub["region"], sub["ip_cidr_range"]) == (
        "tpuserve-net-us-west4", "us-west4", "10.64.0.0/20")
    assert sub["network"] == "${google_compute_network.network.id}"
    deny = resources(doc, "google_compute_firewall")["firewall_deny_ingress"]
    assert (deny["direction"], deny["priority"], deny["deny"], deny["source_ranges"]) == (
        "INGRESS", 65534, [{"protocol": "all"}], ["0.0.0.0/0"])
    assert "allow" not in deny
    for stack in SERVING:
        for rule in resources(synthesized[stack], "google_compute_firewall").values():
            assert rule["network"] == "tpuserve-net"


def test_the_flex_body_has_the_network_and_secure_boot(synthesized) -> None:
    qr = resources(synthesized["flex"], "terraform_data")["queued_resource"]
    node = qr["input"]["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["networkConfig"] == {"network": "tpuserve-net",
                                     "subnetwork": "tpuserve-net-us-west4",
                                     "enableExternalIps": True}
    assert node["shieldedInstanceConfig"] == {"enableSecureBoot": True}
    assert node["metadata"]["enable-oslogin"] == "TRUE"
    assert node["metadata"]["block-project-ssh-keys"] == "TRUE"
    assert qr["depends_on"] == ["data.external.base_preflight", "data.external.qr_probe"]


def test_a_network_the_user_brings_is_used_not_created(configured) -> None:
    assert not resources(configured["base"], "google_compute_network")
    assert not resources(configured["base"], "google_compute_subnetwork")
    for stack in ("spot", "ondemand"):
        doc = configured[stack]
        assert not resources(doc, "google_compute_network")
        assert not resources(doc, "google_compute_subnetwork")
        vm = resources(doc, "google_tpu_v2_vm")["tpu_node"]
        assert vm["network_config"] == {"enable_external_ips": True, "network": "my-vpc"}
        for rule in resources(doc, "google_compute_firewall").values():
            assert rule["network"] == "my-vpc"
    # max_run_hours = 0: no guard at all, not a guard with rights and no task.
    off = configured["ondemand"]
    assert not resources(off, "terraform_data")


@pytest.mark.parametrize("stack", VM_STACKS)
def test_outputs(synthesized, stack) -> None:
    out = synthesized[stack]["output"]
    ip = "${google_tpu_v2_vm.tpu_node.network_endpoints[0].access_config[0].external_ip}"
    assert out["node_name"]["value"] == f"tpuserve-{stack}"
    assert out["zone"]["value"] == "us-west4-a"
    assert out["external_ip"]["value"] == ip
    assert out["endpoint"]["value"] == f"https://{ip}:8000/v1"  # access.tls: self-signed
    assert out["ssh_command"]["value"] == f"ssh {ip}"
    assert out["usd_per_hour"]["value"] == {"spot": 0.5779, "ondemand": 1.2}[stack]


def test_every_name_starts_with_the_deployment(synthesized, configured) -> None:
    """Deterministic names, each carrying the deployment: two deployments (here `tpuserve` and
    `team-a`) live side by side in one project."""
    for docs, dep in ((synthesized, "tpuserve"), (configured, "team-a")):
        base = docs["base"]
        sas = resources(base, "google_service_account")
        assert {s["account_id"] for s in sas.values()} == {f"{dep}-node", f"{dep}-guard"}
        assert {s["secret_id"] for s in resources(
            base, "google_secret_manager_secret").values()} == {f"{dep}-hf-token",
                                                                f"{dep}-api-key"}
        assert {b["name"] for b in resources(base, "google_storage_bucket").values()} == {
            f"tpuserve-placeholder-{dep}-xla-cache", f"tpuserve-placeholder-{dep}-weights"}
        for stack in set(docs) - {"base"}:
            for rule in resources(docs[stack], "google_compute_firewall").values():
                assert rule["name"].startswith(f"{dep}-{stack}-allow-")
            for vm in resources(docs[stack], "google_tpu_v2_vm").values():
                assert vm["name"] == f"{dep}-{stack}"
                assert vm["service_account"]["email"].startswith(f"{dep}-node@")


def test_state_backend_local_by_default_gcs_when_configured(synthesized, configured) -> None:
    assert synthesized["flex"]["terraform"]["backend"] == {
        "local": {"path": "../../../terraform.flex.tfstate"}}
    assert synthesized["base"]["terraform"]["backend"] == {
        "local": {"path": "../../../terraform.base.tfstate"}}
    # Another deployment: its own state, beside the default one's.
    assert configured["ondemand"]["terraform"]["backend"] == {
        "gcs": {"bucket": "team-tfstate", "prefix": "serving/team-a/ondemand"}}
    assert configured["base"]["terraform"]["backend"] == {
        "gcs": {"bucket": "team-tfstate", "prefix": "serving/team-a/base"}}


def test_every_google_element_uses_the_configured_google_beta_provider(synthesized) -> None:
    """Without `provider`, Terraform would bind a google_* type to hashicorp/google: a second,
    unconfigured provider (no project, region or labels)."""
    for name, doc in synthesized.items():
        assert set(doc["terraform"]["required_providers"]) <= {"google-beta", "external"}, name
        elements = [(kind, rname, body)
                    for block in ("resource", "data")
                    for kind, by_name in doc.get(block, {}).items()
                    for rname, body in by_name.items()]
        google = [(k, n, b) for k, n, b in elements if k.startswith("google_")]
        assert google, name
        for kind, rname, body in google:
            assert body.get("provider") == "google-beta", (name, kind, rname)
