"""Read-back drift: the plan after a first apply of the fleet changes nothing.

A model of what GKE and terraform-provider-google-beta v6.50.0 hand back after an apply, from
the provider's source at that tag (google-beta/services/container/):
- Read sets the cluster's `node_config` from `cluster.NodeConfig` through flattenNodeConfig
  (resource_container_cluster.go:3359). Once the default pool is gone GKE reports the FIRST
  node pool's config there (terraform-provider-google #12070, #17511): which pool is first is
  GKE's choice, so every pool is tried;
- flattenNodeConfig (node_config.go:1985-2060) hands back every key below; a value GKE leaves
  out comes back as Go's zero value; `taint` keeps only keys the prior state had
  (flattenTaints, node_config.go:2233-2253);
- the node_config schema (schemaNodeConfig, node_config.go:136-1066), per key
  Optional/Computed/ForceNew as in SCHEMA. Terraform's rule: a key the configuration leaves
  out is no change if it is Computed or comes back as its zero value; otherwise (and for a key
  set to another value) it is a change, a replacement if the key is ForceNew. (The block
  itself is ForceNew too, :141; an in-place change would run the update path, :4382, which
  updates "default-pool", gone by then: either way not an empty plan.)
- resource_labels: server-set `goog-gke*` keys are suppressed
  (containerNodePoolResourceLabelsDiffSuppress, node_config.go:2335-2348); labels are
  suppressed only with a GKE Sandbox (containerNodePoolLabelsSuppress, :2288-2333; none here);
- min_master_version is never read back (Optional only, resource_container_cluster.go:1510;
  Read sets master_version, :3246), so the floor is no drift either.
What GKE adds to a pool's config (GKE_FILLS) is modelled, not measured (no cloud here): the
server-filled defaults a `gcloud container node-pools describe` shows, all of them Computed or
suppressed keys, and the TPU taint GKE puts on TPU pools.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import synth
from tpuserve.settings import from_raw, load_raw

IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32


class Key(NamedTuple):
    line: int  # node_config.go at v6.50.0
    computed: bool
    force_new: bool


# schemaNodeConfig's keys that flattenNodeConfig hands back (node_config.go, v6.50.0).
SCHEMA: dict[str, Key] = {
    "containerd_config": Key(45, False, False),
    "disk_size_gb": Key(147, True, False),
    "disk_type": Key(155, True, False),
    "boot_disk": Key(1068, True, False),
    "guest_accelerator": Key(164, True, True),
    "image_type": Key(237, True, False),
    "labels": Key(245, True, False),
    "resource_labels": Key(255, False, False),
    "local_ssd_count": Key(263, True, True),
    "logging_variant": Key(107, True, False),
    "ephemeral_storage_config": Key(274, False, True),
    "ephemeral_storage_local_ssd_config": Key(293, False, True),
    "local_nvme_ssd_block_config": Key(319, False, True),
    "secondary_boot_disks": Key(338, False, True),
    "gcfs_config": Key(117, True, False),
    "gvnic": Key(364, False, False),
    "machine_type": Key(380, True, False),
    "metadata": Key(387, True, True),
    "min_cpu_platform": Key(396, True, True),
    "oauth_scopes": Key(404, True, True),
    "preemptible": Key(420, False, True),
    "reservation_affinity": Key(427, False, True),
    "spot": Key(460, False, True),
    "service_account": Key(468, True, True),
    "tags": Key(476, False, False),
    "storage_pools": Key(483, False, False),
    "shielded_instance_config": Key(490, True, True),
    "taint": Key(517, False, False),
    "effective_taints": Key(543, True, False),  # Computed only: never in a configuration
    "workload_metadata_config": Key(568, True, False),
    "sandbox_config": Key(586, False, True),
    "boot_disk_kms_key": Key(603, False, True),
    "kubelet_config": Key(611, True, False),
    "linux_node_config": Key(816, True, False),
    "windows_node_config": Key(876, True, False),
    "node_group": Key(894, False, True),
    "advanced_machine_features": Key(901, False, True),
    "sole_tenant_config": Key(930, False, True),
    "host_maintenance_policy": Key(976, False, True),
    "confidential_nodes": Key(994, True, False),
    "fast_socket": Key(1018, False, False),
    "resource_manager_tags": Key(1033, False, False),
    "enable_confidential_storage": Key(1038, False, True),
    "local_ssd_encryption_mode": Key(1044, False, True),
    "max_run_duration": Key(1051, False, True),
    "flex_start": Key(1057, False, True),
}
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}


def gke_fills(pool: dict[str, Any]) -> dict[str, Any]:
    """What GKE adds to a pool's config it was sent (modelled: server defaults)."""
    cfg = pool["node_config"]
    tpu = cfg.get("machine_type", "").startswith("ct5lp-")
    model = "spot" if cfg.get("spot") else "flex-start" if cfg.get("flex_start") else "standard"
    return {
        "disk_size_gb": 100, "disk_type": "pd-balanced", "image_type": "COS_CONTAINERD",
        "logging_variant": "DEFAULT", "metadata": {"disable-legacy-endpoints": "true"},
        "kubelet_config": [{"insecure_kubelet_readonly_port_enabled": "FALSE"}],
        "resource_labels": {**cfg.get("resource_labels", {}),
                            "goog-gke-node-pool-provisioning-model": model},
        "taint": [*cfg.get("taint", []), *([TPU_TAINT] if tpu else [])],
    }


def zero(value: Any) -> bool:
    return value in (None, "", 0, False, [], {})


def flatten(pool: dict[str, Any], prior: dict[str, Any]) -> dict[str, Any]:
    """flattenNodeConfig of the NodeConfig GKE reports for `pool`, against the prior state's
    block `prior` (node_config.go:1985-2060, flattenTaints :2233-2253)."""
    sent = {**pool["node_config"], **gke_fills(pool)}
    out = {key: sent.get(key) for key in SCHEMA}
    out["effective_taints"] = sent.get("taint", [])
    old_keys = {t["key"] for t in prior.get("taint", [])}
    out["taint"] = [t for t in sent.get("taint", []) if t["key"] in old_keys]
    return out


def changes(config: dict[str, Any], state: dict[str, Any]) -> dict[str, str]:
    """Terraform's plan of one node_config block: key -> "update" or "replace"."""
    out = {}
    for key, spec in SCHEMA.items():
        want, got = config.get(key), state.get(key)
        if key == "resource_labels" and isinstance(got, dict):
            got = {k: v for k, v in got.items()
                   if not (k.startswith("goog-gke") and k not in (want or {}))}
        if want is None:
            if spec.computed or zero(got):
                continue
        elif want == got or (zero(want) and zero(got)):
            continue
        out[key] = "replace" if spec.force_new else "update"
    return out


def second_plan(cluster: dict[str, Any], first_pool: dict[str, Any]) -> dict[str, str]:
    """The cluster's second plan when GKE reports `first_pool` as its node config."""
    ignored = set(cluster.get("lifecycle", {}).get("ignore_changes", []))
    if "node_config" in ignored:
        return {}
    state = flatten(first_pool, cluster.get("node_config", {}))
    return {f"node_config.{k}": v for k, v in changes(cluster.get("node_config", {}),
                                                       state).items()}


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    raw = load_raw(environ={})
    raw["stacks"]["fleet"] = {
        "provisioning_model": "fleet", "vllm": {"image": IMAGE},
        "fleet": {"provisioning": ["flex", "spot", "ondemand"], "min_replicas": 1}}
    d = from_raw(raw).deployments["fleet"]
    return synth({"fleet": d}, Path(tmp_path_factory.mktemp("readback")))["fleet"]


POOLS = ("system_pool", "tpu_pool_flex", "tpu_pool_spot", "tpu_pool_ondemand")


@pytest.mark.parametrize("first", POOLS)
def test_the_second_plan_changes_nothing_whichever_pool_gke_reports_first(doc, first) -> None:
    cluster = doc["resource"]["google_container_cluster"]["cluster"]
    pools = doc["resource"]["google_container_node_pool"]
    assert second_plan(cluster, pools[first]) == {}
    # The pools' own blocks round-trip: their read-back is their own config plus what GKE
    # fills in (Computed or suppressed keys) and the TPU taint (not in their prior state).
    for key, pool in pools.items():
        state = flatten(pool, pool["node_config"])
        assert changes(pool["node_config"], state) == {}, key


def test_without_ignore_changes_the_model_shows_the_reported_drift(doc) -> None:
    """The model is not vacuous: on the cluster as it was (no ignore_changes), GKE reporting
    a TPU pool first replaces the cluster, over tags and the pool's ForceNew keys."""
    cluster = copy.deepcopy(doc["resource"]["google_container_cluster"]["cluster"])
    cluster.pop("lifecycle")
    pools = doc["resource"]["google_container_node_pool"]
    every = {"node_config.tags": "update", "node_config.resource_labels": "update"}
    assert second_plan(cluster, pools["system_pool"]) == every
    assert second_plan(cluster, pools["tpu_pool_ondemand"]) == every
    assert second_plan(cluster, pools["tpu_pool_flex"]) == {
        **every, "node_config.flex_start": "replace", "node_config.max_run_duration": "replace",
        "node_config.reservation_affinity": "replace"}
    assert second_plan(cluster, pools["tpu_pool_spot"]) == {
        **every, "node_config.spot": "replace"}
    # The cluster-level block keeps the transient default pool off the default compute
    # account: it stays, only its read-back is ignored.
    assert cluster["node_config"]["service_account"].startswith("tpuserve-node@")
