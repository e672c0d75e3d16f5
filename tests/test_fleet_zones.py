"""The fleet's zone verdicts (tpuserve/zones.py POOL_ZONES): GKE TPU node pools per accelerator,
node-pool provisioning model and zone, three states like the TPU VM table; an unknown zone
warns once per pool, a refused one is one line naming the setting that asks for the pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuserve import zones
from tpuserve.kinds import KINDS, POOL_MODELS
from tpuserve.settings import ConfigError, load
from tpuserve.settings.warnings import zone_warnings
from tpuserve.zones import Offer, ZoneFact, pool_zone_fact

FLEET = next(k for k in KINDS if k.on_gke)


def _load(tmp_path: Path, text: str):
    user = tmp_path / "user.toml"
    user.write_text(text)
    return load(environ={"TPUSERVE_CONFIG": str(user)})


def test_the_pool_table_covers_every_accelerator_and_pool_model_with_sources() -> None:
    assert set(zones.POOL_ZONES) == {(a, m) for a in zones.ACCELERATOR_TYPES
                                     for m in POOL_MODELS}
    for facts in zones.POOL_ZONES.values():
        for fact in facts.values():
            assert fact.state is Offer.OFFERED  # nothing read documents a refusal
            assert fact.source.startswith("vendor: Google's 'Plan TPUs in GKE'")
            assert "read 2026-12-02" in fact.source


@pytest.mark.parametrize(("accel", "zone", "state"), [
    ("v5litepod-1", "us-west4-a", Offer.OFFERED),
    ("v5litepod-4", "us-central1-a", Offer.OFFERED),
    ("v6e-1", "us-east5-a", Offer.OFFERED),
    ("v6e-8", "europe-west4-a", Offer.OFFERED),
    ("v6e-1", "us-west4-a", Offer.UNKNOWN),      # v6e is not on the regions page there
    ("v5litepod-8", "us-east5-a", Offer.UNKNOWN),
    ("v5litepod-16", "us-west4-a", Offer.UNKNOWN),  # not in the table at all
])
def test_each_pool_verdict(accel: str, zone: str, state: Offer) -> None:
    for model in POOL_MODELS:
        assert pool_zone_fact(accel, model, zone).state is state


def test_an_unknown_zone_warns_once_per_pool(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '[gcp]\nzone = "us-west4-a"\n[tpu]\naccelerator_type = "v6e-1"\n'
                             '[stacks.fleet.fleet]\nprovisioning = ["spot", "ondemand"]\n')
    warnings = zone_warnings(loaded.deployments[FLEET.name])
    assert [w.split(" acceptance")[0] for w in warnings] == [
        "gcp.zone = 'us-west4-a': the spot GKE node pool",
        "gcp.zone = 'us-west4-a': the on-demand GKE node pool"]
    assert all("known good: us-central1-b, us-east1-d, us-east5-a" in w for w in warnings)
    assert all(f"[stacks.{FLEET.name}] enabled = false" in w for w in warnings)
    # Where the regions page lists the zone, the fleet is quiet (the default included).
    assert zone_warnings(load(environ={}).deployments[FLEET.name]) == []


def test_a_refused_pool_is_one_line_naming_the_setting(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # No refusal is documented for GKE today: one is put in the table to see the message.
    table = {k: dict(v) for k, v in zones.POOL_ZONES.items()}
    table[("v5litepod-1", "spot")]["us-west4-a"] = ZoneFact(Offer.REFUSED, "a test: refused")
    monkeypatch.setattr(zones, "POOL_ZONES", table)
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, "[stacks.fleet.fleet]\nprovisioning = [\"flex\", \"spot\"]\n")
    msg = str(exc.value)
    assert "Traceback" not in msg
    [line] = [x for x in msg.splitlines() if "GKE node pool" in x]
    assert "gcp.zone = 'us-west4-a': the spot GKE node pool does not take v5litepod-1 there" in line
    assert "drop it from fleet.provisioning, or set [stacks.fleet] enabled = false" in line
    assert "(a test: refused)" in line
    # Without the refused pool, the fleet loads.
    assert FLEET.name in _load(tmp_path, '[stacks.fleet.fleet]\nprovisioning = ["flex"]\n'
                               ).deployments
