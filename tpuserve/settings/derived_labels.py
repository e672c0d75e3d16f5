"""Which figures and rules of a deployment are derived, from what, and with what margin.

Every figure and rule of SPEC was measured for Gemma 4 E2B on v5litepod-1 (SPEC 1). On that
pair they are measured; on any other model or chip they still apply (fail closed), as derived
limits. `plan` labels its figures (settings/model_inputs.plan_sources); `review` and the synth
summary label theirs from here, which reads the same objects: plan_sources for the figures,
the Rule notes (settings/flag_rules.py) for the rules, settings/accelerator_rules.py's ceiling
and settings/measured_rules.py's model-side margins. No fact is restated here.
"""

from __future__ import annotations

from tpuserve.accelerators import MEASURED_ACCELERATOR
from tpuserve.facts import GPU_MEM_CEILING, UNGOVERNED_GIB_AT_CEILING
from tpuserve.settings.accelerator_rules import OUTSIDE_CAP_GIB, memory_ceiling
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.flag_rules import FLAG_RULES
from tpuserve.settings.measured_rules import MEASURED_MODEL, MODEL_SIDE_MARGINS
from tpuserve.settings.model_inputs import plan_sources
from tpuserve.settings.model_profiles import has_mm_items

MEASURED_PAIR = f"{MEASURED_MODEL} on {MEASURED_ACCELERATOR}"
# The key of the line that says which pair a deployment is, first in `derived_figures`.
DEPLOYMENT_KEY = "deployment"


def measured_pair(d: Deployment) -> bool:
    """The model and the chip every SPEC figure was measured on (SPEC 1)."""
    return d.vllm.model == MEASURED_MODEL and d.tpu.accelerator.measured


def pair(d: Deployment) -> str:
    return f"{d.vllm.model} on {d.tpu.accelerator_type}"


def margin(setting: str, d: Deployment) -> str | None:
    """The margin of a measured rule applied to this deployment as a derived limit, where the
    rule has a limit whose size moves with the model or the chip; None on the measured pair."""
    if measured_pair(d):
        return None
    a, model = d.tpu.accelerator, d.vllm.model
    if setting == "vllm.gpu_memory_utilization":
        ceiling = memory_ceiling(a)
        if not ceiling.measured:
            return (f"ceiling {ceiling.value}, keeping {OUTSIDE_CAP_GIB:.2f} GiB per chip "
                    f"outside the cap ({ceiling.source})")
        # The chip is measured, the model is not: E2B's programs set the room left.
        return (f"ceiling {GPU_MEM_CEILING}, keeping {UNGOVERNED_GIB_AT_CEILING} GiB per chip "
                f"outside the cap: what Gemma 4 E2B's compiled programs took on "
                f"{MEASURED_ACCELERATOR} (SPEC 4); {model}'s own are not measured")
    if setting in MODEL_SIDE_MARGINS and model != MEASURED_MODEL:
        # The multimodal floor binds only a deployment with multimodal items and
        # --disable-chunked-mm-input (measured_rules._mm_floor_applies); a text-only one has none.
        v = d.vllm
        if setting == "vllm.max_num_batched_tokens" and not (
                v.disable_chunked_mm_input and has_mm_items(v.limit_mm_per_prompt)):
            return None
        return MODEL_SIDE_MARGINS[setting]
    if setting == "vllm.tensor_parallel_size" and model != MEASURED_MODEL:
        return ("the KV replication cost is computed from this model's num_key_value_heads "
                "(its geometry), not E2B's one KV head")
    return None


# The settings whose derived limit has a margin of its own (margin() above), in this order.
MARGIN_SETTINGS = ("vllm.gpu_memory_utilization", "vllm.max_num_batched_tokens",
                   "vllm.tensor_parallel_size")


def rule_label(setting: str, rule: str, d: Deployment) -> str:
    """A measured rule's text as it applies to this deployment: as it is on the measured
    pair, labelled derived (from the pair it was measured on, with its margin) elsewhere."""
    if measured_pair(d):
        return rule
    out = f"derived for {pair(d)} from the rule measured for {MEASURED_PAIR}: {rule}"
    m = margin(setting, d)
    return out + (f"; margin: {m}" if m else "")


def flag_rule_labels(d: Deployment) -> dict[str, str]:
    """{flag or variable: its rule labelled for this deployment}; {} on the measured pair."""
    if measured_pair(d):
        return {}
    return {name: rule_label(r.setting, r.rule, d) for name, r in FLAG_RULES.items()}


def derived_figures(d: Deployment) -> dict[str, str]:
    """Every figure and rule of the deployment that is not measured, and its source: first
    which pair it is, then plan's sources that are not measured, then the rules' margins.
    {} on the measured pair."""
    if measured_pair(d):
        return {}
    out = {DEPLOYMENT_KEY: (f"{pair(d)} is not the measured pair ({MEASURED_PAIR}, SPEC 1): "
                            "its rules are SPEC's, applied as derived limits")}
    out.update({k: v for k, v in plan_sources(d).items() if not v.startswith("measured")})
    for setting in MARGIN_SETTINGS:
        if (m := margin(setting, d)) is not None:
            out[setting] = f"derived limit; margin: {m}"
    return out


def weights_label(d: Deployment) -> str:
    """The capacity table's label of the weights: measured, the user's figure, or derived."""
    source = plan_sources(d)["weights_bytes"]
    if source.startswith("measured"):
        return "weights (measured)"
    if source.startswith("capacity.weights_gib"):
        return "weights (capacity.weights_gib)"
    return "weights (derived: index total_size)" if source.startswith("derived") else \
        "weights (no source)"
