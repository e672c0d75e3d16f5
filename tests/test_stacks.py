"""Synth tests on the JSON of the spot and on-demand stacks (and the foundation of all three)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CANARIES, synth
from tpuserve.config import IAP_RANGE, build_deployments, load_raw
from tpuserve.startup import vllm_command

VM_STACKS = ("spot", "ondemand")


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
    assert vm["network_config"] == {"enable_external_ips": True, "network": "default"}
    assert vm["tags"] == [f"tpuserve-{stack}"]
    assert vm["labels"] == {"stack": stack, "model": "google-gemma-4-e2b-it",
                            "provisioning-model": stack, "managed-by": "tpuserve"}
    assert vm["service_account"]["email"] == "${google_service_account.service_account.email}"
    assert vm["service_account"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert vm["metadata"]["enable-guest-attributes"] == "TRUE"  # boot phases readable via API
    # The VM boots only once it may read its secret (and write its cache).
    assert "google_secret_manager_secret_iam_member.hf_token_secret_accessor" in vm["depends_on"]


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
    # No project-wide secret access; project grants are logging and the billing guard only.
    project_roles = {g["role"] for g in resources(doc, "google_project_iam_member").values()}
    assert "roles/secretmanager.secretAccessor" not in project_roles
    assert project_roles <= {"roles/logging.logWriter",
                             "${google_project_iam_custom_role.billing_guard_role.name}"}


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
    """spot and ondemand synthesized once with non-default access ranges and GCS state."""
    raw = load_raw(environ={})
    raw["access"] = {"api_source_ranges": ["203.0.113.0/24"],
                     "ssh_source_ranges": ["198.51.100.7/32"]}
    raw["state"] = {"gcs_bucket": "team-tfstate", "gcs_prefix": "serving"}
    raw["stacks"] = {k: raw["stacks"][k] for k in ("spot", "ondemand")}
    return synth(build_deployments(raw), tmp_path_factory.mktemp("configured"))


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


@pytest.mark.parametrize("stack", VM_STACKS)
def test_billing_guard_role_is_narrow(synthesized, stack) -> None:
    role = resources(synthesized[stack], "google_project_iam_custom_role")["billing_guard_role"]
    assert sorted(role["permissions"]) == ["tpu.nodes.delete", "tpu.nodes.get"]


def test_flex_has_no_billing_guard_role(synthesized) -> None:
    assert not resources(synthesized["flex"], "google_project_iam_custom_role")


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
    assert set(resources(doc, "google_service_account")) == {"service_account"}
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
