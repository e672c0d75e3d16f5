"""The vLLM Prometheus metrics tpuserve queries, as vLLM names them today, with their source.

Source: vllm-project/vllm `vllm/v1/metrics/loggers.py`, class `PrometheusStatLogger` (the copy
read for the observability research, 2026, docs/research.md §2; no commit hash was recorded:
the file was read from a stored snapshot). tpu-inference plugs in as vLLM's platform, worker and
model runner; the frontend, scheduler and `PrometheusStatLogger` stay vLLM's own, so
`vllm serve` on `vllm/vllm-tpu` exposes these names (UNVERIFIED on the nightly image: on the
node, `curl -s 127.0.0.1:8001/metrics | grep '^vllm:'`).

In the exposition text and in Google Managed Prometheus a Counter is queried with `_total` and
a Histogram as `_bucket`, `_sum` and `_count`; `QUERYABLE` lists the names as queried. A test
checks that every `vllm:` name in the dashboard and the alerts is one of them, which catches a
rename such as `vllm:time_per_output_token_seconds` (deprecated in 0.11, hidden in 0.12,
removed: vllm PR #32661) or `vllm:gpu_cache_usage_perc` (deprecated in 0.9).
"""

from __future__ import annotations

# name in loggers.py -> Prometheus type (every one carries labels model_name and engine).
GAUGES = frozenset({
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",          # 0..1, "1 means 100 percent usage"
    "vllm:engine_sleep_state",
    "vllm:cache_config_info",
})
COUNTERS = frozenset({
    "vllm:prefix_cache_queries",         # tokens
    "vllm:prefix_cache_hits",            # tokens
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries",             # multimodal items
    "vllm:mm_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",              # label finished_reason
})
HISTOGRAMS = frozenset({
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
})
# Gone: a query naming one of these shows nothing on a current image.
REMOVED = frozenset({"vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"})

QUERYABLE = frozenset(
    GAUGES
    | {f"{c}_total" for c in COUNTERS}
    | {f"{h}{s}" for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
)

# loggers.py's bucket boundaries (seconds) where a threshold is chosen against them.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# The inter-token-latency histogram starts at 10 ms: above the measured 8.02 ms TPOT (SPEC 5),
# so its quantiles only interpolate inside [0, 10 ms] at low load. The mean (_sum/_count) is
# exact, and is what the dashboard and the alert use.
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)

# --- The labels the series carry in Google Managed Prometheus: the contract with the collector.
# The node's collector (templates, boot script) scrapes vLLM in a job named `vllm` and adds
# these labels to every series; the fleet's PodMonitoring must attach the same `deployment`
# and `stack` labels (from the pods' labels) for its replicas to appear in the same panels and
# alerts. `up` is the scrape's own series: 1 while vLLM answers /metrics, 0 while it does not.
VLLM_JOB = "vllm"
LABEL_DEPLOYMENT = "deployment"
LABEL_STACK = "stack"
LABEL_NODE = "node"
LABEL_PROVISIONING_MODEL = "provisioning_model"

# Cloud TPU system metrics (Cloud Monitoring, no agent: docs.cloud.google.com/tpu/docs/
# monitor-tpu), as PromQL names (`.` and `/` become `_`, the first `/` becomes `:`) on the
# monitored resource `tpu_worker`. UNVERIFIED: that `v2-alpha-tpuv5-lite` publishes them, and
# that the resource's `node_id` label carries the TPU node's name.
TPU_RESOURCE = "tpu_worker"
TPU_DUTY_CYCLE = "tpu_googleapis_com:accelerator_duty_cycle"
TPU_TENSORCORE_UTILIZATION = "tpu_googleapis_com:accelerator_tensorcore_utilization"
TPU_HBM_BANDWIDTH_UTILIZATION = "tpu_googleapis_com:accelerator_memory_bandwidth_utilization"
TPU_HBM_USED = "tpu_googleapis_com:accelerator_memory_used"
TPU_HBM_TOTAL = "tpu_googleapis_com:accelerator_memory_total"
TPU_METRICS = frozenset({TPU_DUTY_CYCLE, TPU_TENSORCORE_UTILIZATION,
                         TPU_HBM_BANDWIDTH_UTILIZATION, TPU_HBM_USED, TPU_HBM_TOTAL})


def selector(deployment: str, stack: str | None = None, *, scrape: bool = False) -> str:
    """The label selector of one deployment's vLLM series (one stack's, when named).

    `scrape`: the scrape's own `up` series, which only the job name tells from the collector's
    other scrapes (vLLM's own series have names of their own, so they need no job)."""
    labels = {LABEL_DEPLOYMENT: deployment}
    if stack is not None:
        labels[LABEL_STACK] = stack
    if scrape:
        labels["job"] = VLLM_JOB
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
