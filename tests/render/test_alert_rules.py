"""The alert policies' behaviour on synthetic series, judged by Prometheus' own rule tester.

Each policy becomes the Prometheus alerting rule Cloud Monitoring evaluates (its query as
`expr`, its duration as `for`, the policy's evaluation interval), and `promtool test rules`
(Debian's `prometheus` package; .ci/run installs it) replays series a node would report: a
stack that stays down, a cold boot that is not an outage, a burst that is not a trend, and so
on. Every case asks both sides of the threshold: silent just before, firing just after, and
silent on the healthy series beside it.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tpuserve import facts
from tpuserve.render import alerts as a

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is absent (Debian: apt-get install --no-install-recommends prometheus): "
           "the alert rules' behaviour on synthetic series is not checked here")

IDLE_HOURS = 2.0
ALERTS = {x.key: x for x in a.alerts("tpuserve", idle_hours=IDLE_HOURS)}
SPOT = 'deployment="tpuserve",stack="spot"'
FLEX = 'deployment="tpuserve",stack="flex"'
UP = 'up{deployment="tpuserve",stack="%s",job="vllm"}'
FIRES_SPOT = [{"exp_labels": {"stack": "spot"}}]


def minutes(seconds: float) -> int:
    return math.ceil(seconds / 60)


def run_promtool(tmp_path: Path, cases: list[dict]) -> subprocess.CompletedProcess[str]:
    rules = {"groups": [{
        "name": "tpuserve",
        "interval": f"{a.EVALUATION_INTERVAL_S}s",
        "rules": [{"alert": x.key, "expr": x.query, "for": f"{x.duration_s}s"}
                  for x in ALERTS.values()],
    }]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = {"rule_files": ["rules.yaml"],
             "evaluation_interval": f"{a.EVALUATION_INTERVAL_S}s",
             "tests": cases}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)


def case(series: dict[str, str], checks: list[tuple[str, int, list]]) -> dict:
    """Series sampled every minute; each check: (alert key, minute, expected alerts)."""
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [{"eval_time": f"{m}m", "alertname": key, "exp_alerts": exp}
                            for key, m, exp in checks],
    }


def assert_passes(tmp_path: Path, cases: list[dict]) -> None:
    result = run_promtool(tmp_path, cases)
    assert result.returncode == 0, result.stdout + result.stderr


NOT_SERVING_M = minutes(a.NOT_SERVING_FOR_S)
COLD_BOOT_M = minutes(facts.COLD_START_S)


def test_a_stack_that_stays_down_pages_after_the_cold_boot_margin(tmp_path: Path) -> None:
    assert COLD_BOOT_M < NOT_SERVING_M
    assert_passes(tmp_path, [case(
        {UP % "spot": f"0x{NOT_SERVING_M + 10}", UP % "flex": f"1x{NOT_SERVING_M + 10}"},
        [("not_serving", NOT_SERVING_M - 1, []),
         ("not_serving", NOT_SERVING_M + 1, FIRES_SPOT)])])


def test_a_cold_boot_is_not_an_outage(tmp_path: Path) -> None:
    # Down for the whole measured cold boot (SPEC 4, rounded up to the minute), then up.
    assert_passes(tmp_path, [case(
        {UP % "spot": f"0x{COLD_BOOT_M} 1x{NOT_SERVING_M + 10}"},
        [("not_serving", m, []) for m in (COLD_BOOT_M, NOT_SERVING_M + 1, NOT_SERVING_M + 9)])])


def test_queueing_is_a_trend_not_a_burst(tmp_path: Path) -> None:
    m = minutes(a.QUEUE_FOR_S)
    waiting = "vllm:num_requests_waiting{%s}"
    assert_passes(tmp_path, [
        case({waiting % SPOT: f"3x{m + 10}", waiting % FLEX: f"0x{m + 10}"},
             [("queueing", m - 1, []), ("queueing", m + 1, FIRES_SPOT)]),
        case({waiting % SPOT: f"0x2 3x{m - 2} 0x10"},
             [("queueing", m, []), ("queueing", m + 5, [])]),
    ])


def test_kv_pressure_from_usage_or_any_preemption(tmp_path: Path) -> None:
    m = minutes(a.KV_FOR_S)
    usage, preempt = "vllm:kv_cache_usage_perc{%s}", "vllm:num_preemptions_total{%s}"
    over, under = a.KV_USAGE_WARN + 0.05, a.KV_USAGE_WARN - 0.05
    assert_passes(tmp_path, [
        case({usage % SPOT: f"{over}x{m + 10}", preempt % SPOT: f"0x{m + 10}"},
             [("kv_pressure", m - 1, []), ("kv_pressure", m + 1, FIRES_SPOT)]),
        case({usage % SPOT: f"{under}x{m + 10}", preempt % SPOT: f"0x{m + 10}"},
             [("kv_pressure", m + 5, [])]),
        # Pool half full, but vLLM evicts a request every minute.
        case({usage % SPOT: f"0.5x{m + 10}", preempt % SPOT: f"0+1x{m + 10}"},
             [("kv_pressure", m + 5, FIRES_SPOT)]),
    ])


def ttft_series(stack: str, per_minute: dict[str, int]) -> dict[str, str]:
    """Cumulative TTFT buckets growing by `per_minute[le]` requests each minute."""
    name = 'vllm:time_to_first_token_seconds_bucket{%s,le="%s"}'
    return {name % (stack, le): f"0+{n}x30" for le, n in per_minute.items()}


def test_ttft_p95_past_the_threshold_bucket(tmp_path: Path) -> None:
    m = minutes(a.TTFT_FOR_S)
    t = a.TTFT_P95_WARN_S
    i = a.TTFT_BUCKETS_S.index(t)
    below, above = a.TTFT_BUCKETS_S[i - 1], a.TTFT_BUCKETS_S[i + 1]
    # Slow: every request lands between the threshold and the next bucket.
    slow = {str(below): 0, str(t): 0, str(above): 10, "+Inf": 10}
    # Healthy: every request under the bucket below the threshold.
    healthy = {str(below): 10, str(t): 10, str(above): 10, "+Inf": 10}
    assert_passes(tmp_path, [
        case(ttft_series(SPOT, slow), [("ttft_p95", m - 1, []), ("ttft_p95", m + 2, FIRES_SPOT)]),
        case(ttft_series(SPOT, healthy), [("ttft_p95", m + 5, [])]),
    ])


def test_itl_mean_past_the_threshold(tmp_path: Path) -> None:
    m = minutes(a.ITL_FOR_S)
    s, c = "vllm:inter_token_latency_seconds_sum{%s}", "vllm:inter_token_latency_seconds_count{%s}"
    tokens = 6000   # per minute
    slow = round(tokens * a.ITL_MEAN_WARN_S * 1.2, 3)                 # mean 1.2x the threshold
    measured = round(tokens * facts.E2B_MEASURED_TPOT_MS / 1000, 3)   # mean = the measured TPOT
    assert_passes(tmp_path, [
        case({s % SPOT: f"0+{slow}x30", c % SPOT: f"0+{tokens}x30"},
             [("itl_mean", m - 1, []), ("itl_mean", m + 2, FIRES_SPOT)]),
        case({s % SPOT: f"0+{measured}x30", c % SPOT: f"0+{tokens}x30"},
             [("itl_mean", m + 5, [])]),
    ])


def test_sustained_peak_but_not_below_it(tmp_path: Path) -> None:
    # A counter born with the node: its rate reads low until the window has filled, so the
    # condition starts to hold one window after the node starts, and fires `for` later.
    assert a.PEAK_WINDOW.endswith("m")
    m = int(a.PEAK_WINDOW[:-1]) + minutes(a.PEAK_FOR_S)
    tokens = "vllm:generation_tokens_total{%s}"
    at_peak = round(facts.E2B_PEAK_OUTPUT_TOK_S * 60)                 # the measured peak
    busy = round(a.PEAK_WARN_TOK_S * 0.95 * 60)                        # just under the line
    assert_passes(tmp_path, [
        case({tokens % SPOT: f"0+{at_peak}x{m + 20}"},
             [("at_peak", m - 2, []), ("at_peak", m + 2, FIRES_SPOT)]),
        case({tokens % SPOT: f"0+{busy}x{m + 20}"}, [("at_peak", m + 10, [])]),
    ])


def test_idle_but_billing_after_the_configured_hours(tmp_path: Path) -> None:
    m = minutes(IDLE_HOURS * 3600)
    tokens = "vllm:generation_tokens_total{%s}"
    n = m + 30
    assert_passes(tmp_path, [
        # Up and generating nothing.
        case({UP % "spot": f"1x{n}", tokens % SPOT: f"500x{n}"},
             [("idle", m - 1, []), ("idle", m + 15, FIRES_SPOT)]),
        # Up and generating a token a second.
        case({UP % "spot": f"1x{n}", tokens % SPOT: f"0+60x{n}"}, [("idle", m + 15, [])]),
        # Down is not idle: not_serving speaks for it.
        case({UP % "spot": f"0x{n}", tokens % SPOT: f"500x{n}"}, [("idle", m + 15, [])]),
    ])


def test_the_harness_reports_a_wrong_expectation(tmp_path: Path) -> None:
    """A rule that did not fire where the case says it would fails the run."""
    result = run_promtool(tmp_path, [case(
        {UP % "spot": f"0x{NOT_SERVING_M + 10}"},
        [("not_serving", NOT_SERVING_M - 1, FIRES_SPOT)])])
    assert result.returncode != 0
    assert "not_serving" in result.stdout + result.stderr
