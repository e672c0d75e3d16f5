"""What a dormant base costs per month: the bytes in its buckets and its secret versions.

A base with no serving stack bills no compute: the network, the service accounts, the guard's
queue and the firewall-free VPC are free; what remains is storage (one compile cache of SPEC 4's
197 MB per configuration in use, plus the staged checkpoint once the fleet has staged it) and
Secret Manager's charge per active secret version. Prices are Google's list prices
(tpuserve/facts.py), not measured here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tpuserve.facts import (
    CHECKPOINT_GIB,
    COMPILE_CACHE_BYTES,
    GCS_STANDARD_USD_PER_GIB_MONTH,
    SECRET_VERSION_USD_PER_MONTH,
    GiB,
)


class DormantBase(NamedTuple):
    cache_keys: int
    cache_gib: float
    weights_gib: float
    secret_versions: int
    storage_usd_per_month: float
    secrets_usd_per_month: float

    @property
    def usd_per_month(self) -> float:
        return self.storage_usd_per_month + self.secrets_usd_per_month

    def as_json(self) -> dict[str, Any]:
        return {**self._asdict(), "usd_per_month": round(self.usd_per_month, 4),
                "storage_usd_per_month": round(self.storage_usd_per_month, 4),
                "secrets_usd_per_month": round(self.secrets_usd_per_month, 4),
                "cache_gib": round(self.cache_gib, 4), "weights_gib": round(self.weights_gib, 4),
                "prices": "list prices (tpuserve/facts.py), not measured"}


def dormant_base(*, cache_keys: int = 1, weights_staged: bool = False,
                 secret_versions: int = 2) -> DormantBase:
    """`cache_keys` configurations cached (each a new key: SPEC 4's 197 MB), the checkpoint
    staged or not, and the active secret versions (HF token and API key: one each)."""
    if cache_keys < 0 or secret_versions < 0:
        raise ValueError("cache_keys and secret_versions count things: they are >= 0")
    cache_gib = cache_keys * COMPILE_CACHE_BYTES / GiB
    weights_gib = CHECKPOINT_GIB if weights_staged else 0.0
    return DormantBase(
        cache_keys=cache_keys,
        cache_gib=cache_gib,
        weights_gib=weights_gib,
        secret_versions=secret_versions,
        storage_usd_per_month=(cache_gib + weights_gib) * GCS_STANDARD_USD_PER_GIB_MONTH,
        secrets_usd_per_month=secret_versions * SECRET_VERSION_USD_PER_MONTH,
    )
