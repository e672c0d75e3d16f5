"""`tpuserve plan` prices another model or slice by its own derived throughput, never by Gemma 4
E2B's measured SPEC 6 table: every cell scaled from SPEC 6 by bytes per decode step and HBM
bandwidth (planner/throughput.py), labelled derived in the text and in `--json`; the measured
pair (Gemma 4 E2B on v5litepod-1) keeps SPEC 6 exactly, and a `bench` table of the deployment
stays its measured source. The two other models are the shipped files of config/models/ (the
ones tests/test_other_models.py synthesizes), copied beside a user's TPUSERVE_CONFIG."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import invoke
from tpuserve.accelerators import ACCELERATORS
from tpuserve.paths import DEFAULT_CONFIG
from tpuserve.planner.arithmetic import SPEC_THROUGHPUT, load_geometry, usd_per_million_tokens
from tpuserve.planner.throughput import spec6_reference, step_bytes

MODELS = DEFAULT_CONFIG.parent / "models"
INDEX = "model.safetensors.index.json"
IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
SPEC6 = {(c.context, c.clients): c.output_tokens_per_s for c in SPEC_THROUGHPUT.cells}
DERIVED = ("derived: ", ("scaled from measured SPEC 6 (Gemma 4 E2B, v5litepod-1) by bytes "
                         "per decode step and bandwidth"))


@dataclass(frozen=True)
class Case:
    model: str
    accelerator: str
    zone: str
    vllm: str      # the model's other [vllm] settings
    weights: str   # the [capacity] line naming the weights


CASES = {
    "granite-v5e-4": Case("ibm-granite/granite-3b-code-instruct-128k", "v5litepod-4",
                          "us-west4-a", "", f'weights_index = "model/{INDEX}"\n'),
    "gemma2b-v6e-1": Case("google/gemma-2b-it", "v6e-1", "us-east5-a",
                          "max_model_len = 8192\n", "weights_gib = 4.67\n"),
}


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case, extra: str = "",
         tail: str = "") -> None:
    """A user's file naming the model, its slice and its shipped config.json (and index);
    `extra` goes to [capacity], `tail` after every table."""
    (tmp_path / "model").mkdir()
    for name in ("config.json", INDEX):
        shutil.copyfile(MODELS / case.model / name, tmp_path / "model" / name)
    (tmp_path / "user.toml").write_text(
        f'[gcp]\nzone = "{case.zone}"\n[tpu]\naccelerator_type = "{case.accelerator}"\n'
        f'[vllm]\nmodel = "{case.model}"\n{case.vllm}'
        f'[capacity]\n{case.weights}model_geometry = "model/config.json"\n{extra}'
        f'[stacks.fleet.vllm]\nimage = "{IMAGE}"\n{tail}')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))


def plan_json(*args: str) -> dict[str, Any]:
    result = invoke("plan", "--json", *args)
    assert result.exit_code == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def scaled(case: Case, tp: int, context: int, clients: int) -> float:
    """SPEC 6's cell x (its bytes / its bandwidth) / (bytes / bandwidth) for the case."""
    ref = spec6_reference()
    v5e1, here = ACCELERATORS["v5litepod-1"], ACCELERATORS[case.accelerator]
    geometry = load_geometry(MODELS / case.model / "config.json")
    ref_s = step_bytes(ref.geometry, 1, context, clients) / v5e1.family.hbm_bandwidth_bytes_per_s
    step_s = (step_bytes(geometry, tp, context, clients)
              / (here.family.hbm_bandwidth_bytes_per_s * here.chips))
    return SPEC6[(context, clients)] * ref_s / step_s


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Case:
    c = CASES[request.param]
    user(tmp_path, monkeypatch, c)
    return c


def test_every_cell_is_this_models_own_derived_tok_s(case: Case) -> None:
    data = plan_json("--stack", "spot")
    tp = data["settings"]["tensor_parallel_size"]
    assert tp == ACCELERATORS[case.accelerator].chips
    cells = {(c["context"], c["clients"]): c["output_tokens_per_s"] for c in data["throughput"]}
    assert cells.keys() == SPEC6.keys()
    for (context, clients), tok_s in cells.items():
        assert tok_s != SPEC6[(context, clients)], (context, clients)  # never E2B's
        assert math.isclose(tok_s, scaled(case, tp, context, clients)), (context, clients)
    source = data["sources"]["throughput"]
    assert source.startswith(DERIVED[0]) and DERIVED[1] in source, source
    assert case.model in source and case.accelerator in source


def test_every_usd_per_million_figure_follows_the_derived_table(case: Case) -> None:
    data = plan_json("--stack", "spot")
    cells = {f"{c['context']}x{c['clients']}": c["output_tokens_per_s"]
             for c in data["throughput"]}
    for model, cost in data["provisioning"].items():
        for key, usd in cost["usd_per_million_output_tokens"].items():
            assert math.isclose(usd, usd_per_million_tokens(cost["usd_per_hour"], cells[key])), (
                model, key)
    gain = cells["128x64"] / cells["128x1"]
    assert math.isclose(data["batching_gain"]["128"], gain)
    assert not math.isclose(gain, SPEC6[(128, 64)] / SPEC6[(128, 1)])


@pytest.mark.parametrize("name", list(CASES))
def test_plan_and_placements_agree_on_the_cell(name: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A [pricing] rate prices the configured slice in its own region (no source may price v6e).
    case = CASES[name]
    user(tmp_path, monkeypatch, case, tail="[pricing]\nspot = 2.7\n")
    data = plan_json("--stack", "spot")
    (cell,) = [c for c in data["throughput"] if (c["context"], c["clients"]) == (1024, 16)]
    result = invoke("plan", "--placements", "--json", "--stack", "spot")
    assert result.exit_code == 0, result.stderr
    own = [p for p in json.loads(result.stdout)["placements"]
           if p["accelerator_type"] == case.accelerator]
    assert own, "the configured slice is placed"
    assert all(math.isclose(p["output_tokens_per_second"], cell["output_tokens_per_s"])
               for p in own)
    assert all("output_tokens_per_second" in p["derived"] for p in own)


def test_the_expected_load_is_the_derived_figure(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c = CASES["granite-v5e-4"]
    user(tmp_path, monkeypatch, c, "expected_context = 1024\nexpected_clients = 16\n")
    data = plan_json("--stack", "spot")
    assert math.isclose(data["expected"]["output_tokens_per_s"], scaled(c, 4, 1024, 16))
    out = invoke("plan", "--stack", "spot").stdout
    assert "Gemma 4 E2B's measured tok/s" not in out and "measured output tok/s" not in out
    assert "derived output tok/s (d)" in out
    derived_row = next(line for line in out.splitlines() if "derived output tok/s" in line)
    assert f"{scaled(c, 4, 1024, 16):,.1f}" in derived_row


def test_the_text_table_marks_the_tok_s_derived(case: Case) -> None:
    out = invoke("plan", "--stack", "spot").stdout
    assert "tok/s d" in out
    assert "tok/s d = derived: this model's tok/s on this slice" in out
    assert "throughput: derived: " in out
    rows = [line for line in out.splitlines() if line.startswith("│ 1,024 x 16 ")]
    assert len(rows) == 1 and "991.0" not in rows[0]  # SPEC 6's 1K x 16 is E2B's


def test_the_fleet_of_another_model_serves_its_derived_tok_s(case: Case) -> None:
    data = plan_json("--stack", "fleet")
    cells = {(c["context"], c["clients"]): c["output_tokens_per_s"] for c in data["throughput"]}
    fleet = data["fleet"]
    for row in fleet["throughput"]:
        per = row["output_tokens_per_s_per_replica"]
        assert per == cells[(row["context"], row["clients_per_replica"])]
        assert per != SPEC6[(row["context"], row["clients_per_replica"])]
    assert any("derived one-replica tok/s" in a for a in fleet["assumptions"])
    assert not any("measured single-chip tok/s" in a for a in fleet["assumptions"])
    assert "derived peak" in fleet["choose_fleet_when"]
    assert fleet["single_node"]["peak_output_tokens_per_s"] == max(cells.values())
    out = invoke("plan", "--stack", "fleet").stdout
    assert "N x derived tok/s, d" in out and "(N x SPEC 6)" not in out


def test_gemma_4_e2b_on_another_slice_is_derived_too(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user.toml").write_text('[gcp]\nzone = "us-east5-a"\n'
                                        '[tpu]\naccelerator_type = "v6e-1"\n')
    monkeypatch.setenv("TPUSERVE_CONFIG", str(tmp_path / "user.toml"))
    data = plan_json("--stack", "spot")
    # Same model, same TP 1, same bytes per step: only the bandwidth differs.
    v5e, v6e = ACCELERATORS["v5litepod-1"].family, ACCELERATORS["v6e-1"].family
    ratio = v6e.hbm_bandwidth_bytes_per_s / v5e.hbm_bandwidth_bytes_per_s
    for c in data["throughput"]:
        assert math.isclose(c["output_tokens_per_s"], SPEC6[(c["context"], c["clients"])] * ratio)
    assert data["sources"]["throughput"].startswith("derived: google/gemma-4-E2B-it on v6e-1")


def test_the_measured_pair_keeps_spec_6_exactly() -> None:
    data = plan_json("--stack", "spot")
    assert {(c["context"], c["clients"]): c["output_tokens_per_s"]
            for c in data["throughput"]} == SPEC6
    assert data["sources"]["throughput"] == "measured SPEC 6 (Gemma 4 E2B, v5litepod-1)"
    out = invoke("plan", "--stack", "spot").stdout
    assert "tok/s d" not in out and "derived" not in out


def test_a_bench_of_the_deployment_stays_its_measured_source(case: Case,
                                                             tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"cells": [
        {"context": 1024, "clients": 16, "output_tokens_per_s": 777.5},
        {"context": 1024, "clients": 1, "output_tokens_per_s": 77.5}]}))
    data = plan_json("--stack", "spot", "--throughput", str(bench))
    assert [c["output_tokens_per_s"] for c in data["throughput"]] == [777.5, 77.5]
    source = data["sources"]["throughput"]
    assert source.startswith("measured (--throughput ") and case.model in source
    out = invoke("plan", "--stack", "spot", "--throughput", str(bench)).stdout
    assert "tok/s d" not in out and "throughput: " not in out


def test_no_price_column_stands_in_with_another_chips_or_regions_figure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 2's flex and commitment prices are v5e's in us-west4: a v6e plan in us-east5 shows
    only the models a source prices there (the snapshot's spot and on-demand), at its figures."""
    user(tmp_path, monkeypatch, CASES["gemma2b-v6e-1"])
    provisioning = plan_json("--stack", "spot")["provisioning"]
    assert set(provisioning) == {"spot", "ondemand"}, provisioning
    assert provisioning["spot"]["usd_per_hour"] != 0.5779  # not SPEC 2's v5e figure


def test_the_default_plan_prices_every_spec2_model(monkeypatch: pytest.MonkeyPatch) -> None:
    provisioning = plan_json("--stack", "spot")["provisioning"]
    assert {m: p["usd_per_hour"] for m, p in provisioning.items()} == {
        "spot": 0.5779, "flex": 0.6, "ondemand": 1.2, "commit-1y": 0.84, "commit-3y": 0.54}
