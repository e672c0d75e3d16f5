"""Prints a short summary of each synthesized stack: `python -m tpuserve.synth_summary OUTDIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tpuserve import entry_point
from tpuserve.contracts import DATA_RESOURCE, DORMANT_OUTPUT, TEARDOWN_GUARD_ID
from tpuserve.kinds import KINDS
from tpuserve.kinds.synth_lines import no_tpu


def summarize(stack: str, doc: dict[str, Any]) -> str:
    resources = doc.get("resource", {})
    count = sum(len(v) for v in resources.values())
    outputs = doc.get("output", {})
    if TEARDOWN_GUARD_ID in resources.get(DATA_RESOURCE, {}):
        dormant = outputs.get(DORMANT_OUTPUT, {}).get("value", "?")
        secrets = len(resources.get("google_secret_manager_secret", {}))
        buckets = len(resources.get("google_storage_bucket", {}))
        return (f"{stack:9} long-lived base ({secrets} secrets, {buckets} buckets, network, "
                f"identities); {count} resources; ${dormant}/month dormant")
    for kind in KINDS:  # each kind's line, read from its JSON (tpuserve/kinds/synth_lines.py)
        if (line := kind.summary(kind, stack, resources, outputs)) is not None:
            return line
    return no_tpu(stack, resources, outputs)


def _summaries(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "cdktf.out") / "stacks"
    stacks = (sorted(p for p in outdir.iterdir() if (p / "cdk.tf.json").exists())
              if outdir.is_dir() else [])
    if not stacks:
        print(f"no synthesized stacks under {outdir}", file=sys.stderr)
        return 1
    for path in stacks:
        print(summarize(path.name, json.loads((path / "cdk.tf.json").read_text())))
    return 0


def main(argv: list[str]) -> int:
    # A stack's JSON that cannot be read or is not Terraform's: one line, never a traceback.
    return entry_point.run(lambda: _summaries(argv), sys.stderr,
                           failed=(OSError, ValueError, KeyError, TypeError, AttributeError),
                           prefix="synth summary: ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
