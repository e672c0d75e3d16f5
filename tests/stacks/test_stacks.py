"""Synth tests on the JSON of the spot and on-demand stacks (and the foundation of all three)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CANARIES, synth
from tpuserve.facts import IAP_RANGE
from tpuserve.render.boot_script import vllm_command
from tpuserve.settings import from_raw, load_raw

VM_STACKS = ("spot", "ondemand")
NODE_MEMBER = "serviceAccount:${google_service_account.service_account.email}"
GUARD_MEMBER = "serviceAccount:${google_service_account.guard_service_account.email}"
# Predefined roles that carry tpu.nodes.delete (basic roles and the TPU admin role).
ROLES_WITH_NODE_DELETE = {"roles/owner", "roles/editor", "roles/tpu.admin"}


def resources(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return doc.get("resource", {}).get(kind, {})


def startup_script(doc: dict[str, Any]) -> str:
    return resources(doc, "google_tpu_v2_vm")["tpu_node"]["metadata"]["startup-script"]


def test_one_stack_per_provisioning_model(synthesized) -> None:
    assert set(synthesized) == {"spot", "ondemand", "flex"}
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
    # The deployment's own network and subnet (issue 10 section 3), by reference.
    assert vm["network_config"] == {
        "enable_external_ips": True, "network": "${google_compute_network.network.name}",
        "subnetwork": "${google_compute_subnetwork.subnetwork.name}"}
    assert vm["shielded_instance_config"] == {"enable_secure_boot": True}
    assert vm["tags"] == [f"tpuserve-{stack}"]
    assert vm["labels"] == {"stack": stack, "model": "google-gemma-4-e2b-it",
                            "provisioning-model": stack, "managed-by": "tpuserve"}
    assert vm["service_account"]["email"] == "${google_service_account.service_account.email}"
    assert vm["service_account"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert vm["metadata"]["enable-guest-attributes"] == "TRUE"  # boot phases readable via API
    # SSH through OS Login only: IAM decides, project-wide metadata keys do not open the node.
    assert vm["metadata"]["enable-oslogin"] == "TRUE"
    assert vm["metadata"]["block-project-ssh-keys"] == "TRUE"
    # The VM boots only once it may read its secret (and write its cache), on its network.
    assert "google_secret_manager_secret_iam_member.hf_token_secret_accessor" in vm["depends_on"]
    assert {"google_compute_network.network", "google_compute_subnetwork.subnetwork"} <= set(
        vm["depends_on"])


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


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_secret_access_is_scoped_to_the_stacks_own_secrets(synthesized, stack) -> None:
    doc = synthesized[stack]
    secrets = resources(doc, "google_secret_manager_secret")
    assert secrets["hf_token_secret"]["secret_id"] == f"tpuserve-{stack}-hf-token"
    grants = resources(doc, "google_secret_manager_secret_iam_member")
    for key, grant in grants.items():
        assert grant["role"] == "roles/secretmanager.secretAccessor"
        secret = key.removesuffix("_accessor")
        assert grant["secret_id"] == f"${{google_secret_manager_secret.{secret}.id}}"
        assert grant["member"] == "serviceAccount:${google_service_account.service_account.email}"
    # No project-wide secret access; the node's only project grant is writing logs.
    node_roles = {g["role"] for g in resources(doc, "google_project_iam_member").values()
                  if g["member"] == NODE_MEMBER}
    assert node_roles == {"roles/logging.logWriter"}


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
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
    return synth(from_raw(raw).deployments, tmp_path_factory.mktemp("configured"))


def test_configured_ranges_open_the_api_port(configured) -> None:
    doc = configured["spot"]
    rules = resources(doc, "google_compute_firewall")
    assert rules["firewall_api"]["source_ranges"] == ["203.0.113.0/24"]
    assert rules["firewall_api"]["allow"] == [{"protocol": "tcp", "ports": ["8000"]}]
    assert rules["firewall_api"]["target_tags"] == ["tpuserve-spot"]
    assert rules["firewall_ssh"]["source_ranges"] == [IAP_RANGE, "198.51.100.7/32"]


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_cache_bucket_is_private_and_expires(synthesized, stack) -> None:
    doc = synthesized[stack]
    bucket = resources(doc, "google_storage_bucket")["cache_bucket"]
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    # Deleted once unused for retention_days (the boot script renews customTime), not by age.
    assert bucket["lifecycle_rule"] == [
        {"action": {"type": "Delete"}, "condition": {"days_since_custom_time": 30}}]
    [grant] = resources(doc, "google_storage_bucket_iam_member").values()
    assert grant["bucket"] == "${google_storage_bucket.cache_bucket.name}"
    assert grant["role"] == "roles/storage.objectUser"


def _iam_grants(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every IAM member/binding/policy resource of a stack, as (type, resource)."""
    return [(kind, res) for kind, items in doc.get("resource", {}).items()
            if "_iam_" in kind and "custom_role" not in kind for res in items.values()]


def _members(res: dict[str, Any]) -> list[str]:
    return [res["member"]] if "member" in res else list(res.get("members", []))


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_the_nodes_service_account_holds_no_tpu_nodes_delete(synthesized, stack) -> None:
    """No credential reachable from a node may delete a node (issue 10 section 3)."""
    doc = synthesized[stack]
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
    if stack != "flex":
        assert "tpu.googleapis.com" not in startup_script(doc)


@pytest.mark.parametrize("stack", VM_STACKS)
def test_the_billing_guard_is_a_cloud_tasks_task_armed_after_the_node(synthesized, stack) -> None:
    doc = synthesized[stack]
    [role] = resources(doc, "google_project_iam_custom_role").values()
    assert sorted(role["permissions"]) == ["tpu.nodes.delete", "tpu.nodes.get"]
    assert role["role_id"] == "tpuserve_billing_guard"  # named for the deployment
    sa = resources(doc, "google_service_account")["guard_service_account"]
    assert sa["account_id"] == "tpuserve-guard"
    queue = resources(doc, "google_cloud_tasks_queue")["guard_queue"]
    assert (queue["name"], queue["location"]) == ("tpuserve-guard", "us-west4")
    assert queue["rate_limits"] == {"max_concurrent_dispatches": 1}
    arming = resources(doc, "terraform_data")["billing_guard"]
    node = f"projects/tpuserve-placeholder/locations/us-west4-a/nodes/tpuserve-{stack}"
    assert arming["input"] == {
        "node": node,
        "queue": "projects/tpuserve-placeholder/locations/us-west4/queues/tpuserve-guard",
        "service_account": "tpuserve-guard@tpuserve-placeholder.iam.gserviceaccount.com",
        "max_run_seconds": "28800",
    }
    # A new node (unknown id at plan) re-arms; an unchanged stack plans nothing (no timestamp).
    assert arming["triggers_replace"] == {**arming["input"],
                                          "node_id": "${google_tpu_v2_vm.tpu_node.id}"}
    assert "timestamp(" not in json.dumps(doc)
    create, destroy = arming["provisioner"]
    assert create["local-exec"]["command"].endswith("-m tpuserve.billing_guard arm")
    assert destroy["local-exec"]["command"].endswith("-m tpuserve.billing_guard disarm")
    assert destroy["local-exec"]["when"] == "destroy"
    assert set(arming["depends_on"]) == {
        "google_tpu_v2_vm.tpu_node", "google_service_account.guard_service_account",
        "google_project_iam_member.guard_grant", "google_cloud_tasks_queue.guard_queue"}


def test_flex_has_no_billing_guard(synthesized) -> None:
    doc = synthesized["flex"]
    assert not resources(doc, "google_project_iam_custom_role")
    assert not resources(doc, "google_cloud_tasks_queue")
    assert "billing_guard" not in resources(doc, "terraform_data")


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_the_deployment_has_a_network_of_its_own(synthesized, stack) -> None:
    doc = synthesized[stack]
    net = resources(doc, "google_compute_network")["network"]
    assert net["name"] == "tpuserve-net"  # the deployment's, the same in every stack
    assert net["auto_create_subnetworks"] is False
    sub = resources(doc, "google_compute_subnetwork")["subnetwork"]
    assert (sub["name"], sub["region"], sub["ip_cidr_range"]) == (
        "tpuserve-net-us-west4", "us-west4", "10.64.0.0/20")
    assert sub["network"] == "${google_compute_network.network.id}"
    for rule in resources(doc, "google_compute_firewall").values():
        assert rule["network"] == "${google_compute_network.network.name}"


def test_the_flex_body_has_the_network_and_secure_boot(synthesized) -> None:
    qr = resources(synthesized["flex"], "terraform_data")["queued_resource"]
    node = qr["input"]["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["networkConfig"] == {"network": "tpuserve-net",
                                     "subnetwork": "tpuserve-net-us-west4",
                                     "enableExternalIps": True}
    assert node["shieldedInstanceConfig"] == {"enableSecureBoot": True}
    assert node["metadata"]["enable-oslogin"] == "TRUE"
    assert node["metadata"]["block-project-ssh-keys"] == "TRUE"
    assert {"google_compute_network.network", "google_compute_subnetwork.subnetwork"} <= set(
        qr["depends_on"])


def test_a_network_the_user_brings_is_used_not_created(configured) -> None:
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
    assert not resources(off, "google_cloud_tasks_queue")
    assert not resources(off, "google_project_iam_custom_role")
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


@pytest.mark.parametrize("stack", ("spot", "ondemand", "flex"))
def test_stable_addresses_and_stack_prefixed_names(synthesized, stack) -> None:
    doc = synthesized[stack]
    guard = {"guard_service_account"} if stack in VM_STACKS else set()
    assert set(resources(doc, "google_service_account")) == {"service_account"} | guard
    assert resources(doc, "google_service_account")["service_account"]["account_id"] == (
        f"tpuserve-{stack}-vm")
    for kind in ("google_compute_firewall", "google_secret_manager_secret"):
        for res in resources(doc, kind).values():
            name = res.get("name") or res.get("secret_id")
            assert name.startswith(f"tpuserve-{stack}-")


def test_state_backend_local_by_default_gcs_when_configured(synthesized, configured) -> None:
    assert synthesized["flex"]["terraform"]["backend"] == {
        "local": {"path": "../../../terraform.flex.tfstate"}}
    doc = configured["ondemand"]
    assert doc["terraform"]["backend"] == {
        "gcs": {"bucket": "team-tfstate", "prefix": "serving/ondemand"}}


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
