"""`tpuserve plan --placements` (and `--json`): the placements of the configured model ranked,
through the CLI, with the real price interface (tpuserve.prices.price_of)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import invoke

KEYS = {"accelerator_type", "zone", "region", "provisioning_model", "tensor_parallel_size",
        "usd_per_hour", "output_tokens_per_second", "usd_per_million_tokens", "kv_tokens",
        "flex_start_accepted", "derived", "price_source"}
# `plan --json`'s own keys: --placements adds none to them.
PLAN_KEYS = {
    "bandwidth_efficiency", "base", "batching_gain", "block_size", "blocks_per_request",
    "break_even_hours", "chip", "decode_bytes_per_step", "decode_floor_ms", "expected",
    "flex_premium_usd_per_hour", "hbm_cap_bytes", "hbm_visible_bytes", "hours_per_month",
    "kv_block_tokens", "kv_breakdown", "kv_bytes_per_token", "kv_pool_bytes", "kv_tokens",
    "kv_wall", "layers", "max_model_len_fits", "measured_tpot_ms", "model", "num_blocks",
    "provisioning", "provisioning_model", "rebuild_usd", "settings", "sliding_window_kv_gain",
    "sources", "stack", "throughput", "ungoverned_bytes", "weights_breakdown", "weights_bytes"}


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def placements(*args: str) -> dict[str, Any]:
    result = invoke("plan", "--placements", "--json", *args)
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)  # one JSON object, nothing else
    return data


def test_placements_json_parses_sorted_with_the_interfaces_keys() -> None:
    data = placements()
    rows = data["placements"]
    assert rows, data
    usd = [p["usd_per_million_tokens"] for p in rows]
    assert usd == sorted(usd)
    for p in rows:
        assert p.keys() >= KEYS
        assert p["provisioning_model"] in {"spot", "ondemand", "flex"}
        assert isinstance(p["flex_start_accepted"], bool) and isinstance(p["derived"], list)
        assert isinstance(p["price_source"], str) and p["price_source"]
    assert (data["expected_context"], data["expected_clients"]) == (1024, 16)


def test_the_default_deployments_own_placement_is_spec_6_and_spec_2() -> None:
    rows = placements("--stack", "spot")["placements"]
    own = next(p for p in rows if (p["accelerator_type"], p["zone"], p["provisioning_model"])
               == ("v5litepod-1", "us-west4-a", "spot"))
    assert own["output_tokens_per_second"] == 991.0  # SPEC 6, 1K x 16
    assert own["usd_per_hour"] == 0.5779  # SPEC 2 (the snapshot keeps it in us-west4)
    assert "output_tokens_per_second" not in own["derived"]
    assert "usd_per_hour" not in own["derived"]


def test_plan_json_keeps_its_own_keys() -> None:
    result = invoke("plan", "--json")
    assert result.exit_code == 0, result.stderr
    assert set(json.loads(result.stdout)) == PLAN_KEYS


def test_the_table_marks_each_figure_and_names_what_is_left_out() -> None:
    result = invoke("plan", "--placements")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "m = measured" in out and "d = derived" in out and "v = vendor" in out
    row = next(ln for ln in out.splitlines() if "v5litepod-1" in ln and "us-west4-a" in ln
               and " spot " in ln)
    assert "991.0 m" in row and "$0.5779 m" in row and "$0.162 d" in row
    assert "us-west4-a v" in row  # the zone: Google's regions page, a vendor fact
    # A third-party catalog's price, and Google's flex-start page: vendor, not derived.
    row = next(ln for ln in out.splitlines() if "v6e-1" in ln and "us-east5-a" in ln
               and " spot " in ln)
    assert "$1.3500 v" in row and "yes v" in row
    for n in data_no_zone():
        assert f"no zone {n['accelerator_type']} {n['provisioning_model']} {n['region']}" in out
    # Every placement the table cannot price is named, with its zone; every refused slice too.
    data = placements()
    for u in data["unpriced"]:
        assert any(u["accelerator_type"] in ln and u["zone"] in ln for ln in out.splitlines()
                   if ln.startswith("unpriced"))
    for s in data["skipped"]:
        assert f"skipped {s['why']}" in out


def data_no_zone() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = placements()["no_zone"]
    return rows


def test_plan_without_stack_takes_flex_else_the_first_enabled_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke("plan", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stack"] == "flex"  # the default config: as it was
    (tmp_path / "user.toml").write_text("[stacks.flex]\nenabled = false\n")
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    for args in (("plan", "--json"), ("plan", "--placements", "--json")):
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["stack"] == "spot"  # the kinds' first, enabled
    (tmp_path / "user.toml").write_text(
        "[stacks.flex]\nenabled = false\n[stacks.spot]\nenabled = false\n")
    result = invoke("plan", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stack"] == "ondemand"
    # Asked by name, a switched-off stack is still refused in one line.
    result = invoke("plan", "--json", "--stack", "flex")
    assert result.exit_code == 2 and "not in the configuration" in result.stderr


def test_a_bench_table_is_the_measured_point(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"cells": [
        {"context": 1024, "clients": 16, "output_tokens_per_s": 1100.0}]}))
    data = placements("--throughput", str(bench))
    own = [p for p in data["placements"] if p["accelerator_type"] == "v5litepod-1"]
    assert own and all(p["output_tokens_per_second"] == 1100.0 for p in own)
    assert "--throughput" in data["throughput_reference"]
    four = next(p for p in data["placements"] if p["accelerator_type"] == "v5litepod-4")
    assert "output_tokens_per_second" in four["derived"]
    assert "at 1024x16 (1100 tok/s)" in four["sources"]["output_tokens_per_second"]


def test_a_bad_config_is_refused_in_one_line_with_placements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user.toml").write_text('[vllm]\nmodel = "Qwen/Qwen3-4B"\n')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    result = invoke("plan", "--placements", "--json", "--stack", "spot")
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["ok"] is False


def test_the_planner_page_states_the_default_placement() -> None:
    from tpuserve.paths import REPO_ROOT

    rows = placements("--stack", "spot")["placements"]
    own = next(p for p in rows if (p["accelerator_type"], p["zone"], p["provisioning_model"])
               == ("v5litepod-1", "us-west4-a", "spot"))
    page = " ".join((REPO_ROOT / "docs" / "planner.md").read_text().split())
    assert (f"measured {own['output_tokens_per_second']:,.1f} tok/s at 1,024 x 16 for SPEC 2's "
            f"${own['usd_per_hour']}/h: ${own['usd_per_million_tokens']:.3f} per million "
            "output tokens") in page
    named = ", ".join(f"`{k}`" for k in own["derived"][:-1]) + f" and `{own['derived'][-1]}`"
    assert f"its `derived` holds only {named}" in page
