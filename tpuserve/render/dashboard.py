"""The deployment's Cloud Monitoring dashboard: `dashboard_json` for `google_monitoring_dashboard`.

One dashboard per deployment (the base holds it); every vLLM panel draws one line per serving
stack, by the `stack` label the node's collector (and the fleet's PodMonitoring) attaches. The
panels (docs/research.md, observability §4.1): vLLM up, output tokens/s against
the measured peak, running vs waiting, KV-cache use, TTFT p50/p95/p99, the exact mean
inter-token latency, end-to-end and queue latency, preemptions, prefix-cache hit ratio, requests
by finish reason, the TPU chip's duty cycle and HBM, and $ per million output tokens from each
stack's configured $/h and its live token rate. Every figure drawn comes from
tpuserve/facts.py and tpuserve/render/alerts.py; nothing is typed here.

The dashboard's resource name is set in the JSON (`projects/P/dashboards/<deployment>-serving`):
CreateDashboard takes the name when its project matches the parent
(google.cloud.monitoring_dashboard_v1 CreateDashboardRequest), and the provider's diff ignores
`name` (it reads the project back as a number), so the console URL is known before apply and
every serving stack can print it without a reference to the base. UNVERIFIED until the first
apply: that the API keeps the chosen id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuserve.facts import (
    COLD_START_S,
    E2B_PEAK_OUTPUT_TOK_S,
    TPU_V5E_HBM_CAP_GIB_AT_092,
    TPU_V5E_HBM_LIMIT_GIB,
    WARM_START_S,
    GiB,
)
from tpuserve.render import alerts as a
from tpuserve.render.vllm_metrics import (
    TPU_DUTY_CYCLE,
    TPU_HBM_BANDWIDTH_UTILIZATION,
    TPU_HBM_USED,
    TPU_RESOURCE,
    TPU_TENSORCORE_UTILIZATION,
    selector,
)

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

COLUMNS = 48  # mosaicLayout's grid width
WIDTH = 24    # two charts a row
HEIGHT = 16


@dataclass(frozen=True)
class StackPrice:
    """A serving stack the dashboard draws, and what one of its servers costs an hour."""

    name: str
    usd_per_hour: float


def dashboard_id(deployment: str) -> str:
    return f"{deployment}-serving"


def dashboard_name(project: str, deployment: str) -> str:
    return f"projects/{project}/dashboards/{dashboard_id(deployment)}"


def dashboard_url(project: str, deployment: str) -> str:
    return (f"https://console.cloud.google.com/monitoring/dashboards/custom/"
            f"{dashboard_id(deployment)}?project={project}")


def stack_dashboard_url(d: Deployment) -> str:
    """The dashboard a serving stack's outputs and `tpuserve status` link (its deployment's)."""
    return dashboard_url(d.gcp.project, d.gcp.deployment)


def usd_per_million_tokens_query(deployment: str, stack: StackPrice, window: str = "15m") -> str:
    """SPEC 7: $/M output tokens = ($/h) / (tok/s x 3600) x 1e6, with the live token rate; the
    $/h is one server's times the servers up (one node, or the fleet's live replicas)."""
    rate = f"sum(rate(vllm:generation_tokens_total{selector(deployment, stack.name)}[{window}]))"
    servers = f"count(up{selector(deployment, stack.name, scrape=True)} == 1)"
    return f"{stack.usd_per_hour} * {servers} / ({rate} * 3600) * 1e6"


def _data_set(query: str, legend: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "timeSeriesQuery": {"prometheusQuery": query},
        "plotType": "LINE",
        "minAlignmentPeriod": "60s",
    }
    if legend is not None:
        out["legendTemplate"] = legend
    return out


def _threshold(value: float, label: str, color: str = "YELLOW") -> dict[str, Any]:
    return {"value": value, "label": label, "color": color, "direction": "ABOVE"}


def _chart(title: str, sets: Sequence[dict[str, Any]], y_label: str,
           thresholds: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    chart: dict[str, Any] = {
        "dataSets": list(sets),
        "yAxis": {"label": y_label, "scale": "LINEAR"},
    }
    if thresholds:
        chart["thresholds"] = list(thresholds)
    return {"title": title, "xyChart": chart}


def _quantiles(metric: str, sel: str, qs: Sequence[float]) -> list[dict[str, Any]]:
    return [
        _data_set(f"histogram_quantile({q}, sum by (stack, le) "
                  f"(rate({metric}_bucket{sel}[5m])))",
                  f"p{round(q * 100)} ${{metric.labels.stack}}")
        for q in qs
    ]


def widgets(deployment: str, stacks: Sequence[StackPrice]) -> list[dict[str, Any]]:
    s = selector(deployment)
    up = selector(deployment, scrape=True)
    tpu = f'{{monitored_resource="{TPU_RESOURCE}"}}'
    by_stack = "${metric.labels.stack}"
    return [
        _chart("vLLM up (1: answering /metrics)",
               [_data_set(f"max by (stack) (up{up})", by_stack)], "up"),
        _chart("Output tokens/s",
               [_data_set("sum by (stack) (rate(vllm:generation_tokens_total"
                          f"{s}[1m]))", f"output {by_stack}"),
                _data_set(f"sum by (stack) (rate(vllm:prompt_tokens_total{s}[1m]))",
                          f"prompt {by_stack}")],
               "tokens/s",
               [_threshold(E2B_PEAK_OUTPUT_TOK_S, "measured chip peak (SPEC 6)"),
                _threshold(a.PEAK_WARN_TOK_S, "alert: sustained at peak")]),
        _chart("Requests running vs waiting",
               [_data_set(f"sum by (stack) (vllm:num_requests_running{s})",
                          f"running {by_stack}"),
                _data_set(f"sum by (stack) (vllm:num_requests_waiting{s})",
                          f"waiting {by_stack}")],
               "requests"),
        _chart("KV cache use (1 = the whole pool)",
               [_data_set(f"max by (stack) (vllm:kv_cache_usage_perc{s})", by_stack)],
               "fraction", [_threshold(a.KV_USAGE_WARN, "alert: KV pressure")]),
        _chart("Time to first token",
               _quantiles("vllm:time_to_first_token_seconds", s, (0.5, 0.95, 0.99)),
               "seconds", [_threshold(a.TTFT_P95_WARN_S, "alert: p95", "RED")]),
        _chart("Inter-token latency, exact mean (sum/count)",
               [_data_set(f"sum by (stack) (rate(vllm:inter_token_latency_seconds_sum{s}[5m]))"
                          " / sum by (stack) (rate(vllm:inter_token_latency_seconds_count"
                          f"{s}[5m]))", by_stack)],
               "seconds",
               [_threshold(a.ITL_REFERENCE_S, "measured 1-client TPOT (SPEC 5)"),
                _threshold(a.ITL_MEAN_WARN_S, "alert: mean ITL", "RED")]),
        _chart("End-to-end and queue latency",
               [*_quantiles("vllm:e2e_request_latency_seconds", s, (0.5, 0.95)),
                _data_set("histogram_quantile(0.95, sum by (stack, le) "
                          f"(rate(vllm:request_queue_time_seconds_bucket{s}[5m])))",
                          f"queue p95 {by_stack}")],
               "seconds"),
        _chart("Preemptions/s (KV evictions)",
               [_data_set(f"sum by (stack) (rate(vllm:num_preemptions_total{s}[5m]))",
                          by_stack)], "1/s"),
        _chart("Prefix-cache hit ratio (tokens)",
               [_data_set(f"sum by (stack) (rate(vllm:prefix_cache_hits_total{s}[5m])) / "
                          f"sum by (stack) (rate(vllm:prefix_cache_queries_total{s}[5m]))",
                          by_stack)], "fraction"),
        _chart("Requests/s by finish reason",
               [_data_set("sum by (stack, finished_reason) "
                          f"(rate(vllm:request_success_total{s}[5m]))",
                          "${metric.labels.finished_reason} " + by_stack)], "1/s"),
        _chart("TPU duty cycle and utilization (%)",
               [_data_set(f"avg by (node_id) ({TPU_DUTY_CYCLE}{tpu})",
                          "duty cycle ${metric.labels.node_id}"),
                _data_set(f"avg by (node_id) ({TPU_TENSORCORE_UTILIZATION}{tpu})",
                          "tensorcore ${metric.labels.node_id}"),
                _data_set(f"avg by (node_id) ({TPU_HBM_BANDWIDTH_UTILIZATION}{tpu})",
                          "HBM bandwidth ${metric.labels.node_id}")],
               "percent"),
        _chart("TPU HBM used (GiB)",
               [_data_set(f"max by (node_id) ({TPU_HBM_USED}{tpu}) / {GiB}",
                          "${metric.labels.node_id}")],
               "GiB",
               [_threshold(TPU_V5E_HBM_CAP_GIB_AT_092,
                           "expected plateau at 0.92 (SPEC 4; vLLM pre-allocates KV)"),
                _threshold(TPU_V5E_HBM_LIMIT_GIB, "chip limit (SPEC 4)", "RED")]),
        _chart("$ per million output tokens (configured $/h / live rate)",
               [_data_set(usd_per_million_tokens_query(deployment, st), st.name)
                for st in stacks],
               "USD / 1M tokens"),
    ]


def _notes(stacks: Sequence[StackPrice]) -> dict[str, Any]:
    prices = ", ".join(f"{st.name} ${st.usd_per_hour:.4f}/h" for st in stacks) or "none"
    content = (
        "**Reading this dashboard.** One line per serving stack (`stack` label). A node is "
        f"expected to answer from ~{WARM_START_S:.0f} s (warm compile cache) to "
        f"~{COLD_START_S:.0f} s (cold) after it starts (SPEC 4); `tpuserve status STACK` "
        "shows the boot phases. $/M tokens uses the configured prices "
        f"({prices}); at the measured peak of {E2B_PEAK_OUTPUT_TOK_S:,} tok/s that is "
        + ", ".join(f"{st.name} ${st.usd_per_hour / (E2B_PEAK_OUTPUT_TOK_S * 3600) * 1e6:.3f}"
                    for st in stacks)
        + " (SPEC 7). The TPU panels read Cloud Monitoring's `tpu.googleapis.com` metrics, "
        "which carry no stack label (one line per TPU node)."
    )
    return {"title": "Notes", "text": {"content": content, "format": "MARKDOWN"}}


def dashboard(project: str, deployment: str, stacks: Sequence[StackPrice]) -> dict[str, Any]:
    tiles = []
    for i, widget in enumerate(widgets(deployment, stacks)):
        tiles.append({"xPos": (i % 2) * WIDTH, "yPos": (i // 2) * HEIGHT,
                      "width": WIDTH, "height": HEIGHT, "widget": widget})
    rows = (len(tiles) + 1) // 2
    tiles.append({"xPos": 0, "yPos": rows * HEIGHT, "width": COLUMNS, "height": 8,
                  "widget": _notes(stacks)})
    return {
        "name": dashboard_name(project, deployment),
        "displayName": f"tpuserve {deployment}: serving",
        "mosaicLayout": {"columns": COLUMNS, "tiles": tiles},
        "labels": {"tpuserve": ""},
    }


def dashboard_json(project: str, deployment: str, stacks: Sequence[StackPrice]) -> str:
    return json.dumps(dashboard(project, deployment, stacks), indent=1, sort_keys=True)
