"""Prints a short summary of each synthesized stack: `python -m tpuserve.synth_summary OUTDIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tpuserve.contracts import DATA_RESOURCE, SYSTEM_POOL_NAME, TEARDOWN_GUARD_ID, TPU_NODE_TYPE


def summarize(stack: str, doc: dict[str, Any]) -> str:
    resources = doc.get("resource", {})
    count = sum(len(v) for v in resources.values())
    outputs = doc.get("output", {})
    price = outputs.get("usd_per_hour", {}).get("value", "?")
    tpu = next(iter(resources.get(TPU_NODE_TYPE, {}).values()), None)
    if TEARDOWN_GUARD_ID in resources.get(DATA_RESOURCE, {}):
        dormant = outputs.get("dormant_usd_per_month", {}).get("value", "?")
        secrets = len(resources.get("google_secret_manager_secret", {}))
        buckets = len(resources.get("google_storage_bucket", {}))
        return (f"{stack:9} long-lived base ({secrets} secrets, {buckets} buckets, network, "
                f"identities); {count} resources; ${dormant}/month dormant")
    pools = resources.get("google_container_node_pool", {})
    if pools:
        tpu_pools = [p["name"] for p in pools.values() if p["name"] != SYSTEM_POOL_NAME]
        scaling = next((p["autoscaling"] for p in pools.values()
                        if p["name"] != SYSTEM_POOL_NAME), {})
        return (f"{stack:9} GKE fleet: {scaling.get('total_min_node_count', '?')}-"
                f"{scaling.get('total_max_node_count', '?')} one-chip replicas in "
                f"{', '.join(tpu_pools)}; {count} resources; ${price}/h a replica")
    if tpu:
        kind = "spot" if tpu.get("scheduling_config", {}).get("spot") else "on-demand"
        what = f"TPU VM {tpu['name']} ({tpu['accelerator_type']}, {kind})"
    elif DATA_RESOURCE in resources:
        what = "flex-start queued resource"
    else:
        what = "no TPU"
    return f"{stack:9} {what}; {count} resources; ${price}/h"


def main(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "cdktf.out") / "stacks"
    stacks = sorted(p for p in outdir.iterdir() if (p / "cdk.tf.json").exists())
    if not stacks:
        print(f"no synthesized stacks under {outdir}", file=sys.stderr)
        return 1
    for path in stacks:
        print(summarize(path.name, json.loads((path / "cdk.tf.json").read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
