"""Zones per accelerator (tpuserve/zones.py): offered, refused or unknown per provisioning model,
each with its source; a refusal is one line naming `[stacks.NAME] enabled = false`, which
switches a stack off so the rest still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuserve import zones
from tpuserve.cli.common import load_stack
from tpuserve.kinds import KINDS
from tpuserve.ops.errors import OpsError
from tpuserve.settings import ConfigError, from_raw, load, load_raw
from tpuserve.settings.warnings import zone_warnings
from tpuserve.zones import Offer, zone_fact

VM_KINDS = [k for k in KINDS if not k.on_gke]
FLEX = next(k for k in VM_KINDS if k.queued_resource)


def _model(pred) -> str:
    return next(k.provisioning_model for k in VM_KINDS if pred(k))


SPOT = _model(lambda k: k.spot)
STANDARD = _model(lambda k: not (k.spot or k.flex_start))


def test_the_table_covers_every_accelerator_and_tpu_vm_kind() -> None:
    assert set(zones.ZONES) == {(a, k.provisioning_model) for a in zones.ACCELERATOR_TYPES
                                for k in VM_KINDS}
    assert zones.ACCELERATOR_TYPES == ("v5litepod-1", "v5litepod-4", "v5litepod-8",
                                       "v6e-1", "v6e-4", "v6e-8")
    for facts in zones.ZONES.values():
        for fact in facts.values():  # every verdict says where it is from
            assert fact.source.startswith(("SPEC 1: measured", "vendor: Google's",
                                           "third-party: SkyPilot's catalog lists "))
            assert (fact.source.startswith(("SPEC", "third-party"))
                    or "read 2026-12-02" in fact.source)


@pytest.mark.parametrize(("accel", "model", "zone", "state", "source"), [
    # flex-start: measured for v5litepod-1 (SPEC 1), vendor elsewhere, unknown past both.
    ("v5litepod-1", FLEX.provisioning_model, "us-west4-a", Offer.OFFERED, "SPEC 1: measured"),
    ("v5litepod-1", FLEX.provisioning_model, "europe-west4-a", Offer.REFUSED, "SPEC 1"),
    ("v5litepod-1", FLEX.provisioning_model, "europe-west4-b", Offer.REFUSED, "SPEC 1"),
    ("v5litepod-4", FLEX.provisioning_model, "us-central1-a", Offer.OFFERED, "vendor"),
    ("v6e-1", FLEX.provisioning_model, "us-east5-a", Offer.OFFERED, "vendor"),
    ("v5litepod-4", FLEX.provisioning_model, "europe-west4-a", Offer.UNKNOWN, ""),
    ("v6e-8", FLEX.provisioning_model, "us-west4-a", Offer.UNKNOWN, ""),
    # spot and on-demand: Google's regions page, per TPU version.
    ("v5litepod-8", SPOT, "us-west1-c", Offer.OFFERED, "vendor"),
    ("v6e-4", SPOT, "europe-west4-a", Offer.OFFERED, "vendor"),
    ("v6e-1", SPOT, "us-west4-a", Offer.UNKNOWN, ""),
    ("v5litepod-1", STANDARD, "us-west4-a", Offer.OFFERED, "vendor"),
    ("v6e-4", STANDARD, "us-east1-d", Offer.OFFERED, "vendor"),
    ("v5litepod-1", STANDARD, "me-west1-a", Offer.UNKNOWN, ""),
    # Third-party: the zones SkyPilot's catalog lists, for spot and on-demand TPU VMs only.
    ("v5litepod-1", STANDARD, "asia-east1-c", Offer.OFFERED,
     ("third-party: SkyPilot's catalog lists v5litepod-1 there (skypilot-catalog@8427bbf "
      "catalogs/v8/gcp/vms.csv)")),
    ("v5litepod-8", SPOT, "europe-west4-b", Offer.OFFERED, "third-party"),
    ("v6e-8", SPOT, "asia-south1-c", Offer.OFFERED, "third-party"),
    ("v5litepod-1", FLEX.provisioning_model, "asia-east1-c", Offer.UNKNOWN, ""),
    ("v6e-1", FLEX.provisioning_model, "us-south1-a", Offer.UNKNOWN, ""),
    ("v5litepod-16", STANDARD, "us-west4-a", Offer.UNKNOWN, ""),  # not in the table
])
def test_each_state_per_provisioning_model(accel: str, model: str, zone: str, state: Offer,
                                           source: str) -> None:
    fact = zone_fact(accel, model, zone)
    assert fact.state is state
    assert fact.source.startswith(source)


def test_a_measured_fact_stands_over_the_vendor_page() -> None:
    # Google's flex-start page also lists us-west4-a for v5e: the measurement is what is cited.
    assert zones.offered("v5litepod-1", FLEX.provisioning_model)["us-west4-a"].startswith(
        "SPEC 1: measured")
    assert next(iter(zones.offered("v5litepod-1", FLEX.provisioning_model))) == "us-west4-a"


def _user(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "user.toml"
    path.write_text(text)
    return {"TPUSERVE_CONFIG": str(path)}


def test_a_refused_zone_is_one_line_naming_the_switch() -> None:
    with pytest.raises(ConfigError) as err:
        load(environ={"TPUSERVE_ZONE": "europe-west4-b"})
    [problem] = err.value.problems
    assert problem == (
        "[flex] gcp.zone = 'europe-west4-b': flex-start does not take v5litepod-1 there; use "
        "us-west4-a (set TPUSERVE_ZONE), or set [stacks.flex] enabled = false to synthesize "
        "the other stacks without it (SPEC 1: measured, the API answered 'FLEX_START "
        "provisioning model is not supported for accelerator type \"v5litepod-1\"')")


def test_switching_the_refused_stack_off_loads_the_rest(tmp_path: Path) -> None:
    env = _user(tmp_path, "[stacks.flex]\nenabled = false\n") | {
        "TPUSERVE_ZONE": "europe-west4-a"}
    loaded = load(environ=env)
    assert list(loaded.deployments) == ["spot", "ondemand", "fleet"]
    assert loaded.base is not None and loaded.base.gcp.zone == "europe-west4-a"
    # The TPU VMs' zone is offered for v5e there by SkyPilot's catalog (third-party), which
    # says nothing of flex-start: the measured refusal is flex's alone, and it is off.
    assert zone_fact("v5litepod-1", SPOT, "europe-west4-a").source.startswith("third-party")
    assert not any(w.startswith(("[spot] gcp.zone", "[ondemand] gcp.zone"))
                   for w in loaded.warnings)
    assert not any(w.startswith("[flex]") for w in loaded.warnings)


def test_the_default_zone_has_no_zone_warning() -> None:
    loaded = load(environ={})
    assert all(zone_warnings(d) == [] for d in loaded.deployments.values())
    assert not any("gcp.zone" in w for w in loaded.warnings)


def test_an_unknown_zone_warns_in_every_tpu_vm_stack_and_names_the_switch() -> None:
    loaded = load(environ={"TPUSERVE_ZONE": "me-west1-a"})  # no source names v5e there
    for k in VM_KINDS:
        [warning] = zone_warnings(loaded.deployments[k.name])
        assert warning.startswith(f"gcp.zone = 'me-west1-a': {k.title} acceptance of "
                                  "v5litepod-1 is unknown there (known good: ")
        assert f"[stacks.{k.name}] enabled = false" in warning
    # The fleet: one warning per node pool of fleet.provisioning (GKE's own verdicts).
    fleet = loaded.deployments[next(k for k in KINDS if k.on_gke).name]
    warnings = zone_warnings(fleet)
    assert len(warnings) == len(fleet.fleet.provisioning) > 0
    for warning in warnings:
        assert " GKE node pool acceptance of v5litepod-1 is unknown there" in warning
        assert f"[stacks.{fleet.name}] enabled = false" in warning


def test_a_switched_off_stack_checks_only_its_own_keys(tmp_path: Path) -> None:
    # The off stack's bad vLLM section is not its own key: not validated; its own keys are.
    raw = load_raw(environ=_user(
        tmp_path, "[stacks.flex]\nenabled = false\n[stacks.flex.vllm]\nport = 'x'\n"))
    assert "flex" not in from_raw(raw).deployments
    raw["stacks"]["flex"]["max_run_duration"] = "9d"
    with pytest.raises(ConfigError, match=r"max_run_duration = '9d': must be more than 0"):
        from_raw(raw)
    del raw["stacks"]["flex"]["max_run_duration"]
    raw["stacks"]["flex"]["max_run_hour"] = 1  # a typo is refused, off or not
    with pytest.raises(ConfigError) as err:
        from_raw(raw)
    assert err.value.problems == [
        "[flex] stacks.flex.max_run_hour = 1: Extra inputs are not permitted"]


def test_enabled_must_be_a_toml_boolean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(environ=_user(tmp_path, '[stacks.flex]\nenabled = "yes"\n'))
    assert err.value.problems == [(
        "[flex] stacks.flex.enabled = 'yes': Input should be a valid boolean (TOML has types: "
        "write the value without quotes, e.g. 8000 or true)")]


def test_enabled_true_is_the_default(tmp_path: Path) -> None:
    on = load(environ=_user(tmp_path, "[stacks.fleet]\nenabled = true\n"))
    assert on.deployments == load(environ={}).deployments
    assert on.warnings == load(environ={}).warnings  # `enabled` is no ignored key


def test_the_fleet_and_every_serving_stack_off_keeps_the_base(tmp_path: Path) -> None:
    text = "".join(f"[stacks.{k.name}]\nenabled = false\n" for k in KINDS)
    loaded = load(environ=_user(tmp_path, text))
    assert loaded.deployments == {} and loaded.base == load(environ={}).base


def test_an_off_stack_is_not_configured_for_the_cli(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _user(tmp_path, "[stacks.flex]\nenabled = false\n").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TPUSERVE_ZONE", raising=False)
    with pytest.raises(OpsError) as err:
        load_stack("flex")
    # The message a stack missing from the config gets (tpuserve/cli/common.py).
    assert str(err.value) == ("stack 'flex' is not in the configuration (configured: spot, "
                              "ondemand, fleet)")


def test_every_region_the_snapshot_prices_has_its_catalogs_zones() -> None:
    """The snapshot's zones are its source's AvailabilityZone column: each region it prices a
    slice in names at least one zone, and each zone is of a region it has a row for."""
    data = json.loads(zones.SNAPSHOT.read_text())
    listed = zones.catalog_zones()
    for accel, region, *_ in data["rows"]:
        assert any(z.rsplit("-", 1)[0] == region for z in listed[accel]), (accel, region)
    rows = {(a, r) for a, r, *_ in data["rows"]}
    assert all((a, z.rsplit("-", 1)[0]) in rows for a, zs in listed.items() for z in zs)


@pytest.mark.parametrize("body", [
    "not json", json.dumps({"source": "skypilot-catalog@8427bbf"}),
    json.dumps({"source": "skypilot-catalog@8427bbf", "zones": {"v5litepod-16": ["us-west4-a"]}}),
    json.dumps({"source": "skypilot-catalog@8427bbf", "zones": {"v6e-1": ["us-west4"]}}),
    json.dumps({"source": "skypilot-catalog@8427bbf", "zones": {"v6e-1": []}}),
    json.dumps({"source": "another@1", "zones": {"v6e-1": ["us-west4-a"]}}),
])
def test_malformed_snapshot_zones_are_refused(tmp_path: Path, body: str) -> None:
    path = tmp_path / "snapshot.json"
    path.write_text(body)
    with pytest.raises(zones.ZoneDataError):
        zones.catalog_zones(path)
