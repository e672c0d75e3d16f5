"""The dashboard JSON: Google's own Dashboard message accepts it, every PromQL query parses and
names only current vLLM metrics, the tiles fit the grid, and every drawn figure is measured."""

from __future__ import annotations

import json
import re

import promql_parser
import pytest
from google.cloud.monitoring_dashboard_v1 import Dashboard
from google.protobuf.json_format import ParseError

from tpuserve import facts
from tpuserve.render import alerts as a
from tpuserve.render.dashboard import (
    COLUMNS,
    StackPrice,
    dashboard,
    dashboard_json,
    dashboard_url,
    usd_per_million_tokens_query,
)
from tpuserve.render.vllm_metrics import QUERYABLE, REMOVED, TPU_METRICS

STACKS = [StackPrice("spot", 0.5779), StackPrice("ondemand", 1.2), StackPrice("flex", 0.6)]
DOC = dashboard("tpuserve-placeholder", "tpuserve", STACKS)
TILES = DOC["mosaicLayout"]["tiles"]


def queries(doc: dict) -> list[str]:
    return [ds["timeSeriesQuery"]["prometheusQuery"]
            for t in doc["mosaicLayout"]["tiles"]
            for ds in t["widget"].get("xyChart", {}).get("dataSets", [])]


def test_googles_dashboard_message_accepts_it() -> None:
    text = dashboard_json("tpuserve-placeholder", "tpuserve", STACKS)
    parsed = Dashboard.from_json(text, ignore_unknown_fields=False)
    assert parsed.display_name == "tpuserve tpuserve: serving"
    assert len(parsed.mosaic_layout.tiles) == len(TILES)


def test_the_schema_check_is_real() -> None:
    bad = dict(DOC, mosaicLayout={"columns": 48, "tiles": [dict(TILES[0], colour="red")]})
    with pytest.raises(ParseError):
        Dashboard.from_json(json.dumps(bad), ignore_unknown_fields=False)
    bad_enum = json.loads(json.dumps(DOC))
    bad_enum["mosaicLayout"]["tiles"][0]["widget"]["xyChart"]["dataSets"][0]["plotType"] = "PIE"
    with pytest.raises(ParseError):
        Dashboard.from_json(json.dumps(bad_enum), ignore_unknown_fields=False)


@pytest.mark.parametrize("query", queries(DOC))
def test_every_query_parses_and_names_current_metrics(query) -> None:
    promql_parser.parse(query)
    names = set(re.findall(r"vllm:[a-z0-9_]+", query))
    assert names <= QUERYABLE and not names & REMOVED, names
    others = set(re.findall(r"tpu_googleapis_com:[a-z_]+", query))
    assert others <= TPU_METRICS


def test_tiles_fit_the_grid_and_do_not_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for t in TILES:
        assert t["xPos"] >= 0 and t["xPos"] + t["width"] <= COLUMNS
        mine = {(x, y) for x in range(t["xPos"], t["xPos"] + t["width"])
                for y in range(t["yPos"], t["yPos"] + t["height"])}
        assert not mine & cells, t["widget"]["title"]
        cells |= mine


def test_the_panels_the_design_asks_for() -> None:
    text = " ".join(queries(DOC))
    for needle in ("up{", "vllm:generation_tokens_total", "vllm:num_requests_running",
                   "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:time_to_first_token_seconds_bucket",
                   "vllm:inter_token_latency_seconds_sum", "vllm:e2e_request_latency_seconds",
                   "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total",
                   "accelerator_duty_cycle", "accelerator_memory_used"):
        assert needle in text, needle
    for q in (0.5, 0.95, 0.99):
        assert f"histogram_quantile({q}, sum by (stack, le) (rate(vllm:time_to_first_token" \
            in text


def thresholds(title_part: str) -> list[float]:
    [tile] = [t for t in TILES if title_part in t["widget"]["title"]]
    return [th["value"] for th in tile["widget"]["xyChart"]["thresholds"]]


def test_reference_lines_are_the_measured_figures() -> None:
    assert facts.E2B_PEAK_OUTPUT_TOK_S in thresholds("Output tokens/s")
    assert a.PEAK_WARN_TOK_S in thresholds("Output tokens/s")
    assert thresholds("Inter-token") == [facts.E2B_MEASURED_TPOT_MS / 1000, a.ITL_MEAN_WARN_S]
    assert thresholds("Time to first token") == [a.TTFT_P95_WARN_S]
    assert thresholds("KV cache") == [a.KV_USAGE_WARN]
    assert thresholds("HBM") == [facts.TPU_V5E_HBM_CAP_GIB_AT_092, facts.TPU_V5E_HBM_LIMIT_GIB]


def test_cost_panel_has_a_line_per_stack_at_its_price() -> None:
    [tile] = [t for t in TILES if t["widget"]["title"].startswith("$ per million")]
    sets = tile["widget"]["xyChart"]["dataSets"]
    assert [s["legendTemplate"] for s in sets] == ["spot", "ondemand", "flex"]
    assert sets[0]["timeSeriesQuery"]["prometheusQuery"] == (
        '0.5779 * count(up{deployment="tpuserve",stack="spot",job="vllm"} == 1) / '
        '(sum(rate(vllm:generation_tokens_total{deployment="tpuserve",stack="spot"}'
        '[15m])) * 3600) * 1e6')


@pytest.mark.parametrize(("stack", "usd"), [("spot", 0.107), ("flex", 0.111),
                                           ("ondemand", 0.223)])
def test_cost_formula_gives_spec7_at_the_peak(stack, usd) -> None:
    """Evaluate the panel's arithmetic with one server up at the measured peak (SPEC 7), and
    with N servers (the fleet) at N times the peak: the same $/M."""
    price = next(s for s in STACKS if s.name == stack)
    q = usd_per_million_tokens_query("tpuserve", price)
    rate = re.search(r"sum\(rate\([^)]*\)\)", q).group(0)
    servers = re.search(r"count\(up\{[^}]*\} == 1\)", q).group(0)
    for n in (1, 4):
        value = eval(q.replace(rate, repr(n * facts.E2B_PEAK_OUTPUT_TOK_S))  # arithmetic left
                     .replace(servers, str(n)))
        assert round(value, 3) == usd


def test_the_url_is_deterministic_and_named_in_the_json() -> None:
    assert DOC["name"] == "projects/tpuserve-placeholder/dashboards/tpuserve-serving"
    assert dashboard_url("tpuserve-placeholder", "tpuserve") == (
        "https://console.cloud.google.com/monitoring/dashboards/custom/tpuserve-serving"
        "?project=tpuserve-placeholder")
