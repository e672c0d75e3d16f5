"""What a dormant base costs: derived from SPEC 4's cache size and the list prices in facts."""

from __future__ import annotations

import json

import pytest

from tests.cli_support import invoke
from tpuserve.facts import (
    CHECKPOINT_GIB,
    COMPILE_CACHE_BYTES,
    GCS_STANDARD_USD_PER_GIB_MONTH,
    SECRET_VERSION_USD_PER_MONTH,
    GiB,
)
from tpuserve.planner.base_cost import dormant_base


def test_one_cache_and_two_secret_versions() -> None:
    b = dormant_base()
    assert b.secrets_usd_per_month == pytest.approx(2 * SECRET_VERSION_USD_PER_MONTH)
    assert b.storage_usd_per_month == pytest.approx(
        COMPILE_CACHE_BYTES / GiB * GCS_STANDARD_USD_PER_GIB_MONTH)
    assert b.usd_per_month == pytest.approx(b.secrets_usd_per_month + b.storage_usd_per_month)
    # Dormant means cents: under a dollar a month, against SPEC 7's ~$420 of spot compute.
    assert 0.10 < b.usd_per_month < 1.0


def test_staged_weights_and_more_caches_add_storage() -> None:
    more = dormant_base(cache_keys=3, weights_staged=True)
    assert more.weights_gib == CHECKPOINT_GIB
    assert more.storage_usd_per_month == pytest.approx(
        (3 * COMPILE_CACHE_BYTES / GiB + CHECKPOINT_GIB) * GCS_STANDARD_USD_PER_GIB_MONTH)
    with pytest.raises(ValueError):
        dormant_base(cache_keys=-1)


def test_plan_states_the_dormant_base() -> None:
    result = invoke("plan", "--json")
    assert result.exit_code == 0, result.output
    base = json.loads(result.stdout)["base"]
    assert base["deployment"] == "tpuserve"
    assert base["usd_per_month"] == round(dormant_base().usd_per_month, 4)
    table = invoke("plan", "--stack", "spot")
    assert "kept by `cdktf destroy spot`" in table.stdout and "/month dormant" in table.stdout
