"""Each kind's line of `python -m tpuserve.synth_summary`, read from its synthesized JSON.

A function answers None when the JSON is not of its kind; the kinds' tests are exclusive (a
GKE fleet has node pools, a TPU VM stack a google_tpu_v2_vm, a flex stack neither but the
terraform_data that creates its queued resource).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpuserve.contracts import (
    DATA_RESOURCE,
    NODE_POOL_TYPE,
    SYSTEM_POOL_NAME,
    TPU_NODE_TYPE,
    USD_PER_HOUR_OUTPUT,
)

if TYPE_CHECKING:
    from tpuserve.kinds import Kind


def _count(resources: Mapping[str, Any]) -> int:
    return sum(len(v) for v in resources.values())


def _price(outputs: Mapping[str, Any]) -> object:
    return outputs.get(USD_PER_HOUR_OUTPUT, {}).get("value", "?")


def _tpu(resources: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next(iter(resources.get(TPU_NODE_TYPE, {}).values()), None)


def tpu_vm(kind: Kind, stack: str, resources: Mapping[str, Any],
           outputs: Mapping[str, Any]) -> str | None:
    tpu = _tpu(resources)
    if resources.get(NODE_POOL_TYPE) or tpu is None or (
        bool(tpu.get("scheduling_config", {}).get("spot")) != kind.spot
    ):
        return None
    what = f"TPU VM {tpu['name']} ({tpu['accelerator_type']}, {kind.title})"
    return f"{stack:9} {what}; {_count(resources)} resources; ${_price(outputs)}/h"


def queued_resource(kind: Kind, stack: str, resources: Mapping[str, Any],
                    outputs: Mapping[str, Any]) -> str | None:
    if resources.get(NODE_POOL_TYPE) or _tpu(resources) is not None or (
        DATA_RESOURCE not in resources
    ):
        return None
    return (f"{stack:9} {kind.title} queued resource; {_count(resources)} resources; "
            f"${_price(outputs)}/h")


def gke_fleet(kind: Kind, stack: str, resources: Mapping[str, Any],
              outputs: Mapping[str, Any]) -> str | None:
    pools = resources.get(NODE_POOL_TYPE, {})
    if not pools:
        return None
    tpu_pools = [p["name"] for p in pools.values() if p["name"] != SYSTEM_POOL_NAME]
    tpu = [p for p in pools.values() if p["name"] != SYSTEM_POOL_NAME]
    scaling = next((p["autoscaling"] for p in tpu), {})
    machine = next((p.get("node_config", {}).get("machine_type") for p in tpu), None)
    return (f"{stack:9} {kind.title}: {scaling.get('total_min_node_count', '?')}-"
            f"{scaling.get('total_max_node_count', '?')} {_replica(machine)} replicas in "
            f"{', '.join(tpu_pools)}; {_count(resources)} resources; "
            f"${_price(outputs)}/h a replica")


def _replica(machine_type: str | None) -> str:
    """What one replica is: its chip count, read from the pool's machine type."""
    # Deferred: the registry itself imports only the contracts (tests/test_kinds.py).
    from tpuserve.accelerators import ACCELERATORS
    chips = next((a.chips for a in ACCELERATORS.values() if a.machine_type == machine_type), None)
    if chips is None:
        return f"{machine_type or 'unknown-machine'}"
    return "one-chip" if chips == 1 else f"{chips}-chip"


def no_tpu(stack: str, resources: Mapping[str, Any], outputs: Mapping[str, Any]) -> str:
    """A stack no kind recognizes."""
    return f"{stack:9} no TPU; {_count(resources)} resources; ${_price(outputs)}/h"
