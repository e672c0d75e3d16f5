"""The alert policies: every query parses, names only current vLLM metrics, and every threshold
is the measured figure it says it derives from."""

from __future__ import annotations

import re

import promql_parser
import pytest

from tpuserve import facts
from tpuserve.render import alerts as a
from tpuserve.render.vllm_metrics import ITL_BUCKETS_S, QUERYABLE, REMOVED, TTFT_BUCKETS_S

ALERTS = a.alerts("tpuserve", idle_hours=2.0)
VLLM_NAME = re.compile(r"vllm:[a-z0-9_]+")


def vllm_names(query: str) -> set[str]:
    return set(VLLM_NAME.findall(query))


@pytest.mark.parametrize("alert", ALERTS, ids=lambda x: x.key)
def test_every_query_parses_and_names_current_metrics(alert) -> None:
    promql_parser.parse(alert.query)
    names = vllm_names(alert.query)
    assert names <= QUERYABLE, names - QUERYABLE
    assert not names & REMOVED


@pytest.mark.parametrize("alert", ALERTS, ids=lambda x: x.key)
def test_every_alert_is_per_stack_and_documented(alert) -> None:
    assert "by (stack)" in alert.query or "by (stack, le)" in alert.query
    assert 'deployment="tpuserve"' in alert.query
    assert alert.severity in {"CRITICAL", "ERROR", "WARNING"}
    assert "SPEC" in alert.basis or "idle_hours" in alert.basis
    assert alert.action and alert.query in alert.documentation
    assert 0 < alert.duration_s <= facts.PROMQL_ALERT_MAX_DURATION_S


def test_the_keys_are_unique_and_stable() -> None:
    assert [x.key for x in ALERTS] == ["not_serving", "queueing", "kv_pressure", "ttft_p95",
                                       "itl_mean", "at_peak", "idle"]


def test_billing_but_not_serving_outlasts_a_cold_boot() -> None:
    # SPEC 4: cold 857 s, warm 497 s; 1.4 x 857 = 1,199.8 -> 1,200 s (whole minutes).
    assert a.NOT_SERVING_FOR_S == 1200
    assert a.NOT_SERVING_FOR_S > facts.COLD_START_S > facts.WARM_START_S
    assert a.NOT_SERVING_FOR_S % 60 == 0
    assert a.NOT_SERVING_FOR_S - facts.COLD_START_S * a.NOT_SERVING_MARGIN < 60


def test_ttft_threshold_is_a_bucket_boundary_between_healthy_and_the_wall() -> None:
    # SPEC 6: worst healthy median 594.4 ms; past the KV wall 11,734 ms.
    assert a.TTFT_P95_WARN_S == 2.5
    assert a.TTFT_P95_WARN_S in TTFT_BUCKETS_S
    assert a.TTFT_P95_WARN_S >= 4 * facts.E2B_WORST_HEALTHY_TTFT_MS / 1000
    assert a.TTFT_P95_WARN_S < facts.E2B_TTFT_PAST_KV_WALL_MS / 1000
    below = [b for b in TTFT_BUCKETS_S if b < a.TTFT_P95_WARN_S]
    assert below[-1] < 4 * facts.E2B_WORST_HEALTHY_TTFT_MS / 1000  # the first one at or above


def test_itl_threshold_and_why_the_mean() -> None:
    # SPEC 6: 21 tok/s per stream at <=1K x 64 clients -> 47.6 ms; x1.5 -> 71.4 -> 75 ms.
    assert pytest.approx(0.075) == a.ITL_MEAN_WARN_S
    assert a.ITL_MEAN_WARN_S >= 1.5 / facts.E2B_SLOWEST_RECOMMENDED_STREAM_TOK_S
    # The measured TPOT (SPEC 5) is below vLLM's lowest ITL bucket: quantiles would be blind.
    assert ITL_BUCKETS_S[0] > facts.E2B_MEASURED_TPOT_MS / 1000
    itl = next(x for x in ALERTS if x.key == "itl_mean")
    assert "_sum" in itl.query and "_count" in itl.query and "histogram_quantile" not in itl.query


def test_capacity_thresholds_from_the_measured_peak_and_the_kv_pool() -> None:
    assert pytest.approx(0.9 * 1496.5) == a.PEAK_WARN_TOK_S
    assert a.PEAK_WARN_TOK_S < facts.E2B_PEAK_OUTPUT_TOK_S
    assert int(0.9 * 321_344) == a.KV_WARN_TOKENS
    kv = next(x for x in ALERTS if x.key == "kv_pressure")
    assert "> 0.9" in kv.query and "vllm:num_preemptions_total" in kv.query


def test_idle_lasts_the_configured_hours() -> None:
    idle = next(x for x in a.alerts("d", idle_hours=1.5) if x.key == "idle")
    assert idle.duration_s == 5400
    assert 'up{deployment="d",job="vllm"}' in idle.query
    with pytest.raises(ValueError, match="idle_hours"):
        a.alerts("d", idle_hours=25)


def test_no_number_in_a_query_is_typed_twice() -> None:
    """Every threshold in the queries is one of the module's derived constants."""
    derived = {str(v) for v in (a.KV_USAGE_WARN, a.TTFT_P95_WARN_S, a.ITL_MEAN_WARN_S,
                                a.PEAK_WARN_TOK_S)} | {"0", "1", "0.95"}
    for alert in ALERTS:
        bare = re.sub(r"\[[0-9]+[smh]\]|\{[^}]*\}", "", alert.query)
        numbers = set(re.findall(r"(?<![\w:.])\d+(?:\.\d+)?(?![\w.])", bare))
        assert numbers <= derived, (alert.key, numbers - derived)
