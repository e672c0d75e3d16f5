"""Every price says where it came from, wherever it is shown: a stand-in (no source prices the
chip-hour) is never shown as SPEC 2's price; SPEC 2's per-chip prices are v5e's in us-west4,
every slice; `plan` carries each price's source, read_at and SKU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from tpuserve.cli import plan as plan_cli
from tpuserve.contracts import DATA_RESOURCE, USD_PER_HOUR_OUTPUT
from tpuserve.planner.fleet_cost import fleet_for
from tpuserve.prices import Price, price_of
from tpuserve.settings import from_raw, load, load_raw
from tpuserve.settings.capacity import plan_for
from tpuserve.synth_summary import main as summary_main
from tpuserve.synth_summary import standin_marks

FLEET_IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
SNAP = "snapshot skypilot-catalog@8427bbf 2026-12-02"


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def _config(tmp_path: Path, text: str) -> dict[str, str]:
    (cfg := tmp_path / "user.toml").write_text(text)
    return {"TPUSERVE_CONFIG": str(cfg)}


def _fleet(environ: dict[str, str]):  # type: ignore[no-untyped-def]
    raw = load_raw(environ=environ)
    raw["stacks"]["fleet"] = {"provisioning_model": "fleet", "vllm": {"image": FLEET_IMAGE}}
    return from_raw(raw).deployments["fleet"]


def _plan(env: dict[str, str], *args: str) -> Result:
    app = typer.Typer()
    plan_cli.register(app)
    app.command("noop", hidden=True)(lambda: None)
    return CliRunner().invoke(app, ["plan", *args], env=env)


def _plan_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    result = _plan(env, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


V6E_EAST5 = '[tpu]\naccelerator_type = "v6e-1"\n[gcp]\nzone = "us-east5-a"\n'


# ------------------------------------------------------------------- A: a stand-in says so
def test_a_stand_in_price_is_not_labelled_spec2(tmp_path: Path) -> None:
    d = load(_config(tmp_path, V6E_EAST5)).deployments["flex"]
    assert price_of("v6e-1", "us-east5", "flex") is None  # no source prices it
    p = d.price
    assert p.usd_per_chip_hour == 0.6 and p.standin
    assert p.source != "SPEC 2" and p.source.startswith("stand-in: ")
    assert "v6e-1 flex in us-east5" in p.source


def test_the_fleet_plan_labels_and_drops_what_a_stand_in_prices(tmp_path: Path) -> None:
    d = _fleet(_config(tmp_path, V6E_EAST5))
    f = fleet_for(d, plan_for(d))
    assert list(f.standins) == ["flex"]  # the first-choice pool; spot has a snapshot price
    data = f.as_json()
    assert data["price_sources"]["flex"].startswith("stand-in: ")
    assert data["price_sources"]["spot"] == SNAP
    assert "stand-in" in data["prices"]
    # The headline comparison would be the stand-in against itself: dropped, saying why.
    assert "against $" not in f.choose_when and "one flex node" not in f.choose_when
    assert "no $ comparison with flex nodes: stand-in: " in f.choose_when


def test_the_fleet_plan_text_marks_the_stand_in_columns(tmp_path: Path) -> None:
    env = _config(tmp_path, V6E_EAST5 + '[stacks.fleet]\nprovisioning_model = "fleet"\n'
                  f'[stacks.fleet.vllm]\nimage = "{FLEET_IMAGE}"\n')
    result = _plan(env, "--stack", "fleet")
    assert result.exit_code == 0, result.stderr
    flat = " ".join(result.stdout.split())
    assert "flex $/chip-hour $0.6000: stand-in: SPEC 2's v5e us-west4 figure" in flat
    assert "for 1 flex node" not in flat
    data = _plan_json(env, "--stack", "fleet")
    assert data["fleet"]["usd_per_chip_hour"]["flex"] == 0.6  # the figure stays, labelled
    assert data["fleet"]["price_sources"]["flex"].startswith("stand-in: ")


def test_the_default_fleet_has_no_stand_in() -> None:
    d = _fleet({})
    f = fleet_for(d, plan_for(d))
    assert f.standins == {} and set(f.price_sources.values()) == {"SPEC 2"}
    assert f.as_json()["prices"] == (
        "list prices (tpuserve/facts.py) for the cluster fee and the system nodes, not "
        "measured; $/chip-hour as the plan's (SPEC 2, [pricing])")
    assert "for 1 flex node(s)" in f.choose_when


def test_the_synth_summary_marks_a_stand_in_price(tmp_path: Path, capsys) -> None:
    env = _config(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n'
                            '[gcp]\nzone = "us-central1-a"\n')
    marks = standin_marks({"flex": {}, "spot": {}, "base": {}}, environ=env)
    assert set(marks) == {"flex"}  # spot has the snapshot's us-central1 price
    assert "stand-in" in marks["flex"] and "v5litepod-4 flex in us-central1" in marks["flex"]
    # The line itself: a queued resource's summary, then its mark.
    out = tmp_path / "out" / "stacks" / "flex"
    out.mkdir(parents=True)
    doc = {"resource": {DATA_RESOURCE: {"qr": {"input": "google/gemma-4-E2B-it v5litepod-4"}}},
           "output": {USD_PER_HOUR_OUTPUT: {"value": 2.4}}}
    (out / "cdk.tf.json").write_text(json.dumps(doc))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPUSERVE_CONFIG", env["TPUSERVE_CONFIG"])
        assert summary_main([str(tmp_path / "out")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("flex"))
    assert "$2.4/h; $/h a stand-in (flex $0.6/chip-hour: SPEC 2's v5e us-west4 figure" in line


def test_the_default_synthesis_has_no_stand_in_mark() -> None:
    assert standin_marks({"spot": {}, "flex": {}, "ondemand": {}}, environ={}) == {}


# --------------------------------------------------- B: SPEC 2 prices every v5e slice there
@pytest.mark.parametrize("accel,chips", [("v5litepod-4", 4), ("v5litepod-8", 8)])
def test_spec2_prices_every_v5e_slice_in_us_west4(accel: str, chips: int) -> None:
    derived = f"SPEC 2 (per chip, x{chips} derived)"
    for model, usd in (("spot", 0.5779), ("flex", 0.6), ("ondemand", 1.2), ("commit-1y", 0.84)):
        assert price_of(accel, "us-west4", model) == Price(usd, derived, "")
    assert price_of("v5litepod-1", "us-west4", "spot") == Price(0.5779, "SPEC 2", "")
    # Another region keeps the snapshot's row.
    assert price_of(accel, "us-central1", "spot").source == SNAP


def test_spot_and_flex_of_one_slice_come_from_one_source(tmp_path: Path) -> None:
    env = _config(tmp_path, '[tpu]\naccelerator_type = "v5litepod-4"\n')
    d = load(env).deployments["spot"]
    assert d.region == "us-west4"
    rebuild = plan_for(d).rebuild
    assert rebuild is not None
    # SPEC 2's measured 3.8%: 4 x (0.6000 - 0.5779), not 4 x (0.60 - 0.48).
    assert rebuild.flex_premium_usd_per_hour == pytest.approx(4 * (0.6 - 0.5779))


# ------------------------------------------------------------- C: plan says each price's source
def test_plan_json_carries_each_prices_source(tmp_path: Path) -> None:
    env = _config(tmp_path, V6E_EAST5 + "[pricing]\nspot = 0.3\n")
    data = _plan_json(env)
    prov = data["provisioning"]
    assert prov["spot"]["price_source"] == "pricing setting" and prov["spot"]["sku"] is None
    assert prov["ondemand"]["price_source"] == SNAP
    assert prov["ondemand"]["read_at"] == "2026-12-02"
    assert "flex" not in prov  # no source prices it: no column (sourced_chip_prices)
    assert data["sources"]["prices"] == f"spot: pricing setting; ondemand: {SNAP}"
    # The text plan names them too.
    result = _plan(env)
    assert result.exit_code == 0, result.stderr
    assert f"prices: spot: pricing setting; ondemand: {SNAP}" in result.stdout


def test_the_default_plan_json_only_gains_the_price_keys() -> None:
    data = _plan_json({})
    for entry in data["provisioning"].values():
        assert (entry["price_source"], entry["read_at"], entry["sku"]) == ("SPEC 2", "", None)
        assert {"usd_per_hour", "usd_per_month", "usd_per_million_output_tokens"} <= set(entry)
    assert data["provisioning"]["spot"]["usd_per_hour"] == 0.5779
    assert data["sources"]["prices"].startswith("measured SPEC 2")
    # Measured: the text plan, which prints only what is not measured, stays as it was.
    assert "prices:" not in _plan({}).stdout
