"""The accelerators tpuserve serves on, as data: each single-host Cloud TPU slice it accepts,
with every fact about it stated once beside its source (docs/accelerators.md lists the same
table; a test keeps the two equal).

A fact is *measured* (docs/measurements.md, "SPEC n"), *vendor* (Google's published figure,
with the page and the date it was read) or *derived* (computed here, from the figures named).
Multi-host slices cannot serve one vLLM server and are refused; so is any name not listed.
Pure data: imports only the measured facts' unit.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tpuserve.facts import GiB

# The Google Cloud TPU pages read for the vendor figures, and when.
READ_ON = "2026-12-02"
V5E_PAGE = f"Google Cloud TPU docs, 'TPU v5e' (cloud.google.com/tpu/docs/v5e), read {READ_ON}"
V6E_PAGE = f"Google Cloud TPU docs, 'TPU v6e' (cloud.google.com/tpu/docs/v6e), read {READ_ON}"
GKE_TPU_PAGE = ("Google Kubernetes Engine docs, 'Plan TPUs in GKE' (machine types and "
                f"gke-tpu-accelerator values), read {READ_ON}")


class Family(NamedTuple):
    """One TPU generation: the per-chip facts every slice of it shares."""

    name: str  # prose: v5e, v6e
    type_prefix: str  # the TPU API's accelerator type is f"{type_prefix}-{chips}"
    gke_accelerator: str  # GKE's cloud.google.com/gke-tpu-accelerator node label
    runtime_version: str  # the TPU VM runtime used when tpu.runtime_version is unset
    runtime_source: str
    hbm_visible_gib: float  # per chip, as the runtime sees it
    hbm_source: str
    hbm_bandwidth_bytes_per_s: float  # per chip
    bandwidth_source: str
    peak_bf16_flops: float  # per chip
    peak_source: str
    # The largest single-host slice: bigger ones span hosts (8 chips per host on both).
    max_single_host_chips: int = 8
    # Slice sizes the TPU API names at all (single- and multi-host).
    api_sizes: tuple[int, ...] = (1, 4, 8, 16, 32, 64, 128, 256)

    @property
    def hbm_visible_bytes(self) -> int:
        return round(self.hbm_visible_gib * GiB)

    @property
    def hbm_measured(self) -> bool:
        return self.hbm_source.startswith("measured")


V5E = Family(
    name="v5e", type_prefix="v5litepod", gke_accelerator="tpu-v5-lite-podslice",
    runtime_version="v2-alpha-tpuv5-lite",
    runtime_source="measured (SPEC 1: the runtime every figure was measured on)",
    hbm_visible_gib=15.75,
    hbm_source="measured (SPEC 5: total_hbm_limit_gb=15.75GiB on v5litepod-1; vendor 16 GB)",
    hbm_bandwidth_bytes_per_s=800.0 * GiB,
    bandwidth_source=("vendor (SPEC 5: 800 GiB/s; the same page now reads 819 GBps, "
                      f"{V5E_PAGE})"),
    peak_bf16_flops=197e12,
    peak_source=f"vendor (SPEC 5: 197 TFLOPS bf16; {V5E_PAGE})",
)

# v6e's visible HBM is derived: the vendor's 32 GB per chip (read as GiB, as SPEC 5 reads
# v5e's 16 GB) times the fraction v5e's runtime was measured to see (15.75 / 16). Not measured.
V6E_NOMINAL_GIB = 32.0
V6E = Family(
    name="v6e", type_prefix="v6e", gke_accelerator="tpu-v6e-slice",
    runtime_version="v2-alpha-tpuv6e",
    runtime_source=("vendor (the v6e runtime in vllm-project/tpu-inference's setup guide, "
                    "docs/mkdocs/javascripts/interactive.js at b8692ff, and in optimum-tpu's "
                    f"TPU hardware page, read {READ_ON}; never booted here)"),
    hbm_visible_gib=V6E_NOMINAL_GIB * V5E.hbm_visible_gib / 16.0,
    hbm_source=(f"derived: vendor 32 GB per chip ({V6E_PAGE}) x 15.75/16, the visible "
                "fraction measured on v5e (SPEC 5); not measured on v6e"),
    hbm_bandwidth_bytes_per_s=1638e9,
    bandwidth_source=f"vendor (1638 GBps per chip; {V6E_PAGE})",
    peak_bf16_flops=918e12,
    peak_source=f"vendor (918 TFLOPs bf16 per chip; {V6E_PAGE})",
)

FAMILIES: tuple[Family, ...] = (V5E, V6E)


class Accelerator(NamedTuple):
    """One single-host slice tpuserve serves on."""

    family: Family
    chips: int
    topology: str  # the TPU API's and GKE's gke-tpu-topology value
    machine_type: str  # GKE's machine type of one node holding the whole slice

    @property
    def accelerator_type(self) -> str:
        return f"{self.family.type_prefix}-{self.chips}"

    @property
    def measured(self) -> bool:
        """Served and measured here (SPEC 1): only v5litepod-1."""
        return self.accelerator_type == MEASURED_ACCELERATOR


MEASURED_ACCELERATOR = "v5litepod-1"  # SPEC 1
# SPEC 1 (measured) for v5litepod-1 / ct5lp-hightpu-1t; the rest GKE's table (vendor).
_SHAPES = ((1, "1x1"), (4, "2x2"), (8, "2x4"))
ACCELERATORS: dict[str, Accelerator] = {
    a.accelerator_type: a for a in (
        *(Accelerator(V5E, n, topo, f"ct5lp-hightpu-{n}t") for n, topo in _SHAPES),
        *(Accelerator(V6E, n, topo, f"ct6e-standard-{n}t") for n, topo in _SHAPES),
    )
}
MACHINE_SOURCE = {a.machine_type: "measured (SPEC 1)" if a.measured else f"vendor ({GKE_TPU_PAGE})"
                  for a in ACCELERATORS.values()}

_TYPE_RE = re.compile(r"([a-z0-9]+)-([0-9]+)")


def multi_host(accelerator_type: str) -> Family | None:
    """The family of a slice the TPU API names but that spans hosts, else None."""
    m = _TYPE_RE.fullmatch(accelerator_type) if isinstance(accelerator_type, str) else None
    if m is None:
        return None
    for f in FAMILIES:
        n = int(m[2])
        if m[1] == f.type_prefix and n in f.api_sizes and n > f.max_single_host_chips:
            return f
    return None


def accelerator(accelerator_type: str) -> Accelerator:
    """The table's row; KeyError for a name it does not hold (the settings refuse those)."""
    return ACCELERATORS[accelerator_type]
