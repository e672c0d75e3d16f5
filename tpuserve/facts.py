"""Measured facts, each stated once (section numbers are ../shared/SPEC.md's).

Everything else imports these: the settings' defaults and rules, the planner, the boot script's
render context, the review's notes and the CLI. Pure data, no imports of the project.
"""

from __future__ import annotations

from collections.abc import Mapping

GiB = 2**30

# SPEC 5: resident bf16 weights measured on the chip (`total_hbm_used_gb=8.97GiB`, vision and
# audio towers included).
E2B_WEIGHTS_GIB = 8.97
# SPEC 5: single-stream TPOT measured at max-model-len 32768.
E2B_MEASURED_TPOT_MS = 8.02

# SPEC 4: gpu_memory_utilization 0.92 is the measured ceiling; 0.95 died 691 s into boot,
# twice; 0.93 and 0.94 are untested (estimated margins ~291 MB and ~127 MB).
GPU_MEM_CEILING = 0.92
GPU_MEM_FATAL = 0.95

# SPEC 4: a cold boot took 857 s (685 s of it XLA compilation); a restart with the compile
# cache mounted took 497 s.
COLD_START_S = 857.0
WARM_START_S = 497.0

# SPEC 7: "24/7 for a month (730 h)".
HOURS_PER_MONTH = 730.0

# SPEC 2: $/chip-hour in us-west4 (Cloud Billing Catalog, measured). The first three are the
# provisioning models' defaults ([pricing] overrides them); the commitments are for the planner.
PRICES_USD_PER_CHIP_HOUR: Mapping[str, float] = {
    "spot": 0.5779,
    "flex": 0.6000,
    "ondemand": 1.2000,
    "commit-1y": 0.8400,
    "commit-3y": 0.5400,
}

# Where the boot script records its phases in guest attributes; the CLI reads them back through
# the TPU API (nodes.getGuestAttributes, queryPath "tpuserve/").
GUEST_ATTRIBUTE_NAMESPACE = "tpuserve"
