"""Synth tests on the fleet stack's JSON: the cluster and its add-ons, one TPU pool per
provisioning model in order, the pods' least-privilege grants, the address and certificate,
and the Kubernetes bundle's resources. One synthesis for the module: all three pools, a
domain, replicas 2..6; the bundle renderer replaced by a few small objects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CANARIES, synth
from tpuserve.render import fleet_bundle
from tpuserve.settings import Deployment, from_raw, load_raw

IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
NODE_SA = "tpuserve-node@tpuserve-placeholder.iam.gserviceaccount.com"
POOL = "tpuserve-placeholder.svc.id.goog"
NUMBER = "${data.google_project.project.number}"


def principal(ns: str, ksa: str) -> str:
    return (f"principal://iam.googleapis.com/projects/{NUMBER}/locations/global/"
            f"workloadIdentityPools/{POOL}/subject/ns/{ns}/sa/{ksa}")


VLLM = principal("tpuserve", "vllm")
STAGER = principal("tpuserve", "stage-weights")
ADAPTER = principal("custom-metrics", "custom-metrics-stackdriver-adapter")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Deployment, dict[str, Any], Path]:
    raw = load_raw(environ={})
    # The VM stacks' SSH and API-port rules must not follow these onto the fleet's nodes.
    raw["access"] = {"api_source_ranges": ["203.0.113.0/24"],
                     "ssh_source_ranges": ["198.51.100.7/32"]}
    raw["stacks"]["fleet"] = {
        "provisioning_model": "fleet", "vllm": {"image": IMAGE},
        "fleet": {"provisioning": ["flex", "spot", "ondemand"], "min_replicas": 2,
                  "max_replicas": 6, "domain": "llm.example.com",
                  "flex_max_run_duration": "3d"},
    }
    d = from_raw(raw).deployments["fleet"]
    out = tmp_path_factory.mktemp("fleet")
    docs = synth({"fleet": d}, out)  # the real bundle: its size is checked at synth too
    return d, docs["fleet"], out


def res(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return doc["resource"].get(kind, {})


def test_the_stack_holds_its_cluster_and_nothing_long_lived(fleet) -> None:
    _d, doc, _out = fleet
    assert set(doc["resource"]) == {
        "google_compute_subnetwork", "google_compute_firewall", "google_compute_address",
        "google_container_cluster", "google_container_node_pool",
        "google_secret_manager_secret_iam_member", "google_storage_bucket_iam_member",
        "google_project_iam_member", "google_certificate_manager_dns_authorization",
        "google_certificate_manager_certificate", "terraform_data"}
    assert doc["terraform"]["required_providers"]["google-beta"]["version"] == "6.50.0"
    assert set(doc["terraform"]["required_providers"]) == {"google-beta", "external"}
    for kind, items in doc["resource"].items():
        for body in items.values():
            if kind.startswith("google_"):
                assert body["provider"] == "google-beta", kind


def test_the_cluster(fleet) -> None:
    _d, doc, _out = fleet
    [(key, c)] = res(doc, "google_container_cluster").items()
    assert key == "cluster"
    assert (c["name"], c["location"]) == ("tpuserve-fleet", "us-west4-a")
    assert (c["network"], c["subnetwork"]) == ("tpuserve-net", "tpuserve-net-us-west4")
    assert c["remove_default_node_pool"] is True and c["deletion_protection"] is False
    assert c["networking_mode"] == "VPC_NATIVE"
    assert c["ip_allocation_policy"] == {"cluster_ipv4_cidr_block": "10.96.0.0/14",
                                         "services_ipv4_cidr_block": "10.100.0.0/20"}
    assert c["datapath_provider"] == "ADVANCED_DATAPATH"
    assert c["enable_shielded_nodes"] is True
    assert c["workload_identity_config"] == {"workload_pool": POOL}
    assert c["monitoring_config"]["managed_prometheus"] == {"enabled": True}
    assert c["gateway_api_config"] == {"channel": "CHANNEL_STANDARD"}
    assert c["secret_manager_config"] == {"enabled": True}
    assert c["addons_config"] == {"gcs_fuse_csi_driver_config": {"enabled": True},
                                  "horizontal_pod_autoscaling": {"disabled": False},
                                  "http_load_balancing": {"disabled": False}}
    assert c["release_channel"] == {"channel": "REGULAR"}
    # The InferencePool CRD's floor (GKE Inference Gateway), above flex-start's 1.33 one.
    assert c["min_master_version"] == "1.34.0-gke.1626000"
    # GKE reports the first pool's config as the cluster's: never diffed (test_fleet_readback).
    assert c["lifecycle"] == {"ignore_changes": ["node_config"]}
    assert c["node_config"]["service_account"] == NODE_SA  # not the default compute account
    assert c["depends_on"] == ["data.external.base_preflight", "data.external.fleet_preflight",
                               "google_project_iam_member.node_default_role"]


def test_one_tpu_pool_per_provisioning_model_in_order(fleet) -> None:
    _d, doc, _out = fleet
    pools = res(doc, "google_container_node_pool")
    # cdktf sorts the JSON's keys: the order shows in the floor (the first pool's alone).
    assert set(pools) == {"system_pool", "tpu_pool_flex", "tpu_pool_spot", "tpu_pool_ondemand"}
    system = pools.pop("system_pool")
    pools = {f"tpu_pool_{m}": pools[f"tpu_pool_{m}"] for m in ("flex", "spot", "ondemand")}
    assert system["name"] == "system"
    assert system["node_config"]["machine_type"] == "e2-standard-4"
    assert (system["autoscaling"]["total_min_node_count"],
            system["autoscaling"]["total_max_node_count"]) == (1, 3)
    for (key, pool), model, floor in zip(pools.items(), ("flex", "spot", "ondemand"),
                                         (2, 0, 0), strict=True):
        assert pool["name"] == f"tpu-{model}", key
        assert pool["cluster"] == "${google_container_cluster.cluster.name}"
        assert pool["location"] == "us-west4-a"
        assert pool["autoscaling"] == {"total_min_node_count": floor, "total_max_node_count": 6,
                                       "location_policy": "ANY"}
        cfg = pool["node_config"]
        assert cfg["machine_type"] == "ct5lp-hightpu-1t"
        # The ComputeClass's rule for manually created pools: its label and NoSchedule taint.
        assert cfg["labels"] == {"tpuserve/provisioning": model,
                                 "cloud.google.com/compute-class": "tpuserve-v5e"}
        assert cfg["taint"] == [{"key": "cloud.google.com/compute-class",
                                 "value": "tpuserve-v5e", "effect": "NO_SCHEDULE"}]
        assert cfg["spot"] is True if model == "spot" else "spot" not in cfg
        flex_fields = {"flex_start", "max_run_duration", "reservation_affinity"}
        if model == "flex":
            assert cfg["flex_start"] is True
            assert cfg["max_run_duration"] == f"{3 * 86400}s"
            assert cfg["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
            assert pool["management"] == {"auto_repair": False, "auto_upgrade": True}
        else:
            assert not flex_fields & set(cfg)
            assert pool["management"] == {"auto_repair": True, "auto_upgrade": True}
    for pool in [system, *pools.values()]:
        cfg = pool["node_config"]
        assert cfg["service_account"] == NODE_SA  # the base's account, by email
        assert cfg["oauth_scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
        assert cfg["workload_metadata_config"] == {"mode": "GKE_METADATA"}
        assert cfg["shielded_instance_config"] == {"enable_secure_boot": True,
                                                   "enable_integrity_monitoring": True}
        assert cfg["tags"] == ["tpuserve-fleet"]


def test_the_pods_grants_are_exactly_these(fleet) -> None:
    _d, doc, _out = fleet
    grants = sorted(
        (kind, body.get("secret_id") or body.get("bucket") or body.get("project"),
         body["role"], body["member"])
        for kind, items in doc["resource"].items() if "_iam_" in kind
        for body in items.values())
    assert grants == sorted([
        ("google_secret_manager_secret_iam_member", "tpuserve-hf-token",
         "roles/secretmanager.secretAccessor", VLLM),
        ("google_secret_manager_secret_iam_member", "tpuserve-api-key",
         "roles/secretmanager.secretAccessor", VLLM),
        ("google_storage_bucket_iam_member", "tpuserve-placeholder-tpuserve-xla-cache",
         "roles/storage.objectUser", VLLM),
        ("google_storage_bucket_iam_member", "tpuserve-placeholder-tpuserve-weights",
         "roles/storage.objectViewer", VLLM),
        ("google_storage_bucket_iam_member", "tpuserve-placeholder-tpuserve-weights",
         "roles/storage.objectUser", STAGER),
        # The staging Job downloads with the HF token; the API key is the serving pods' only.
        ("google_secret_manager_secret_iam_member", "tpuserve-hf-token",
         "roles/secretmanager.secretAccessor", STAGER),
        ("google_project_iam_member", "tpuserve-placeholder", "roles/monitoring.viewer",
         ADAPTER),
        # The node account's own telemetry (GKE's documented minimum), with the fleet only.
        ("google_project_iam_member", "tpuserve-placeholder",
         "roles/container.defaultNodeServiceAccount", f"serviceAccount:{NODE_SA}"),
    ])
    assert doc["data"]["google_project"]["project"]["project_id"] == "tpuserve-placeholder"


def test_network_address_and_certificate(fleet) -> None:
    _d, doc, _out = fleet
    sub = res(doc, "google_compute_subnetwork")["proxy_only_subnet"]
    assert (sub["purpose"], sub["role"], sub["ip_cidr_range"], sub["network"], sub["region"]) \
        == ("REGIONAL_MANAGED_PROXY", "ACTIVE", "10.129.0.0/23", "tpuserve-net", "us-west4")
    rules = res(doc, "google_compute_firewall")
    # Only the load balancer's rules: no IAP SSH, no API-port rule (access.* are set above).
    assert set(rules) == {"firewall_lb", "firewall_picker"}
    lb = rules["firewall_lb"]
    assert lb["source_ranges"] == ["10.129.0.0/23", "35.191.0.0/16", "130.211.0.0/22"]
    assert lb["target_tags"] == ["tpuserve-fleet"]
    # The pods' key proxy (InferencePool targetPorts, HealthCheckPolicy port), nothing else.
    assert lb["allow"] == [{"protocol": "tcp", "ports": [str(fleet_bundle.PROXY_PORT)]}]
    assert fleet_bundle.PROXY_PORT == 8080
    assert "deny" not in lb
    # The proxies' ext_proc calls to the picker (its Service's port), from the proxy-only
    # subnet only: the base's deny-all would drop them and the FailClose pool serve nothing.
    picker = rules["firewall_picker"]
    assert picker["source_ranges"] == ["10.129.0.0/23"]
    assert picker["target_tags"] == ["tpuserve-fleet"]
    assert picker["allow"] == [{"protocol": "tcp", "ports": [str(fleet_bundle.EPP_PORT)]}]
    assert fleet_bundle.EPP_PORT == 9002
    assert "deny" not in picker
    assert "google_compute_firewall.firewall_picker" in \
        res(doc, "terraform_data")["k8s_teardown"]["depends_on"]
    ip = res(doc, "google_compute_address")["fleet_ip"]
    assert (ip["name"], ip["region"], ip["address_type"]) == (
        "tpuserve-fleet-ip", "us-west4", "EXTERNAL")
    cert = res(doc, "google_certificate_manager_certificate")["fleet_cert"]
    assert (cert["name"], cert["location"]) == ("tpuserve-fleet-cert", "us-west4")
    assert cert["managed"]["domains"] == ["llm.example.com"]
    assert "self_managed" not in cert  # no private key in the config or the state
    out = doc["output"]
    assert out["endpoint"]["value"] == "https://llm.example.com/v1"
    assert out["get_credentials_command"]["value"] == (
        "gcloud container clusters get-credentials tpuserve-fleet --zone us-west4-a "
        "--project tpuserve-placeholder")
    assert out["usd_per_hour"]["value"] == 0.6
    assert out["max_usd_per_hour"]["value"] == 3.6


def test_the_bundle_resources(fleet) -> None:
    d, doc, _out = fleet
    data = res(doc, "terraform_data")
    text = data["k8s_bundle"]["input"]["bundle"]
    assert text.startswith("apiVersion: v1\nkind: Namespace\n") and IMAGE in text
    assert data["k8s_bundle"]["input"] == {
        "bundle": text, "image": IMAGE, "project": "tpuserve-placeholder",
        "location": "us-west4-a", "cluster": "tpuserve-fleet"}
    assert data["k8s_bundle"]["triggers_replace"] == {
        "bundle_sha256": fleet_bundle.bundle_sha256(text),
        "cluster_id": "${google_container_cluster.cluster.id}"}
    [apply] = data["k8s_bundle"]["provisioner"]
    assert apply["local-exec"]["command"].endswith("-m tpuserve.kubectl apply")
    assert "when" not in apply["local-exec"]
    [delete] = data["k8s_teardown"]["provisioner"]
    assert delete["local-exec"]["command"].endswith("-m tpuserve.kubectl delete")
    assert delete["local-exec"]["when"] == "destroy"
    for step in (apply, delete):  # a destroy step may read only `self`
        for value in step["local-exec"]["environment"].values():
            assert re.fullmatch(r"\$\{(base64gzip\()?self\.input\.\w+\)?\}", value), value
    # Torn down before the cluster, pools, grants and address go.
    deps = set(data["k8s_teardown"]["depends_on"])
    assert {"google_container_cluster.cluster", "google_compute_address.fleet_ip",
            "google_container_node_pool.tpu_pool_flex"} <= deps
    assert d.kind.on_gke


def test_the_stack_deploys_alone_and_holds_no_secret(fleet) -> None:
    _d, doc, out = fleet
    text = json.dumps(doc)
    assert "terraform_remote_state" not in text
    declared = {f"{kind}.{name}" for kind, items in doc["resource"].items() for name in items}
    declared |= {f"data.{kind}.{name}" for kind, items in doc.get("data", {}).items()
                 for name in items}
    for ref in re.findall(r"(?<!\$)\$\{(?:base64gzip\()?([a-z_]+\.[a-z_0-9]+(?:\.[a-z_0-9]+)?)",
                          text):
        parts = ref.split(".")
        if parts[0] in ("self", "path"):
            continue
        head = ".".join(parts[:3] if parts[0] == "data" else parts[:2])
        assert head in declared, ref
    assert "secret_data" not in text and "private_key" not in text
    for canary in CANARIES.values():
        for path in out.rglob("*"):
            if path.is_file():
                assert canary not in path.read_text(errors="ignore"), path


def test_the_fleet_preflight_query(fleet) -> None:
    """What the plan-time check is asked to prove (tpuserve.gcp.fleet_check)."""
    _d, doc, _out = fleet
    pre = doc["data"]["external"]["fleet_preflight"]
    assert pre["program"][-1].endswith("-m tpuserve.fleet_check preflight")
    assert pre["query"] == {
        "project": "tpuserve-placeholder", "region": "us-west4", "zone": "us-west4-a",
        "cluster": "tpuserve-fleet", "release_channel": "REGULAR",
        "min_master_version": "1.34.0-gke.1626000", "machine_type": "ct5lp-hightpu-1t",
        "provisioning": "flex,spot,ondemand", "min_replicas": "2", "max_replicas": "6",
        "apis": "container.googleapis.com,compute.googleapis.com,"
                "cloudresourcemanager.googleapis.com,networkservices.googleapis.com,"
                "monitoring.googleapis.com,logging.googleapis.com,"
                "certificatemanager.googleapis.com"}
    # Its warnings reach the plan through an output (a succeeding program's stderr does not).
    assert doc["output"]["preflight_warnings"]["value"] == (
        "${data.external.fleet_preflight.result.warning_text}")
    # Every resource waits for both preflights (directly or through one that does).
    for kind, items in doc["resource"].items():
        for key, body in items.items():
            if kind != "terraform_data" and "depends_on" in body:
                assert "data.external.fleet_preflight" in body["depends_on"], (kind, key)
