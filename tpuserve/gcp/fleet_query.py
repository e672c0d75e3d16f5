"""The fleet preflight's query (`python -m tpuserve.fleet_check preflight`'s stdin, from the
fleet stack's `data.external.fleet_preflight`): what it must hold, checked before any call, and
the GKE tables it is read against. Bad input is UsageError (one line, exit 2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tpuserve.accelerators import ACCELERATORS, V5E
from tpuserve.contracts import MIN_MASTER_VERSION
from tpuserve.kinds import POOL_MODELS

# GKE machine type -> (the TPU accelerator GKE labels its nodes with, chips per node): the
# accelerator table's (tpuserve/accelerators.py; the fleet's node holds the configured slice).
MACHINES: dict[str, tuple[str, int]] = {
    a.machine_type: (a.family.gke_accelerator, a.chips) for a in ACCELERATORS.values()
}
# accelerator -> provisioning model -> the Compute Engine regional quota metric GKE's TPU nodes
# use (GKE's "Plan TPUs in GKE" quota table; the names are compute.v1's Quota.metric enum).
# Spot and flex-start nodes both draw on the preemptible metric. Another chip: one more row.
# v6e has none: compute.v1's Quota.metric enum (the discovery document) names no v6e metric
# (GKE counts v6e against the Cloud Quotas "TPUs per TPU family" quota instead), so a v6e
# fleet's preflight refuses rather than read a quota it cannot see (fail closed).
QUOTA_METRICS: dict[str, dict[str, str]] = {
    V5E.gke_accelerator: {
        "ondemand": "TPU_LITE_PODSLICE_V5",
        "spot": "PREEMPTIBLE_TPU_LITE_PODSLICE_V5",
        "flex": "PREEMPTIBLE_TPU_LITE_PODSLICE_V5",
    },
}


REQUIRED_KEYS = ("project", "region", "zone", "cluster", "release_channel",
                 "min_master_version", "machine_type", "provisioning", "min_replicas",
                 "max_replicas", "apis")
CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
MODELS = POOL_MODELS  # flex, spot, ondemand (tpuserve/kinds)
_PROJECT_RE = re.compile(r"(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
_REGION_RE = re.compile(r"[a-z]+(?:-[a-z]+)*\d+")
_ZONE_RE = re.compile(r"[a-z]+(?:-[a-z]+)*\d+-[a-z]")
_NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")
_API_RE = re.compile(r"[a-z][a-z0-9-]*\.googleapis\.com")
# GKE versions: 1.34.0-gke.1626000 (the only form compared; anything else proves nothing).
_GKE_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)-gke\.(\d+)")


class UsageError(Exception):
    """Bad input (query, environment): one line, exit 2."""


def gke_version(text: str) -> tuple[int, int, int, int] | None:
    """(major, minor, patch, gke build) of a full GKE version, else None."""
    m = _GKE_VERSION_RE.fullmatch(text) if isinstance(text, str) else None
    return (int(m[1]), int(m[2]), int(m[3]), int(m[4])) if m else None


@dataclass(frozen=True)
class Query:
    project: str
    region: str
    zone: str
    cluster: str
    channel: str
    floor: str
    machine_type: str
    provisioning: tuple[str, ...]
    min_replicas: int
    max_replicas: int
    apis: tuple[str, ...]

    @property
    def accelerator(self) -> str:
        return MACHINES[self.machine_type][0]

    @property
    def chips_per_node(self) -> int:
        return MACHINES[self.machine_type][1]


def _int(query: Mapping[str, str], key: str) -> int:
    text = query[key].strip()
    if not re.fullmatch(r"[1-9]\d{0,3}", text):
        raise UsageError(f"preflight: query {key} = {text!r}: a whole number from 1 to 9999")
    return int(text)


def parse_query(text: str) -> Query:
    try:
        query = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"preflight: stdin is not JSON ({exc})") from None
    if not isinstance(query, dict):
        raise UsageError("preflight: stdin must be a JSON object of strings (Terraform's "
                         "external data source query)")
    unknown = sorted(set(query) - set(REQUIRED_KEYS))
    if unknown:
        raise UsageError(f"preflight: unknown query key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(REQUIRED_KEYS)}")
    not_str = sorted(k for k, v in query.items() if not isinstance(v, str))
    if not_str:
        raise UsageError(f"preflight: query value(s) of {', '.join(not_str)} must be strings")
    missing = [k for k in REQUIRED_KEYS if not query.get(k, "").strip()]
    if missing:
        raise UsageError(f"preflight: the query lacks {', '.join(missing)}")
    q = {k: query[k].strip() for k in REQUIRED_KEYS}
    for key, pattern, what in (("project", _PROJECT_RE, "a Google Cloud project id"),
                               ("region", _REGION_RE, "a region (like us-west4)"),
                               ("zone", _ZONE_RE, "a zone (like us-west4-a)"),
                               ("cluster", _NAME_RE, "a GKE cluster name")):
        if not pattern.fullmatch(q[key]):
            raise UsageError(f"preflight: query {key} = {q[key]!r} is not {what}")
    if not q["zone"].startswith(q["region"] + "-"):
        raise UsageError(f"preflight: query zone {q['zone']!r} is not in region {q['region']!r}")
    if q["release_channel"] not in CHANNELS:
        raise UsageError(f"preflight: query release_channel = {q['release_channel']!r}: one of "
                         f"{', '.join(CHANNELS)}")
    if gke_version(q["min_master_version"]) is None:
        raise UsageError(f"preflight: query min_master_version = {q['min_master_version']!r}: "
                         f"a full GKE version like {MIN_MASTER_VERSION}")
    if q["machine_type"] not in MACHINES:
        raise UsageError(f"preflight: query machine_type = {q['machine_type']!r}: known TPU "
                         f"machine types are {', '.join(MACHINES)}")
    models = tuple(m.strip() for m in q["provisioning"].split(","))
    if not models or any(m not in MODELS for m in models) or len(set(models)) != len(models):
        raise UsageError(f"preflight: query provisioning = {q['provisioning']!r}: distinct "
                         f"models of {', '.join(MODELS)}, comma-separated")
    accelerator = MACHINES[q["machine_type"]][0]
    unmapped = [m for m in models if m not in QUOTA_METRICS.get(accelerator, {})]
    if unmapped:
        raise UsageError(f"preflight: no quota metric is known for {accelerator} "
                         f"{', '.join(unmapped)} nodes: compute.v1's Quota.metric (its discovery "
                         "document) names none for it, so regions.get cannot prove the quota "
                         "the node pools draw on; refused rather than planned unchecked "
                         "(tpuserve.gcp.fleet_query.QUOTA_METRICS, docs/fleet.md)")
    lo, hi = _int(q, "min_replicas"), _int(q, "max_replicas")
    if lo > hi:
        raise UsageError(f"preflight: query min_replicas {lo} exceeds max_replicas {hi}")
    apis = tuple(dict.fromkeys(a.strip() for a in q["apis"].split(",") if a.strip()))
    bad = [a for a in apis if not _API_RE.fullmatch(a)]
    if bad or not apis:
        raise UsageError(f"preflight: query apis: {bad[0] if bad else ''!r} is not a service "
                         "name like container.googleapis.com")
    if len(apis) > 30:  # services.batchGet's documented maximum per request
        raise UsageError(f"preflight: query apis: {len(apis)} services, at most 30")
    return Query(q["project"], q["region"], q["zone"], q["cluster"], q["release_channel"],
                 q["min_master_version"], q["machine_type"], models, lo, hi, apis)
