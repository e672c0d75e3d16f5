"""The deployment's alert policies: PromQL, thresholds and durations, each derived from a measured
figure in tpuserve/facts.py (section numbers are docs/measurements.md's) or from a named judgment.

Pure data: stacks/monitoring.py turns each `Alert` into one `google_monitoring_alert_policy`
with one `condition_prometheus_query_language`.

One policy per kind for the whole deployment, grouped `by (stack)`, not one per serving stack:
- Cloud Monitoring opens one incident per time series a condition returns, so each stack still
  gets incidents of its own, named by the `stack` label;
- a serving stack holds only its compute (stacks/serving.py), is created and destroyed often,
  and must deploy alone; policies in the base outlive every node and cost nothing while no
  series exists (a stack with no node reports nothing, so nothing fires);
- the fleet's replicas join the same policies by carrying the same labels.
The thresholds are the chip's and the model's, the same on every stack; only the price differs,
and no alert depends on it.

Limits (docs.cloud.google.com/monitoring/alerts/using-promql, "Limitations"): a PromQL
condition's duration is at most 24 h, and its range plus duration at most 25 h; a query naming a
metric Cloud Monitoring does not know yet is refused unless metric validation is disabled, so
every condition disables it (the vLLM series appear only after a node's first scrape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuserve.facts import (
    COLD_START_S,
    E2B_KV_CAPACITY_TOKENS,
    E2B_MEASURED_TPOT_MS,
    E2B_PEAK_OUTPUT_TOK_S,
    E2B_SLOWEST_RECOMMENDED_STREAM_TOK_S,
    E2B_TTFT_PAST_KV_WALL_MS,
    E2B_WORST_HEALTHY_TTFT_MS,
    PROMQL_ALERT_MAX_DURATION_S,
    WARM_START_S,
)
from tpuserve.render.vllm_metrics import TTFT_BUCKETS_S, selector


def _ceil_to(value: float, step: float) -> float:
    return math.ceil(round(value / step, 9)) * step


# --- A1 billing but not serving: longer than a cold boot with a margin, in whole minutes.
# 1.4 x 857 s = 1,199.8 s -> 1,200 s: silent through a legitimate cold compile (SPEC 4), and
# a crash loop or a stuck boot costs at most 20 min of the node before someone hears.
NOT_SERVING_MARGIN = 1.4
NOT_SERVING_FOR_S = int(_ceil_to(COLD_START_S * NOT_SERVING_MARGIN, 60))

# --- A2 queueing: a request waits only when the scheduler cannot admit it (the KV pool is
# full, or max_num_seqs = 256 is reached, SPEC 4); at the measured peak (64 clients) nothing
# waited. Judgment: five minutes of waiting is a trend, not a burst.
QUEUE_FOR_S = 300

# --- A3 KV pressure: past ~321K live KV tokens TTFT goes to 11.7 s (SPEC 6). Judgment: warn at
# 90% of the pool (~289K tokens), or at any preemption (vLLM evicts a running request).
KV_USAGE_WARN = 0.9
KV_WARN_TOKENS = int(KV_USAGE_WARN * E2B_KV_CAPACITY_TOKENS)
KV_FOR_S = 600

# --- A4 TTFT p95: the first vLLM bucket boundary at or above 4x the worst healthy median
# (594.4 ms at 8K ctx x 16 clients, SPEC 6): 2.5 s, an exact boundary (no interpolation), and
# still under the 11.7 s measured past the KV wall.
TTFT_HEALTHY_FACTOR = 4
TTFT_P95_WARN_S = next(b for b in TTFT_BUCKETS_S
                       if b >= TTFT_HEALTHY_FACTOR * E2B_WORST_HEALTHY_TTFT_MS / 1000)
assert TTFT_P95_WARN_S < E2B_TTFT_PAST_KV_WALL_MS / 1000
TTFT_FOR_S = 600

# --- A5 inter-token latency, the exact mean (_sum/_count; vLLM's lowest ITL bucket, 10 ms, is
# above the 8.02 ms TPOT). 1.5x the slowest recommended operating point (21 tok/s per stream
# at <=1K ctx x 64 clients, SPEC 6: 47.6 ms), rounded up to 5 ms: 75 ms, ~9x the 1-client TPOT.
ITL_MARGIN = 1.5
ITL_MEAN_WARN_S = _ceil_to(ITL_MARGIN / E2B_SLOWEST_RECOMMENDED_STREAM_TOK_S, 0.005)
ITL_FOR_S = 600
ITL_REFERENCE_S = E2B_MEASURED_TPOT_MS / 1000  # the dashboard's line

# --- A6 sustained at peak: 90% of the measured chip peak (1,496.5 tok/s, SPEC 6) for 30 min:
# the chip is saturated; time for a second node or the fleet. Judgment: 90%, 30 min.
PEAK_FRACTION = 0.9
PEAK_WARN_TOK_S = round(PEAK_FRACTION * E2B_PEAK_OUTPUT_TOK_S, 2)
PEAK_WINDOW = "15m"
PEAK_FOR_S = 1800

# --- A7 idle but billing: vLLM up, not one token generated for [monitoring] idle_hours.
IDLE_RATE_WINDOW = "10m"

# Every condition is evaluated every minute (the collector scrapes every 15 s; finer buys
# nothing at these durations, and each evaluation is billed).
EVALUATION_INTERVAL_S = 60

# Every policy closes its incident by itself once the condition has been clear this long.
AUTO_CLOSE_S = 1800


@dataclass(frozen=True)
class Alert:
    key: str                 # the Terraform logical id's suffix
    display_name: str
    severity: str            # CRITICAL, ERROR or WARNING (AlertPolicy.Severity)
    query: str               # PromQL, one series per stack when it fires
    duration_s: int
    basis: str               # why this threshold: the measured figure it comes from
    action: str              # what to run

    @property
    def documentation(self) -> str:
        return (
            f"**{self.display_name}** (tpuserve)\n\n"
            "The incident's `stack` label names the serving stack.\n\n"
            f"**Why this threshold:** {self.basis}\n\n"
            f"**What to do:** {self.action}\n\n"
            f"Query: `{self.query}`, for {self.duration_s} s."
        )


def _rate(metric: str, sel: str, window: str = "5m") -> str:
    return f"sum by (stack) (rate({metric}{sel}[{window}]))"


def alerts(deployment: str, *, idle_hours: float) -> list[Alert]:
    """The deployment's alert policies, in a stable order."""
    s = selector(deployment)
    up = selector(deployment, scrape=True)
    idle_s = round(idle_hours * 3600)
    if not 0 < idle_s <= PROMQL_ALERT_MAX_DURATION_S:
        raise ValueError(f"idle_hours = {idle_hours}: the condition lasts (0, 24 h]")
    status = "`tpuserve status STACK` (boot phases), `tpuserve endpoint STACK`"
    return [
        Alert(
            "not_serving", "Billing but not serving", "CRITICAL",
            f"max by (stack) (up{up}) == 0",
            NOT_SERVING_FOR_S,
            f"the node's collector reports vLLM down for longer than {NOT_SERVING_MARGIN}x a "
            f"cold boot ({COLD_START_S:.0f} s; a warm one takes {WARM_START_S:.0f} s, SPEC 4): "
            "the node bills and serves nothing.",
            f"{status}; the boot log on the node (`journalctl -u google-startup-scripts`); "
            "`tpuserve recover STACK` replaces a node that is gone or failed; "
            "`cdktf destroy STACK` stops the billing.",
        ),
        Alert(
            "queueing", "Requests queueing", "WARNING",
            f"sum by (stack) (vllm:num_requests_waiting{s}) > 0",
            QUEUE_FOR_S,
            "a request waits only when the scheduler cannot admit it: the KV pool is full or "
            "max_num_seqs (256) is reached (SPEC 4); nothing waited at the measured peak.",
            "fewer concurrent clients or shorter contexts (SPEC 6: keep clients x context "
            "under ~321K tokens), or more nodes (the fleet).",
        ),
        Alert(
            "kv_pressure", "KV cache pressure", "WARNING",
            f"max by (stack) (vllm:kv_cache_usage_perc{s}) > {KV_USAGE_WARN} "
            f"or {_rate('vllm:num_preemptions_total', s)} > 0",
            KV_FOR_S,
            f"{KV_USAGE_WARN:.0%} of the pool is ~{KV_WARN_TOKENS:,} of its "
            f"{E2B_KV_CAPACITY_TOKENS:,} live KV tokens; past the wall TTFT went to "
            f"{E2B_TTFT_PAST_KV_WALL_MS / 1000:.1f} s (SPEC 6). Any preemption means vLLM "
            "evicted a running request.",
            "cap clients x context under the KV wall (`tpuserve plan`).",
        ),
        Alert(
            "ttft_p95", "Time to first token p95", "WARNING",
            "histogram_quantile(0.95, sum by (stack, le) "
            f"(rate(vllm:time_to_first_token_seconds_bucket{s}[5m]))) > {TTFT_P95_WARN_S}",
            TTFT_FOR_S,
            f"{TTFT_P95_WARN_S} s is vLLM's first TTFT bucket boundary at or above "
            f"{TTFT_HEALTHY_FACTOR}x the worst healthy median measured "
            f"({E2B_WORST_HEALTHY_TTFT_MS} ms, 8K ctx x 16 clients, SPEC 6), and under the "
            f"{E2B_TTFT_PAST_KV_WALL_MS / 1000:.1f} s measured past the KV wall.",
            "check the KV and queue panels; long prompts at high concurrency pass the wall.",
        ),
        Alert(
            "itl_mean", "Inter-token latency (mean)", "WARNING",
            f"{_rate('vllm:inter_token_latency_seconds_sum', s)} / "
            f"{_rate('vllm:inter_token_latency_seconds_count', s)} > {ITL_MEAN_WARN_S}",
            ITL_FOR_S,
            f"{ITL_MARGIN}x the slowest recommended operating point "
            f"({E2B_SLOWEST_RECOMMENDED_STREAM_TOK_S:.0f} tok/s per stream, <=1K ctx x 64 "
            f"clients, SPEC 6), rounded up to 5 ms; the 1-client TPOT is "
            f"{E2B_MEASURED_TPOT_MS} ms (SPEC 5). The mean, not a quantile: vLLM's lowest "
            "ITL bucket (10 ms) is above the measured TPOT.",
            "fewer concurrent streams per node, or more nodes.",
        ),
        Alert(
            "at_peak", "Sustained at the chip's peak", "WARNING",
            f"{_rate('vllm:generation_tokens_total', s, PEAK_WINDOW)} > {PEAK_WARN_TOK_S}",
            PEAK_FOR_S,
            f"{PEAK_FRACTION:.0%} of the measured peak of {E2B_PEAK_OUTPUT_TOK_S:,} output "
            "tok/s (128 ctx x 64 clients, SPEC 6): the chip is saturated.",
            "add a node or move to the fleet; `tpuserve plan`.",
        ),
        Alert(
            "idle", "Idle but billing", "WARNING",
            f"{_rate('vllm:generation_tokens_total', s, IDLE_RATE_WINDOW)} == 0 "
            f"and on (stack) max by (stack) (up{up}) == 1",
            idle_s,
            f"vLLM is up and generated no token for {idle_hours:g} h ([monitoring] "
            "idle_hours): every hour of it is the stack's full $/h (SPEC 7).",
            "`cdktf destroy STACK` if nobody needs it (the compile cache stays in the base, "
            "SPEC 4: the next boot is warm).",
        ),
    ]
