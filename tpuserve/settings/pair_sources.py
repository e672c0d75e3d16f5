"""The figures SPEC measured on one pair only (Gemma 4 E2B on v5litepod-1) and what they are
on any other: SPEC 5's TPOT is none elsewhere, SPEC 4's boot times a labelled placeholder.

`plan --json`'s `sources` (settings/model_inputs.plan_sources) reads these, and so do the
text plan, `review` and the synth summary (settings/derived_labels.py).
"""

from __future__ import annotations

from tpuserve.accelerators import MEASURED_ACCELERATOR
from tpuserve.facts import COLD_START_S, E2B_MEASURED_TPOT_MS, WARM_START_S
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.model_profiles import DEFAULT_MODEL

# The key of the boot-time source in `sources` (absent on the measured pair, whose
# `plan --json` is unchanged; review/effects.py reads its presence as "derived").
BOOT_TIMES_KEY = "boot_times"
_PAIR = f"Gemma 4 E2B on {MEASURED_ACCELERATOR}"


def is_measured_pair(d: Deployment) -> bool:
    """The model and the chip SPEC 4-6 measured (SPEC 1)."""
    return d.vllm.model == DEFAULT_MODEL and d.tpu.accelerator.measured


def has_measured_tpot(d: Deployment) -> bool:
    """SPEC 5's TPOT is the measured pair's: on another model or chip there is none."""
    return is_measured_pair(d)


def tpot_source(d: Deployment) -> str:
    if is_measured_pair(d):
        return f"measured SPEC 5 (Gemma 4 E2B, {MEASURED_ACCELERATOR})"
    if d.vllm.model != DEFAULT_MODEL:
        return "none: SPEC 5's TPOT is Gemma 4 E2B's, not this model's"
    return (f"none: SPEC 5's {E2B_MEASURED_TPOT_MS} ms TPOT was measured on "
            f"{MEASURED_ACCELERATOR}, not {d.tpu.accelerator_type}: no share of peak bandwidth "
            "is computed from it")


def boot_times_source(d: Deployment) -> str | None:
    """None on the measured pair (SPEC 4 measured its boots); elsewhere SPEC 4's times as a
    labelled placeholder."""
    if is_measured_pair(d):
        return None
    return (f"derived: {_PAIR}'s measured cold {COLD_START_S:.0f} s / warm {WARM_START_S:.0f} s "
            "boots (SPEC 4), not this model's or chip's: a placeholder until `tpuserve status` "
            "reads this node's boot phases (the rebuild $ and break-even use them)")


def pair_sources(d: Deployment) -> dict[str, str]:
    """`sources`' entries for the pair-only figures, in `plan --json`'s order."""
    out = {"measured_tpot_ms": tpot_source(d)}
    if (boot := boot_times_source(d)) is not None:
        out[BOOT_TIMES_KEY] = boot
    return out
