"""Prints a short summary of each synthesized stack: `python -m tpuserve.synth_summary OUTDIR`.

A serving stack whose model or chip is not the measured pair (Gemma 4 E2B on v5litepod-1) is
followed by what is derived in it, from what, with what margin: read from the configuration
that synthesized it (TPUSERVE_CONFIG, as main.py reads it) through settings/derived_labels.py,
and only once the synthesized JSON is seen to serve that model on that chip.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuserve import entry_point
from tpuserve.contracts import DATA_RESOURCE, DORMANT_OUTPUT, TEARDOWN_GUARD_ID
from tpuserve.kinds import KINDS, STACK_NAMES
from tpuserve.kinds.synth_lines import no_tpu
from tpuserve.prices.price import STANDIN_PREFIX


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


def _names(doc: Mapping[str, Any], *words: str) -> bool:
    """Whether the JSON names each word whole (v6e-1 is not v6e-16, a model not its -Instruct)."""
    text = json.dumps(doc)
    return all(re.search(rf"(?<![\w./-]){re.escape(w)}(?![\w./-])", text) for w in words)


def _deployments(environ: Mapping[str, str] | None) -> Mapping[str, Any]:
    from tpuserve.settings import ConfigError, load  # only here: the summary reads JSON

    try:
        return load(environ).deployments
    except ConfigError as exc:
        raise ValueError(f"the configuration does not load ({exc.problems[0]}), so which "
                         "figures are derived is not known") from None


def standin_marks(docs: Mapping[str, Mapping[str, Any]],
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each serving stack's mark for a $/h no source prices (its [pricing] default stands
    in): appended to its summary line, so a stand-in is never shown as a price. {} when every
    price has a source (the default deployment: SPEC 2 prices it)."""
    deployments = _deployments(environ)
    marks = {}
    for name in docs:
        d = deployments.get(name) if name in STACK_NAMES else None
        if d is None:
            continue
        standins = [(k, p) for k in d.price_keys if (p := d.price_for(k)).standin]
        if standins:
            marks[name] = "; $/h a stand-in (" + "; ".join(
                f"{k} ${p.usd_per_chip_hour:g}/chip-hour: "
                f"{p.source.removeprefix(STANDIN_PREFIX)}; set [pricing] {k})"
                for k, p in standins)
    return marks


def derived_lines(docs: Mapping[str, Mapping[str, Any]],
                  environ: Mapping[str, str] | None = None) -> list[str]:
    """What is derived in each serving stack (stacks alike grouped), from the configuration;
    [] when every stack is the measured pair. ValueError (one line) when the configuration
    does not load or does not describe a stack as synthesized: nothing is taken as measured
    that the summary cannot tell."""
    from tpuserve.settings.derived_labels import DEPLOYMENT_KEY, derived_figures

    deployments = _deployments(environ)
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name, doc in docs.items():
        if name not in STACK_NAMES:
            continue
        d = deployments.get(name)
        a = None if d is None else d.tpu.accelerator
        if d is None or a is None or not _names(doc, d.vllm.model) or not (
                _names(doc, a.accelerator_type) or _names(doc, a.machine_type)):
            what = "no such stack" if d is None else f"{d.vllm.model} on {d.tpu.accelerator_type}"
            raise ValueError(f"[{name}] the configuration ({what}) does not describe this "
                             "synthesis, so which figures are derived is not known; synthesize "
                             "again with the same TPUSERVE_CONFIG")
        if derived := derived_figures(d):
            groups.setdefault(tuple(derived.items()), []).append(name)
    out = []
    for items, names in groups.items():
        derived = dict(items)
        out.append(f"derived, not measured ({', '.join(names)}): {derived.pop(DEPLOYMENT_KEY)}")
        out += [f"  {key}: {text}" for key, text in derived.items()]
    return out


def _summaries(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "cdktf.out") / "stacks"
    stacks = (sorted(p for p in outdir.iterdir() if (p / "cdk.tf.json").exists())
              if outdir.is_dir() else [])
    if not stacks:
        print(f"no synthesized stacks under {outdir}", file=sys.stderr)
        return 1
    docs = {path.name: json.loads((path / "cdk.tf.json").read_text()) for path in stacks}
    marks = standin_marks(docs)
    for name, doc in docs.items():
        print(summarize(name, doc) + marks.get(name, ""))
    for line in derived_lines(docs):
        print(line)
    return 0


def main(argv: list[str]) -> int:
    # A stack's JSON that cannot be read or is not Terraform's: one line, never a traceback.
    return entry_point.run(lambda: _summaries(argv), sys.stderr,
                           failed=(OSError, ValueError, KeyError, TypeError, AttributeError),
                           prefix="synth summary: ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
