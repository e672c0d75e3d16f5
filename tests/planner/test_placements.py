"""planner/placements.py: every placement of the configured model, ranked by $/M output tokens,
each figure measured or derived, with injected price tables (tpuserve.prices is not read)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tpuserve.accelerators import ACCELERATORS
from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR, GiB
from tpuserve.planner.arithmetic import SPEC_THROUGHPUT
from tpuserve.planner.placements import PRICING_SETTING, Placements, build_placements
from tpuserve.planner.throughput import spec6_reference, step_bytes
from tpuserve.prices import Price
from tpuserve.settings import Deployment, load

# The interface's keys (keep them exactly): each placement has at least these.
KEYS = {"accelerator_type", "zone", "region", "provisioning_model", "tensor_parallel_size",
        "usd_per_hour", "output_tokens_per_second", "usd_per_million_tokens", "kv_tokens",
        "flex_start_accepted", "derived", "price_source"}
SPEC2 = dict(PRICES_USD_PER_CHIP_HOUR)  # spot 0.5779, flex 0.6, ondemand 1.2 (us-west4)

# Six query heads: no TP of 4 or 8 divides them. 20 GiB of weights: more than one v5e chip's
# 14.49 GiB cap, less than one v6e chip's. Shaped like a 6-head decoder, no published model.
SIX_HEADS = {"num_hidden_layers": 24, "num_attention_heads": 6, "num_key_value_heads": 2,
             "head_dim": 128, "hidden_size": 768, "intermediate_size": 3072,
             "vocab_size": 32000, "tie_word_embeddings": True}
# Shaped like meta-llama/Llama-3.2-3B-Instruct's published geometry (28 layers, 24/8 heads).
LLAMA = {"num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
         "head_dim": 128, "hidden_size": 3072, "intermediate_size": 8192,
         "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True}


def table(rows: dict[tuple[str, str], dict[str, float]], source: str = "SPEC 2"):
    """A price function over {(accelerator family prefix, region): {model: $/chip-hour}}."""
    def price(accelerator_type: str, region: str, model: str) -> Price | None:
        for (prefix, where), by_model in rows.items():
            if accelerator_type.startswith(prefix) and region == where and model in by_model:
                return Price(by_model[model], source, "2026-12-01")
        return None
    return price


SPEC2_ONLY = table({("v5litepod-", "us-west4"): SPEC2})


def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str = "",
               stack: str = "spot", **geometry: dict) -> Deployment:
    for var in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)
    for name, config in geometry.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(config))
    if toml:
        (tmp_path / "user.toml").write_text(toml)
        monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    else:
        monkeypatch.delenv("TPUSERVE_CONFIG", raising=False)
    return load().deployments[stack]


@pytest.fixture
def default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    return deployment(tmp_path, monkeypatch)


def rows(result: Placements) -> list[tuple[str, str, str]]:
    return [(p.accelerator_type, p.zone, p.provisioning_model) for p in result.placements]


def test_default_models_first_rows_are_spec_7s(default: Deployment) -> None:
    result = build_placements(default, price=SPEC2_ONLY)
    assert (result.context, result.clients) == (1024, 16)
    first, twin = result.placements[:2]
    assert (first.accelerator_type, first.zone, first.provisioning_model) == (
        "v5litepod-1", "us-west4-a", "spot")
    # us-west4-b: the same price, its zone a third-party catalog's (vendor), flex-start unknown.
    assert (twin.zone, twin.provisioning_model, twin.vendor) == ("us-west4-b", "spot", ("zone",))
    second = next(p for p in result.placements if p.provisioning_model == "flex")
    assert (second.accelerator_type, second.zone) == ("v5litepod-1", "us-west4-a")
    # SPEC 6 measured 991.0 tok/s at 1K x 16; SPEC 7's $0.162 (spot) and $0.168 (flex).
    assert first.output_tokens_per_second == 991.0
    assert first.usd_per_hour == 0.5779
    assert round(first.usd_per_million_tokens, 3) == 0.162
    assert round(second.usd_per_million_tokens, 3) == 0.168
    # Everything measured stays off the list: only SPEC 5's and 7's derived figures remain.
    assert first.derived == ("usd_per_million_tokens", "kv_tokens", "kv_wall_clients")
    assert first.vendor == ("zone",) and first.setting == ()  # the regions page names it
    assert first.price_source == "SPEC 2" and first.tensor_parallel_size == 1
    assert first.kv_tokens == 321_563 and first.flex_start_accepted is True


def test_sorted_by_usd_per_million_tokens_across_regions(default: Deployment) -> None:
    cheap_v6e = table({("v5litepod-", "us-west4"): SPEC2,
                       ("v5litepod-", "us-central1"): {"spot": 0.21, "ondemand": 1.2},
                       ("v6e-", "us-east5"): {"spot": 0.5, "flex": 0.9, "ondemand": 2.7}})
    result = build_placements(default, price=cheap_v6e)
    usd = [p.usd_per_million_tokens for p in result.placements]
    assert usd == sorted(usd) and len(set(rows(result))) == len(usd)
    assert rows(result)[0] == ("v5litepod-1", "us-central1-a", "spot")
    assert {p.region for p in result.placements} == {"us-west4", "us-central1", "us-east5"}
    # v6e's 1638 GB/s per chip against v5e's 800 GiB/s: a v6e-1 spot hour at $0.50 serves
    # E2B cheaper per token than v5e's $0.5779 in us-west4 (derived).
    order = rows(result)
    assert order.index(("v6e-1", "us-east5-a", "spot")) < order.index(
        ("v5litepod-1", "us-west4-a", "spot"))


def test_every_entry_has_the_interfaces_keys(default: Deployment) -> None:
    result = build_placements(default, price=table({("v5litepod-", "us-west4"): SPEC2,
                                                    ("v6e-", "us-east5"): SPEC2}))
    for p in result.as_json()["placements"]:
        # The interface's keys, and this module's three more (the wall, and each source).
        assert p.keys() == KEYS | {"kv_wall_clients", "fits_kv_wall", "sources", "vendor",
                                   "setting"}
        assert p["provisioning_model"] in {"spot", "ondemand", "flex"}
        assert isinstance(p["flex_start_accepted"], bool)
        assert isinstance(p["price_source"], str) and p["price_source"]
        labelled = p["derived"] + p["vendor"] + p["setting"]
        assert len(labelled) == len(set(labelled))  # one label per field
        assert set(labelled) <= p.keys() - {"derived", "vendor", "setting", "sources",
                                            "price_source"}
        for name in ("usd_per_hour", "output_tokens_per_second", "usd_per_million_tokens"):
            assert isinstance(p[name], float) and math.isfinite(p[name]) and p[name] > 0
        assert p["region"] == p["zone"].rsplit("-", 1)[0]
        assert math.isclose(p["usd_per_million_tokens"], p["usd_per_hour"] / (
            p["output_tokens_per_second"] * 3600) * 1e6)
        # Every derived figure says what it was derived from.
        assert all(p["sources"][k] for k in p["derived"])


def test_unpriced_placements_are_kept_out_of_the_list(default: Deployment) -> None:
    result = build_placements(default, price=SPEC2_ONLY)
    assert {p.region for p in result.placements} == {"us-west4"}
    out = {(u.accelerator_type, u.zone, u.provisioning_model) for u in result.unpriced}
    assert ("v5litepod-1", "us-central1-a", "spot") in out
    assert ("v6e-1", "us-east5-a", "flex") in out
    assert not out & set(rows(result))
    u = next(u for u in result.unpriced if u.zone == "us-central1-a")
    assert "no price source" in u.why and u.region == "us-central1"


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_price_that_is_no_positive_number_prices_nothing(default: Deployment,
                                                           bad: float) -> None:
    result = build_placements(default, price=table({("v5litepod-", "us-west4"): {
        "spot": bad, "flex": 0.6, "ondemand": 1.2}}))
    assert "spot" not in {p.provisioning_model for p in result.placements}
    assert ("v5litepod-1", "us-west4-a", "spot") in {
        (u.accelerator_type, u.zone, u.provisioning_model) for u in result.unpriced}


def test_flex_start_accepted_per_zone(default: Deployment) -> None:
    result = build_placements(default, price=table({
        ("v5litepod-", "us-west4"): SPEC2, ("v6e-", "us-central1"): SPEC2,
        ("v6e-", "us-east5"): SPEC2}))
    by = {(p.accelerator_type, p.zone, p.provisioning_model): p for p in result.placements}
    # SPEC 1: flex-start went ACTIVE in us-west4-a: accepted, and measured (a spot row too).
    west = by[("v5litepod-1", "us-west4-a", "spot")]
    assert west.flex_start_accepted and "flex_start_accepted" not in west.derived + west.vendor
    # Google's flex-start page names us-east5-a for v6e: accepted, a vendor fact (not derived).
    east = by[("v6e-1", "us-east5-a", "spot")]
    assert east.flex_start_accepted and "flex_start_accepted" in east.vendor
    assert "flex_start_accepted" not in east.derived
    assert east.sources["flex_start_accepted"].startswith("vendor")
    # No source names flex-start in us-central1-b for v6e: not accepted (unknown is no yes),
    # a conclusion drawn here from no source: derived.
    central = by[("v6e-1", "us-central1-b", "spot")]
    assert central.flex_start_accepted is False and "flex_start_accepted" in central.derived
    assert central.sources["flex_start_accepted"].startswith("derived: no source names")
    # A flex row only where the zones table OFFERS flex-start.
    assert ("v6e-1", "us-central1-b", "flex") not in by


def test_a_model_that_fits_only_on_v6e(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment(tmp_path, monkeypatch, (
        '[tpu]\naccelerator_type = "v6e-1"\n[vllm]\nmodel = "example/six-heads"\n'
        'max_model_len = 8192\n[capacity]\nmodel_geometry = "six.json"\nweights_gib = 20\n'),
        six=SIX_HEADS)
    everywhere = table({("v5litepod-", "us-west4"): SPEC2, ("v6e-", "us-east5"): SPEC2})
    result = build_placements(d, price=everywhere)
    assert {p.accelerator_type for p in result.placements} == {"v6e-1"}
    why = {s.accelerator_type: s.why for s in result.skipped}
    assert set(why) == {"v5litepod-1", "v5litepod-4", "v5litepod-8", "v6e-4", "v6e-8"}
    assert "the 20.00 GiB of weights leave no KV pool under its 14.49 GiB cap" in why[
        "v5litepod-1"]
    # A TP that cannot work is skipped with its reason: 4 and 8 do not divide 6 heads.
    for name in ("v5litepod-4", "v5litepod-8", "v6e-4", "v6e-8"):
        assert "does not divide the model's 6 attention heads" in why[name], why[name]
    p = result.placements[0]
    assert "output_tokens_per_second" in p.derived  # not E2B: nothing measured of it
    assert p.sources["output_tokens_per_second"].startswith("derived: measured SPEC 6")


def test_a_request_longer_than_the_pool_skips_the_slice(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # 6 GiB of weights: one v5e chip's 8.49 GiB pool holds ~79K tokens of 114,688 B, less
    # than one 131,072-token request; four v6e chips hold it.
    d = deployment(tmp_path, monkeypatch, (
        '[tpu]\naccelerator_type = "v6e-4"\n[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"'
        '\nmax_model_len = 131072\n[capacity]\nmodel_geometry = "llama.json"\n'
        'weights_gib = 6\n'), llama=LLAMA)
    result = build_placements(d, price=SPEC2_ONLY)
    why = {s.accelerator_type: s.why for s in result.skipped}
    assert "the server would refuse to start" in why["v5litepod-1"]
    assert "v6e-4" not in why


def test_derived_throughput_scales_by_bytes_and_bandwidth(default: Deployment) -> None:
    result = build_placements(default, price=table({("v6e-", "us-east5"): SPEC2}))
    p = next(p for p in result.placements if p.accelerator_type == "v6e-1")
    ref = spec6_reference()
    # Same model, same TP 1, same cell: the bytes per step agree, only the bandwidth differs.
    v5e, v6e = ACCELERATORS["v5litepod-1"].family, ACCELERATORS["v6e-1"].family
    expected = 991.0 * v6e.hbm_bandwidth_bytes_per_s / v5e.hbm_bandwidth_bytes_per_s
    assert math.isclose(p.output_tokens_per_second, expected)
    assert "output_tokens_per_second" in p.derived
    # Weights streamed (SPEC 5: ~3.15 GiB) + every layer's KV read of 1,024 tokens x 16.
    assert 3.4 < step_bytes(ref.geometry, 1, 1024, 16) / GiB < 3.9


def test_an_unmeasured_cell_is_derived_from_the_nearest_measured_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment(tmp_path, monkeypatch,
                   "[capacity]\nexpected_context = 4096\nexpected_clients = 16\n")
    first = build_placements(d, price=SPEC2_ONLY).placements[0]
    assert "output_tokens_per_second" in first.derived
    # 4,096 is nearer 8,192 than 1,024 (in doublings): scaled from SPEC 6's 8K x 16 cell.
    assert "at 8192x16 (399.6 tok/s)" in first.sources["output_tokens_per_second"]
    g = spec6_reference().geometry
    scale = step_bytes(g, 1, 8192, 16) / step_bytes(g, 1, 4096, 16)
    assert math.isclose(first.output_tokens_per_second, 399.6 * scale)
    cell = SPEC_THROUGHPUT.get(8192, 16)
    assert cell is not None and cell.output_tokens_per_s < first.output_tokens_per_second


def test_past_the_kv_wall_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment(tmp_path, monkeypatch,
                   "[capacity]\nexpected_context = 8192\nexpected_clients = 64\n")
    by = {(p.accelerator_type, p.provisioning_model): p
          for p in build_placements(d, price=SPEC2_ONLY).placements}
    one = by[("v5litepod-1", "spot")]
    assert one.output_tokens_per_second == 324.3  # SPEC 6, measured
    assert one.kv_wall_clients == 39 and one.fits_kv_wall is False
    assert by[("v5litepod-8", "spot")].fits_kv_wall is True


def test_pricing_settings_price_only_the_own_accelerator_and_region(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment(tmp_path, monkeypatch, "[pricing]\nspot = 0.4\n")
    result = build_placements(d, price=table({("v5litepod-", "us-west4"): SPEC2,
                                              ("v5litepod-", "us-central1"): SPEC2}))
    by = {(p.accelerator_type, p.zone, p.provisioning_model): p for p in result.placements}
    own = by[("v5litepod-1", "us-west4-a", "spot")]
    assert (own.usd_per_hour, own.price_source) == (0.4, PRICING_SETTING)
    # A setting is neither a measurement nor computed here: labelled a setting.
    assert own.setting == ("usd_per_hour",) and "usd_per_hour" not in own.derived
    assert by[("v5litepod-1", "us-central1-a", "spot")].price_source == "SPEC 2"
    assert by[("v5litepod-4", "us-west4-a", "spot")].usd_per_hour == 4 * 0.5779
    assert by[("v5litepod-1", "us-west4-a", "flex")].price_source == "SPEC 2"  # not set


def test_another_model_ranks_from_its_own_geometry(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment(tmp_path, monkeypatch, (
        '[vllm]\nmodel = "meta-llama/Llama-3.2-3B-Instruct"\n[capacity]\n'
        'model_geometry = "llama.json"\nweights_gib = 5.98\n'), llama=LLAMA)
    result = build_placements(d, price=table({("v5litepod-", "us-west4"): SPEC2,
                                              ("v6e-", "us-east5"): SPEC2}))
    assert not result.skipped  # 24 heads: TP 1, 4 and 8 all divide them
    assert all("output_tokens_per_second" in p.derived for p in result.placements)
    one = next(p for p in result.placements if p.accelerator_type == "v5litepod-1")
    # 28 layers x 8 KV heads x 2 x 128 x 2 B = 114,688 B a token, in a 14.49 - 5.98 GiB pool.
    assert one.kv_tokens == (round(15.75 * GiB * 0.92 // 1) - round(5.98 * GiB)) // 114_688
    assert one.output_tokens_per_second < 991.0  # more bytes per step than E2B's


def test_a_lower_memory_fraction_set_by_the_user_holds_on_every_slice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuserve.settings.capacity import plan_for

    d = deployment(tmp_path, monkeypatch, "[vllm]\ngpu_memory_utilization = 0.85\n")
    result = build_placements(d, price=table({("v5litepod-", "us-west4"): SPEC2,
                                              ("v6e-", "us-east5"): SPEC2}))
    own = next(p for p in result.placements if p.accelerator_type == "v5litepod-1")
    assert own.kv_tokens == plan_for(d).kv_tokens  # the configured slice: plan's own figure
    for p in result.placements:
        assert "gpu_memory_utilization 0.85 (vllm.gpu_memory_utilization)" in p.sources[
            "kv_tokens"]
    # At the default (the slice's ceiling) each slice is planned at its own ceiling instead.
    four = next(p for p in build_placements(deployment(tmp_path, monkeypatch),
                                            price=SPEC2_ONLY).placements
                if p.accelerator_type == "v5litepod-4")
    assert "gpu_memory_utilization 0.89 (derived" in four.sources["kv_tokens"]
