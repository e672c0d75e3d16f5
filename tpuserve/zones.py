"""Where each accelerator is offered: for an accelerator type (the TPU API's spelling) and a
provisioning model, a zone is OFFERED, REFUSED or UNKNOWN, each verdict with its source.

Measured facts (SPEC n of docs/measurements.md) stand over vendor ones; Google's published
tables add zones labelled vendor, with the page and the date they were read (a stored copy of
the page; its own age is not known here). Under both, the shipped price snapshot's zones
(SkyPilot's catalog, whose fetcher lists each zone's TPU types from the TPU API) add zones
labelled third-party, for spot and on-demand TPU VMs only: it says nothing of flex-start. A
zone no source names is UNKNOWN: synth warns. Only a measured refusal is REFUSED: a zone missing
from a vendor page or a catalog proves nothing (they lag the API), so it stays UNKNOWN. Pure
data; the provisioning models are read from tpuserve.kinds.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from tpuserve.kinds import KINDS, POOL_MODELS, Kind, by_model


class Offer(Enum):
    OFFERED = "offered"
    REFUSED = "refused"
    UNKNOWN = "unknown"


class ZoneFact(NamedTuple):
    """One verdict for one (accelerator type, provisioning model, zone), and where it is from."""

    state: Offer
    # "SPEC n: measured, ...", "vendor: <page> (<address>), read <date>" or "third-party: ..."
    source: str


UNKNOWN = ZoneFact(Offer.UNKNOWN, "")

# The TPU VM kinds the table is about (a GKE node pool's availability is GKE's, not the TPU
# API's: not in this table), told apart by their capacity flags.
_VM_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if not k.on_gke)
_FLEX = next(k.provisioning_model for k in _VM_KINDS if k.flex_start)
_SPOT = next(k.provisioning_model for k in _VM_KINDS if k.spot)
_STANDARD = next(k.provisioning_model for k in _VM_KINDS if not (k.spot or k.flex_start))
VM_MODELS: tuple[str, ...] = tuple(k.provisioning_model for k in _VM_KINDS)

V5E = ("v5litepod-1", "v5litepod-4", "v5litepod-8")
V6E = ("v6e-1", "v6e-4", "v6e-8")
ACCELERATOR_TYPES: tuple[str, ...] = V5E + V6E

_READ = "read 2026-12-02"
# The zones where "You can create TPU VMs", per TPU version (North America section; the stored
# copy's Europe and Asia sections for v5e could not be read, so they stay unknown).
_REGIONS = ("vendor: Google's 'TPU regions and zones' (docs.cloud.google.com/tpu/docs/"
            f"types-zones), {_READ}")
_REGIONS_EU = ("vendor: Google's 'TPU regions and zones', Europe (cloud.google.com/tpu/docs/"
               f"regions-zones), {_READ}")
# "You can only request Flex-start TPU v6e and v5e in the specified zones".
_FLEX_PAGE = ("vendor: Google's 'Request Cloud TPUs using Flex-start', Limitations "
              f"(cloud.google.com/tpu/docs/request-using-flex-start), {_READ}")
# SPEC 1: the queued resource went ACTIVE in us-west4-a; europe-west4-a and -b refused it.
_MEASURED_OK = "SPEC 1: measured, the queued resource went ACTIVE"
_MEASURED_NO = ("SPEC 1: measured, the API answered 'FLEX_START provisioning model is not "
                'supported for accelerator type "{accel}"\'')

# The shipped price snapshot (tpuserve/prices/snapshot.json): its `zones` are the AvailabilityZone
# column of the rows it prices, per accelerator type. Read as a file, not imported (this module
# sits below tpuserve.prices).
SNAPSHOT = Path(__file__).with_name("prices") / "snapshot.json"
_ORIGIN = "skypilot-catalog@8427bbf catalogs/v8/gcp/vms.csv"
# One label per accelerator ("there": the zone it is attached to), so the generated reference
# groups each accelerator's zones under one source.
THIRD_PARTY = "third-party: SkyPilot's catalog lists {accel} there ({origin})"
_ZONE = re.compile(r"[a-z]+(?:-[a-z]+)+\d{1,2}-[a-z]")

Key = tuple[str, str]  # (accelerator type, provisioning model)


class ZoneDataError(ValueError):
    """The shipped snapshot's zones are not what this module reads (one line)."""


@functools.cache
def catalog_zones(path: Path = SNAPSHOT) -> Mapping[str, tuple[str, ...]]:
    """accelerator type -> the zones the snapshot's source lists it in. Fail closed: an entry
    that is not a known accelerator with a list of zone names raises, never guesses."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ZoneDataError(f"{path}: cannot be read as JSON ({str(exc)[:80]})") from None
    origin = data.get("source") if isinstance(data, dict) else None
    zones = data.get("zones") if isinstance(data, dict) else None
    if not isinstance(zones, dict) or not zones:
        raise ZoneDataError(f"{path}: `zones` missing or not an object")
    out: dict[str, tuple[str, ...]] = {}
    for accel, listed in zones.items():
        if accel not in ACCELERATOR_TYPES:
            raise ZoneDataError(f"{path}: zones[{str(accel)[:40]!r}]: not one of "
                                f"{', '.join(ACCELERATOR_TYPES)}")
        if (not isinstance(listed, list) or not listed
                or not all(isinstance(z, str) and _ZONE.fullmatch(z) for z in listed)):
            raise ZoneDataError(f"{path}: zones[{accel!r}]: not a list of zones like us-west4-a")
        out[accel] = tuple(listed)
    if origin != _ORIGIN.split(" ", 1)[0]:
        raise ZoneDataError(f"{path}: source = {str(origin)[:40]!r}, not {_ORIGIN.split()[0]!r}"
                            " (the zones' label names that source: update both)")
    return out


def _facts() -> dict[Key, dict[str, ZoneFact]]:
    table: dict[Key, dict[str, ZoneFact]] = {
        (a, m): {} for a in ACCELERATOR_TYPES for m in VM_MODELS}

    def add(accels: Iterable[str], models: Iterable[str], zones: Iterable[str],
            fact: ZoneFact) -> None:
        for a in accels:
            for m in models:
                for z in zones:
                    table[(a, m)].setdefault(z, fact)  # the first fact added stands

    # Measured first: it stands over anything a vendor page says.
    add(("v5litepod-1",), (_FLEX,), ("us-west4-a",), ZoneFact(Offer.OFFERED, _MEASURED_OK))
    add(("v5litepod-1",), (_FLEX,), ("europe-west4-a", "europe-west4-b"),
        ZoneFact(Offer.REFUSED, _MEASURED_NO.format(accel="v5litepod-1")))
    # Vendor: the regions page lists TPU VM zones per version, for every TPU VM (on-demand and
    # spot alike: it names no provisioning model).
    vm = (_STANDARD, _SPOT)
    add(V5E, vm, ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
        ZoneFact(Offer.OFFERED, _REGIONS))
    add(V6E, vm, ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"),
        ZoneFact(Offer.OFFERED, _REGIONS))
    add(V6E, vm, ("europe-west4-a",), ZoneFact(Offer.OFFERED, _REGIONS_EU))
    # Vendor: flex-start's own page (v5e in us-west4-a "for training", us-central1-a "for
    # serving"; v6e "for training and serving").
    add(V5E, (_FLEX,), ("us-west4-a",), ZoneFact(Offer.OFFERED, f"{_FLEX_PAGE}: for training"))
    add(V5E, (_FLEX,), ("us-central1-a",), ZoneFact(Offer.OFFERED, f"{_FLEX_PAGE}: for serving"))
    add(V6E, (_FLEX,), ("asia-northeast1-b", "us-east5-a"), ZoneFact(Offer.OFFERED, _FLEX_PAGE))
    # Third-party, under both: the zones SkyPilot's catalog lists each slice in (its fetcher asks
    # the TPU API per zone), for a TPU VM on demand or spot; never flex-start (its own limits).
    for accel, zones in catalog_zones().items():
        for z in zones:
            add((accel,), vm, (z,), ZoneFact(Offer.OFFERED, THIRD_PARTY.format(
                accel=accel, origin=_ORIGIN)))
    return table


ZONES: Mapping[Key, Mapping[str, ZoneFact]] = _facts()


def zone_fact(accelerator_type: str, provisioning_model: str, zone: str) -> ZoneFact:
    """The verdict for one zone; UNKNOWN where no source names it (or the pair is not in the
    table: an accelerator or kind it does not cover)."""
    return ZONES.get((accelerator_type, provisioning_model), {}).get(zone, UNKNOWN)


def offered(accelerator_type: str, provisioning_model: str) -> dict[str, str]:
    """The zones known to offer the pair, measured ones first: zone -> source."""
    facts = ZONES.get((accelerator_type, provisioning_model), {})
    ok = {z: f.source for z, f in facts.items() if f.state is Offer.OFFERED}
    return dict(sorted(ok.items(), key=lambda zs: not zs[1].startswith("SPEC")))


# ------------------------------------------------------------------ GKE node pools (the fleet)
# A GKE TPU node pool is TPU VMs ("TPU VM: A Compute Engine VM running on a physical machine
# with TPU hardware", 'About TPUs in GKE'), and 'Plan TPUs in GKE' asks only that "your cluster
# must be in a supported region for that type": the zones are the regions page's, per TPU
# version, for each node-pool provisioning model alike (neither page names one; no GKE page
# read here lists flex-start's own zones). Nothing read documents a zone as not offering a
# pool, so no GKE verdict is REFUSED: an unlisted zone is UNKNOWN (synth warns).
_GKE = ("vendor: Google's 'Plan TPUs in GKE' (cloud.google.com/kubernetes-engine/docs/concepts/"
        "plan-tpus: the cluster must be in a supported region for the type) with the zones of "
        f"'TPU regions and zones' (docs.cloud.google.com/tpu/docs/types-zones), {_READ}")


def _pool_facts() -> dict[Key, dict[str, ZoneFact]]:
    table: dict[Key, dict[str, ZoneFact]] = {
        (a, m): {} for a in ACCELERATOR_TYPES for m in POOL_MODELS}
    offered_zones = {V5E: ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
                     V6E: ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b",
                           "europe-west4-a")}
    for accels, zones in offered_zones.items():
        for a in accels:
            for m in POOL_MODELS:
                table[(a, m)].update(dict.fromkeys(zones, ZoneFact(Offer.OFFERED, _GKE)))
    return table


POOL_ZONES: Mapping[Key, Mapping[str, ZoneFact]] = _pool_facts()


def pool_zone_fact(accelerator_type: str, pool_model: str, zone: str) -> ZoneFact:
    """The verdict for a GKE TPU node pool of that provisioning model in one zone."""
    return POOL_ZONES.get((accelerator_type, pool_model), {}).get(zone, UNKNOWN)


class StackZone(NamedTuple):
    """One capacity a stack asks of its zone: `what` in messages, the setting that asks for it
    (beside `[stacks.NAME] enabled`), its verdict, and the zones known to offer it."""

    what: str
    setting: str
    fact: ZoneFact
    known_good: Mapping[str, str]


def stack_zones(kind: Kind, accelerator_type: str, zone: str,
                pool_models: Iterable[str] = ()) -> list[StackZone]:
    """Every capacity the stack needs in `zone`: a TPU VM kind its own provisioning model; a
    GKE kind one node pool per model of its `fleet.provisioning` (`pool_models`)."""
    if not kind.on_gke:
        return [StackZone(kind.title, "gcp.zone", zone_fact(
            accelerator_type, kind.provisioning_model, zone), offered(
            accelerator_type, kind.provisioning_model))]
    out = []
    for model in pool_models:
        facts = POOL_ZONES.get((accelerator_type, model), {})
        good = {z: f.source for z, f in facts.items() if f.state is Offer.OFFERED}
        out.append(StackZone(f"the {by_model(model).title} GKE node pool", "fleet.provisioning",
                             pool_zone_fact(accelerator_type, model, zone), good))
    return out
