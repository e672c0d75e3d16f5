"""The REST request google-beta 6.50.0 builds from a synthesized resource, by its own expanders.

Each row maps one synthesized (Terraform) attribute to the API field the provider's expander
writes, citing the function of terraform-provider-google-beta at tag v6.50.0 that does it.
Only the attributes our stacks set are mapped; an attribute the stacks set that no row maps
fails the build (`unmapped`), so a new attribute cannot slip past the comparison unread.

Emission rules, read from the same functions:
- "value": sent as is (the Go value after the expander);
- "nonempty": sent only when not the zero value (`tpgresource.IsEmptyValue` in
  resourceTpuV2VmCreate; Go's `omitempty` in google.golang.org/api/container/v1beta1);
- "always": sent even when false/zero (the expander assigns it unconditionally, or the
  struct lists it in ForceSendFields).
Terraform's JSON syntax reads every string as a template: `$${` and `%%{` in the synthesized
file are the literal `${` and `%{` the provider receives (stacks/literals.py escapes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TPU_VM_GO = "google-beta/services/tpuv2/resource_tpu_v2_vm.go"
NODE_CONFIG_GO = "google-beta/services/container/node_config.go"
NODE_POOL_GO = "google-beta/services/container/resource_container_node_pool.go"
CONFIG_GO = "google-beta/transport/config.go"
LABELS_GO = "google-beta/tpgresource/labels.go"
# transport/config.go DefaultBasePaths at v6.50.0: TpuV2 "https://tpu.googleapis.com/v2alpha1/",
# Container "https://container.googleapis.com/v1beta1/".
TPU_V2_VERSION = "v2alpha1"
CONTAINER_VERSION = "v1beta1"
# transport/config.go: AttributionKey/AttributionValue, added on create (provider.go:
# add_terraform_attribution_label defaults to true, strategy CREATION_ONLY).
ATTRIBUTION_LABEL = ("goog-terraform-provisioned", "true")


@dataclass(frozen=True)
class Row:
    tf: str     # the synthesized attribute, dotted (a block is its first element)
    api: str    # the request body field, dotted
    rule: str   # "value", "nonempty" or "always"
    cite: str   # file and function at v6.50.0


TPU_V2_VM: tuple[Row, ...] = (
    Row("name", "(query) nodeId", "value",
        f"{TPU_VM_GO} resourceTpuV2VmCreate: url ...nodes?nodeId={{{{name}}}}; "
        "expandTpuV2VmName also sets body name"),
    Row("name", "name", "nonempty", f"{TPU_VM_GO} expandTpuV2VmName"),
    Row("zone", "(path) locations/{zone}", "value", f"{TPU_VM_GO} resourceTpuV2VmCreate"),
    Row("runtime_version", "runtimeVersion", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmRuntimeVersion"),
    Row("accelerator_type", "acceleratorType", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmAcceleratorType"),
    Row("network_config.network", "networkConfig.network", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmNetworkConfig/expandTpuV2VmNetworkConfigNetwork"),
    Row("network_config.subnetwork", "networkConfig.subnetwork", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmNetworkConfig/expandTpuV2VmNetworkConfigSubnetwork"),
    Row("network_config.enable_external_ips", "networkConfig.enableExternalIps", "always",
        f"{TPU_VM_GO} expandTpuV2VmNetworkConfig/expandTpuV2VmNetworkConfigEnableExternalIps"),
    Row("network_config.can_ip_forward", "networkConfig.canIpForward", "always",
        f"{TPU_VM_GO} expandTpuV2VmNetworkConfig/expandTpuV2VmNetworkConfigCanIpForward"),
    Row("service_account.email", "serviceAccount.email", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmServiceAccount/expandTpuV2VmServiceAccountEmail"),
    Row("service_account.scope", "serviceAccount.scope", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmServiceAccount/expandTpuV2VmServiceAccountScope"),
    Row("scheduling_config.preemptible", "schedulingConfig.preemptible", "always",
        f"{TPU_VM_GO} expandTpuV2VmSchedulingConfig/expandTpuV2VmSchedulingConfigPreemptible"),
    Row("scheduling_config.reserved", "schedulingConfig.reserved", "always",
        f"{TPU_VM_GO} expandTpuV2VmSchedulingConfig/expandTpuV2VmSchedulingConfigReserved"),
    Row("scheduling_config.spot", "schedulingConfig.spot", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmSchedulingConfig/expandTpuV2VmSchedulingConfigSpot"),
    Row("shielded_instance_config.enable_secure_boot",
        "shieldedInstanceConfig.enableSecureBoot", "always",
        f"{TPU_VM_GO} expandTpuV2VmShieldedInstanceConfig"),
    Row("metadata", "metadata", "nonempty", f"{TPU_VM_GO} expandTpuV2VmMetadata"),
    Row("tags", "tags", "nonempty", f"{TPU_VM_GO} expandTpuV2VmTags"),
    Row("labels", "labels", "nonempty",
        f"{TPU_VM_GO} expandTpuV2VmEffectiveLabels (effective_labels: {LABELS_GO} "
        "SetLabelsDiff merges provider default_labels and the attribution label)"),
)

NODE_POOL: tuple[Row, ...] = (
    Row("cluster", "(path) clusters/{cluster}", "value",
        f"{NODE_POOL_GO} extractNodePoolInformation/NodePoolInformation.parent"),
    Row("location", "(path) locations/{location}", "value",
        f"{NODE_POOL_GO} extractNodePoolInformation"),
    Row("name", "nodePool.name", "nonempty", f"{NODE_POOL_GO} expandNodePool"),
    Row("initial_node_count", "nodePool.initialNodeCount", "nonempty",
        f"{NODE_POOL_GO} expandNodePool (InitialNodeCount int64, omitempty)"),
    Row("autoscaling", "nodePool.autoscaling.enabled", "always",
        f"{NODE_POOL_GO} expandNodePool: Enabled: true"),
    Row("autoscaling.min_node_count", "nodePool.autoscaling.minNodeCount", "always",
        f"{NODE_POOL_GO} expandNodePool (ForceSendFields)"),
    Row("autoscaling.max_node_count", "nodePool.autoscaling.maxNodeCount", "always",
        f"{NODE_POOL_GO} expandNodePool (ForceSendFields)"),
    Row("autoscaling.total_min_node_count", "nodePool.autoscaling.totalMinNodeCount", "always",
        f"{NODE_POOL_GO} expandNodePool (ForceSendFields)"),
    Row("autoscaling.total_max_node_count", "nodePool.autoscaling.totalMaxNodeCount", "always",
        f"{NODE_POOL_GO} expandNodePool (ForceSendFields)"),
    Row("autoscaling.location_policy", "nodePool.autoscaling.locationPolicy", "nonempty",
        f"{NODE_POOL_GO} expandNodePool"),
    Row("management.auto_repair", "nodePool.management.autoRepair", "nonempty",
        f"{NODE_POOL_GO} expandNodePool (NodeManagement.AutoRepair, omitempty)"),
    Row("management.auto_upgrade", "nodePool.management.autoUpgrade", "nonempty",
        f"{NODE_POOL_GO} expandNodePool (NodeManagement.AutoUpgrade, omitempty)"),
    Row("node_config.machine_type", "nodePool.config.machineType", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.service_account", "nodePool.config.serviceAccount", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.oauth_scopes", "nodePool.config.oauthScopes", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (tpgresource.CanonicalizeServiceScope)"),
    Row("node_config.workload_metadata_config.mode",
        "nodePool.config.workloadMetadataConfig.mode", "nonempty",
        f"{NODE_CONFIG_GO} expandWorkloadMetadataConfig"),
    Row("node_config.shielded_instance_config.enable_secure_boot",
        "nodePool.config.shieldedInstanceConfig.enableSecureBoot", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (schema default false)"),
    Row("node_config.shielded_instance_config.enable_integrity_monitoring",
        "nodePool.config.shieldedInstanceConfig.enableIntegrityMonitoring", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (schema default true)"),
    Row("node_config.tags", "nodePool.config.tags", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.resource_labels", "nodePool.config.resourceLabels", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (nested: no default_labels merge)"),
    Row("node_config.labels", "nodePool.config.labels", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.taint", "nodePool.config.taints", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (NodeTaint key/value/effect)"),
    Row("node_config.spot", "nodePool.config.spot", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (Optional+Default false, omitempty)"),
    Row("node_config.preemptible", "nodePool.config.preemptible", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (Optional+Default false, omitempty)"),
    Row("node_config.flex_start", "nodePool.config.flexStart", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.max_run_duration", "nodePool.config.maxRunDuration", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig"),
    Row("node_config.reservation_affinity.consume_reservation_type",
        "nodePool.config.reservationAffinity.consumeReservationType", "nonempty",
        f"{NODE_CONFIG_GO} expandNodeConfig (ReservationAffinity)"),
    Row("placement_policy.tpu_topology", "nodePool.placementPolicy.tpuTopology", "nonempty",
        f"{NODE_POOL_GO} expandNodePool (PlacementPolicy.TpuTopology)"),
    Row("placement_policy.type", "nodePool.placementPolicy.type", "nonempty",
        f"{NODE_POOL_GO} expandNodePool (PlacementPolicy.Type)"),
)
# What expandNodeConfig/expandNodePool send for attributes the stacks leave unset: pointer
# structs built unconditionally from the always-present map key (Go encodes them as {}).
NODE_POOL_UNCONDITIONAL: dict[str, Any] = {
    "nodePool.config.loggingConfig": {"variantConfig": {}},  # expandNodeConfig: logging_variant
    "nodePool.networkConfig": {},  # expandNodePool: expandNodeNetworkConfig returns &{} empty
}
# Attributes of the resource that do not reach the create body.
NOT_IN_BODY = {"//", "provider", "depends_on", "lifecycle"}


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]


def unescape(value: Any) -> Any:
    """A synthesized value as the provider receives it (Terraform JSON string templates)."""
    if isinstance(value, str):
        return value.replace("$${", "${").replace("%%{", "%{")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    return value


def _get(resource: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = resource
    for part in dotted.split("."):
        if isinstance(node, list):
            node = node[0] if node else None
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, unescape(node)


def _zero(value: Any) -> bool:
    return value in (None, False, 0, "", [], {})


def _put(body: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        body = body.setdefault(part, {})
    body[leaf] = value


MAP_ATTRIBUTES = {"labels", "metadata", "resource_labels"}  # maps: one leaf each


def _leaves(resource: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted attributes a resource sets (blocks walked; maps and lists are leaves)."""
    out: set[str] = set()
    for key, value in resource.items():
        if not prefix and key in NOT_IN_BODY:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, list) and value and isinstance(value[0], dict) and key != "taint":
            out |= _leaves(value[0], f"{path}.")  # a block (cdktf writes some as a list)
        elif isinstance(value, dict) and key not in MAP_ATTRIBUTES:
            out |= _leaves(value, f"{path}.")
        else:
            out.add(path)
    return out


def unmapped(resource: Mapping[str, Any], rows: tuple[Row, ...]) -> set[str]:
    """Attributes the resource sets that no row maps (a block counts as mapped through its
    fields)."""
    mapped = {r.tf for r in rows}
    return {a for a in _leaves(resource) if a not in mapped}


def _body(resource: Mapping[str, Any], rows: tuple[Row, ...]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for row in rows:
        if row.api.startswith("("):
            continue
        if row.api.endswith("autoscaling.enabled"):
            if _get(resource, "autoscaling")[0]:
                _put(body, row.api, True)
            continue
        present, value = _get(resource, row.tf)
        block = row.tf.rsplit(".", 1)[0] if "." in row.tf else ""
        if not present:
            # An "always" field of a block that is set goes out as its zero value.
            if row.rule == "always" and block and _get(resource, block)[0]:
                value = 0 if "Count" in row.api else False
            else:
                continue
        if row.rule == "nonempty" and _zero(value):
            continue
        if row.tf == "node_config.taint":
            value = [{"key": t["key"], "value": t["value"], "effect": t["effect"]}
                     for t in value]
        _put(body, row.api, value)
    return body


def tpu_v2_vm_request(resource: Mapping[str, Any], provider: Mapping[str, Any]) -> ApiRequest:
    """POST {TpuV2BasePath}projects/P/locations/Z/nodes?nodeId=NAME with the expanded body."""
    body = _body(resource, TPU_V2_VM)
    # effective_labels = provider default_labels + attribution label + the resource's labels.
    labels = {**provider.get("default_labels", {}), ATTRIBUTION_LABEL[0]: ATTRIBUTION_LABEL[1],
              **resource.get("labels", {})}
    body["labels"] = labels
    project = provider["project"]
    return ApiRequest("POST", f"/{TPU_V2_VERSION}/projects/{project}/locations/"
                      f"{resource['zone']}/nodes", {"nodeId": resource["name"]}, body)


def node_pool_request(resource: Mapping[str, Any], provider: Mapping[str, Any],
                      cluster_name: str) -> ApiRequest:
    """POST {ContainerBasePath}projects/P/locations/L/clusters/C/nodePools with
    CreateNodePoolRequest{NodePool: expandNodePool(...)} (parent only in the URL)."""
    body = _body(resource, NODE_POOL)
    for field, value in NODE_POOL_UNCONDITIONAL.items():
        _put(body, field, value)
    project = provider["project"]
    return ApiRequest("POST", f"/{CONTAINER_VERSION}/projects/{project}/locations/"
                      f"{resource['location']}/clusters/{cluster_name}/nodePools", {}, body)
