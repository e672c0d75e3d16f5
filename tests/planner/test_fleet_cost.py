"""The fleet's cost and throughput (tpuserve/planner/fleet_cost.py): N replicas of the measured
one-chip server, priced per pool, plus the cluster fee and the system pool at list prices."""

from __future__ import annotations

import pytest

from tpuserve.facts import GKE_CLUSTER_USD_PER_HOUR, MACHINE_USD_PER_HOUR
from tpuserve.planner.arithmetic import build_plan, load_geometry
from tpuserve.planner.fleet_cost import FIRST, LAST, fleet_for, fleet_plan
from tpuserve.settings import from_raw, load_raw
from tpuserve.settings.capacity import plan_for

E2 = MACHINE_USD_PER_HOUR["e2-standard-4"]


def _fleet_deployment(**fleet: object):  # type: ignore[no-untyped-def]
    raw = load_raw(environ={})
    raw["stacks"]["fleet"] = {"provisioning_model": "fleet",
                              "vllm": {"image": "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32}}
    if fleet:
        raw["fleet"] = {**raw.get("fleet", {}), **fleet}
    return from_raw(raw).deployments["fleet"]


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    d = _fleet_deployment()
    return plan_for(d)


def test_default_fleet_costs_from_spec_prices(plan) -> None:  # type: ignore[no-untyped-def]
    f = fleet_plan(plan, min_replicas=1, max_replicas=4, provisioning=["flex", "spot"])
    lo, hi = f.costs["min"], f.costs["max"]
    assert lo[FIRST].pool == "flex" and lo[LAST].pool == "spot"
    # min: one flex chip + the cluster fee + one system node.
    assert lo[FIRST].usd_per_hour == pytest.approx(0.60 + GKE_CLUSTER_USD_PER_HOUR + E2)
    assert lo[LAST].usd_per_hour == pytest.approx(0.5779 + 0.10 + E2)
    # max: four chips, one cluster fee, the system pool's three nodes.
    assert hi[FIRST].usd_per_hour == pytest.approx(4 * 0.60 + 0.10 + 3 * E2)
    assert hi[LAST].tpu_usd_per_hour == pytest.approx(4 * 0.5779)
    assert hi[FIRST].usd_per_month == pytest.approx(hi[FIRST].usd_per_hour * 730)
    assert (lo[FIRST].system_nodes, hi[FIRST].system_nodes) == (1, 3)


def test_throughput_scales_by_replicas_per_cell(plan) -> None:  # type: ignore[no-untyped-def]
    f = fleet_plan(plan, min_replicas=1, max_replicas=4, provisioning=["spot"])
    c = f.cell(128, 64)
    assert c is not None
    assert c.at["min"][1] == pytest.approx(1496.5)
    assert c.at["max"][1] == pytest.approx(4 * 1496.5)
    hour = f.costs["max"][FIRST].usd_per_hour
    assert c.at["max"][2][FIRST] == pytest.approx(hour / (4 * 1496.5 * 3600) * 1e6)
    # One pool: both bounds are the same.
    assert c.at["max"][2][FIRST] == c.at["max"][2][LAST]
    # The chips alone would be SPEC 7's $0.107 at spot; the fixed costs add to it, less at 4
    # replicas than at 1 (the system pool grows to 3 nodes, the cluster fee does not).
    assert c.at["max"][2][FIRST] > 0.107
    assert c.at["max"][2][FIRST] < c.at["min"][2][FIRST]


def test_kv_wall_scales_and_the_choose_line(plan) -> None:  # type: ignore[no-untyped-def]
    f = fleet_plan(plan, min_replicas=1, max_replicas=4, provisioning=["flex", "spot"])
    walls = dict(f.kv_wall)
    assert walls[8192] == 39  # SPEC 6: ~321K live KV tokens / 8,192
    j = f.as_json()
    assert j["kv_wall"]["8192"] == {"per_replica": 39, "min": 39, "max": 156}
    line = f.choose_when
    assert "1,496.5 tok/s" in line and "39 at 8,192 ctx" in line
    assert f"${0.10 + E2:.4f}/h" in line  # the overhead over one flex node at min
    assert "5,986 tok/s" in line


def test_json_shape(plan) -> None:  # type: ignore[no-untyped-def]
    j = fleet_plan(plan, min_replicas=1, max_replicas=4, provisioning=["flex", "spot"]).as_json()
    assert set(j) >= {"assumptions", "replicas", "provisioning", "cost", "throughput",
                      "kv_wall", "single_node", "choose_fleet_when", "cluster_usd_per_hour",
                      "cluster_free_tier_applied", "system_usd_per_node_hour",
                      "overhead_usd_per_hour"}
    assert j["cluster_free_tier_applied"] is False
    assert set(j["cost"]) == {"min", "max"} and set(j["cost"]["min"]) == {FIRST, LAST}
    row = next(r for r in j["throughput"] if (r["context"], r["clients_per_replica"]) == (128, 64))
    assert row["max"]["clients"] == 256 and row["max"]["replicas"] == 4
    assert any("evenly spread by the Gateway" in a for a in j["assumptions"])
    assert any("free tier" in a for a in j["assumptions"])


def test_unknown_machine_type_is_not_priced(plan) -> None:  # type: ignore[no-untyped-def]
    f = fleet_plan(plan, min_replicas=1, max_replicas=2, provisioning=["ondemand"],
                   system_machine_type="n2-standard-8")
    c = f.costs["min"][FIRST]
    assert c.system_usd_per_hour is None
    assert c.usd_per_hour == pytest.approx(1.20 + 0.10)
    assert f.as_json()["cost"]["min"][FIRST]["system_usd_per_hour"] is None


def test_bad_arguments() -> None:
    plan = build_plan(load_geometry(_fleet_deployment().capacity.geometry_path))
    with pytest.raises(ValueError, match="min"):
        fleet_plan(plan, min_replicas=3, max_replicas=2, provisioning=["spot"])
    with pytest.raises(ValueError, match="no \\$/chip-hour"):
        fleet_plan(plan, min_replicas=1, max_replicas=2, provisioning=["spot"], prices={})


def test_fleet_for_reads_the_deployment() -> None:
    d = _fleet_deployment(min_replicas=2, max_replicas=6, provisioning=["spot", "ondemand"])
    f = fleet_for(d, plan_for(d))
    assert (f.min_replicas, f.max_replicas, f.provisioning) == (2, 6, ("spot", "ondemand"))
    assert f.costs["max"][LAST].tpu_usd_per_hour == pytest.approx(6 * 1.20)
    assert f.single_node_usd_per_hour == pytest.approx(0.5779)
