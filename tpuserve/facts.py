"""Measured facts, and the fixed names of Google's services we build on, each stated once
(section numbers are docs/measurements.md's).

Everything else imports these: the settings' defaults and rules, the planner, the boot script's
render context, the stacks, the review's notes and the CLI. Pure data, no imports of the project.
"""

from __future__ import annotations

from collections.abc import Mapping

GiB = 2**30

# SPEC 5: resident bf16 weights measured on the chip (`total_hbm_used_gb=8.97GiB`, vision and
# audio towers included).
E2B_WEIGHTS_GIB = 8.97
# SPEC 5: single-stream TPOT measured at max-model-len 32768.
E2B_MEASURED_TPOT_MS = 8.02

# SPEC 4: gpu_memory_utilization: the measured ceiling, the value that died at boot (twice) and
# how many seconds into it; 0.93 and 0.94 are untested (estimated margins ~291 MB and ~127 MB).
# The rules that cite them: tpuserve/settings/measured_rules.py.
GPU_MEM_CEILING = 0.92
GPU_MEM_FATAL = 0.95
GPU_MEM_FATAL_BOOT_S = 691
# SPEC 4: what the server needs outside the cap, per chip: the 1.26 GiB left ungoverned at 0.92
# (compiled XLA programs) and the 384.11 MiB the failing boot at 0.95 asked for there. Another
# chip's derived ceiling keeps both: 1 - (1.26 GiB + 384.11 MiB) / its visible HBM per chip.
UNGOVERNED_GIB_AT_CEILING = 1.26
OUTSIDE_CAP_ASK_MIB = 384.11

# SPEC 4: a cold boot took 857 s (685 s of it XLA compilation); a restart with the compile
# cache mounted took 497 s.
COLD_START_S = 857.0
WARM_START_S = 497.0

# SPEC 4: the XLA compile cache of one configuration, as mounted (one object per cache key in
# the base's bucket); the checkpoint is 9.54 GiB (what the fleet stages into the weights bucket).
COMPILE_CACHE_BYTES = 197_000_000
CHECKPOINT_GIB = 9.54

# List prices (Google's pricing pages, not measured here; the planner says so where it uses
# them): Cloud Storage Standard in a single region such as us-west4, $/GiB-month, and Secret
# Manager, $/active secret version/replica location/month (access calls are cents per 10k).
GCS_STANDARD_USD_PER_GIB_MONTH = 0.023
SECRET_VERSION_USD_PER_MONTH = 0.06

# List prices for the fleet (Google's pricing pages, not measured here; the fleet planner says
# so): GKE's cluster management fee, $/cluster-hour (the free tier's monthly credit covers one
# zonal or Autopilot cluster per billing account; the planner computes without it), and the
# on-demand e2-standard-4 (4 vCPU, 16 GB) in us-west4 that runs the fleet's system node pool.
GKE_CLUSTER_USD_PER_HOUR = 0.10
GKE_FREE_TIER_USD_PER_MONTH = 74.40
MACHINE_USD_PER_HOUR: Mapping[str, float] = {"e2-standard-4": 0.150924}

# SPEC 7: "24/7 for a month (730 h)".
HOURS_PER_MONTH = 730.0

# SPEC 2: $/chip-hour of Cloud TPU v5e in us-west4 (Cloud Billing Catalog, measured): the last
# source tpuserve.prices reads (after [pricing] set by the user, the refreshed Catalog file and
# the shipped snapshot, which keeps these for v5litepod-1 in us-west4). The first three are
# [pricing]'s defaults, which stand in (warned) where no source prices a stack; the
# commitments are the planner's.
PRICES_USD_PER_CHIP_HOUR: Mapping[str, float] = {
    "spot": 0.5779,
    "flex": 0.6000,
    "ondemand": 1.2000,
    "commit-1y": 0.8400,
    "commit-3y": 0.5400,
}

# The one OAuth scope the node's service account and the CLI's credentials ask for; IAM roles,
# not scopes, limit what either may do.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# SPEC 4: one multimodal item needs 2496 tokens with --disable-chunked-mm-input and
# {"image":4,"audio":1}; 2048 failed at boot with this exact error.
MM_ITEM_TOKENS = 2496
# SPEC 4: the 16 values vLLM's --kv-cache-dtype accepts, sorted by what they do on this build.
KV_DTYPES_OK = frozenset({"auto", "bfloat16"})
KV_DTYPES_FP8 = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
KV_DTYPES_FATAL = frozenset({"int8_per_token_head", "fp8_inc", "fp8_ds_mla", "nvfp4"})
KV_DTYPES_UNTESTED = frozenset({"float16", "fp8_per_token_head", "int4_per_token_head"})
# SPEC 5: Gemma 4 E2B has one KV head (MQA).
MODEL_KV_HEADS = 1
IAP_RANGE = "35.235.240.0/20"  # Google's IAP TCP-forwarding range
MAX_FLEX_RUN_SECONDS = 7 * 24 * 3600  # flex-start lasts at most 7 days (SPEC 2)
# The billing guard is a Cloud Tasks task; Cloud Tasks schedules at most 30 days ahead.
MAX_GUARD_RUN_HOURS = 30 * 24
# Where each accelerator is offered, per provisioning model: tpuserve/zones.py.

# SPEC 6: the measured peak aggregate output rate, 128-token context x 64 clients (12 cells x
# 3 reps, cv <= 3.4%). The dashboard draws it as a line; the capacity alert fires near it.
E2B_PEAK_OUTPUT_TOK_S = 1496.5
# SPEC 6: the worst healthy median TTFT measured inside the KV wall (8,192 ctx x 16 clients),
# and the median past the wall (8,192 x 64 = 524,288 requested tokens): "TTFT explodes".
E2B_WORST_HEALTHY_TTFT_MS = 594.4
E2B_TTFT_PAST_KV_WALL_MS = 11_734.0
# SPEC 6: per-stream tokens/s at the slowest recommended operating point (batch, <=1K ctx,
# 64 clients: 21 tok/s per stream, i.e. ~48 ms between tokens).
E2B_SLOWEST_RECOMMENDED_STREAM_TOK_S = 21.0
# SPEC 4/5: the KV pool at max-model-len 32768 (5,021 blocks of 64), the "~321K live KV
# tokens" wall of SPEC 6; and the HBM a healthy node plateaus at (vLLM pre-allocates KV).
E2B_KV_CAPACITY_TOKENS = 321_344
TPU_V5E_HBM_LIMIT_GIB = 15.75
TPU_V5E_HBM_CAP_GIB_AT_092 = 14.49
# Cloud Monitoring: a PromQL alert condition's duration (retest window) is at most 24 h
# (docs.cloud.google.com/monitoring/alerts/using-promql, "Limitations").
PROMQL_ALERT_MAX_DURATION_S = 24 * 3600
