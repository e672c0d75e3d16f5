"""Benchmark statistics from recorded timestamps: pure arithmetic, no clocks, no I/O.

Per-request metrics are `vllm bench serve`'s (vllm/benchmarks/serve.py, calculate_metrics), so
our numbers sit beside its output; percentiles interpolate linearly like numpy's:

- TTFT: first chunk carrying generated text minus request start.
- TPOT (time per output token, excluding the first): (E2EL - TTFT) / (output tokens - 1),
  requests with at least two tokens.
- ITL (inter-token latency): every gap between successive chunks after the first token, all
  requests pooled (a chunk that carries several tokens is one gap, as in vLLM).
- E2EL (end-to-end latency): the last chunk with choices minus request start.
- aggregate output tok/s: output tokens of every successful request in a repetition, divided
  by the repetition's span (first request start to last request end).
- per-stream tok/s: (output tokens - 1) / (E2EL - TTFT), the inverse of TPOT; it excludes the
  wait for the first token, which is why SPEC 6's single-client per-stream 125 tok/s exceeds
  its aggregate 123.7.

Each metric has p50 (median), p90 and p99 per repetition; a cell's value is the mean over its
repetitions; cv = sample standard deviation / mean over the repetitions (SPEC 6 reports cv <=
3.4% for throughput, 56% for one TTFT cell).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .chat_stream import RequestRecord


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation across repetitions; None with fewer than two."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


@dataclass(frozen=True)
class RepStats:
    requests: int
    errors: int
    output_tokens: int
    span_s: float
    output_tokens_per_s: float
    ttft_ms_median: float
    ttft_ms_p90: float
    tpot_ms_median: float | None  # None when no request produced two tokens
    per_stream_tokens_per_s: float | None
    prompt_tokens_mean: float
    first_error: str | None = None
    ttft_ms_p99: float = 0.0
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_median: float | None = None  # None when no stream had two chunks
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2el_ms_median: float = 0.0
    e2el_ms_p90: float = 0.0
    e2el_ms_p99: float = 0.0


def rep_stats(records: Sequence[RequestRecord]) -> RepStats:
    """Statistics of one repetition. Raises ValueError when no request succeeded."""
    ok = [r for r in records if r.ok and r.first_token is not None and r.output_tokens > 0]
    failed = [r for r in records if r not in ok]
    first_error = next((r.error for r in failed if r.error), None)
    if not ok:
        why = first_error or "no generated text in any stream"
        raise ValueError(f"all {len(records)} requests failed: {why}")
    span = max(r.end for r in records) - min(r.start for r in records)
    tokens = sum(r.output_tokens for r in ok)
    ttfts = [(r.first_token - r.start) * 1000 for r in ok if r.first_token is not None]
    e2els = [((r.last_token or r.end) - r.start) * 1000 for r in ok]
    decode = [
        (r.output_tokens - 1, r.last_token - r.first_token)
        for r in ok
        if r.output_tokens > 1
        and r.first_token is not None
        and r.last_token is not None
        and r.last_token > r.first_token
    ]
    tpots = [dt * 1000 / n for n, dt in decode]
    rates = [n / dt for n, dt in decode]
    itls = [gap * 1000 for r in ok for gap in r.itl]
    tpot = _pcts(tpots)
    itl = _pcts(itls)
    e2el = _pcts(e2els)
    return RepStats(
        requests=len(records),
        errors=len(failed),
        output_tokens=tokens,
        span_s=span,
        output_tokens_per_s=tokens / span if span > 0 else 0.0,
        ttft_ms_median=statistics.median(ttfts),
        ttft_ms_p90=percentile(ttfts, 90),
        tpot_ms_median=tpot[0],
        per_stream_tokens_per_s=statistics.median(rates) if rates else None,
        prompt_tokens_mean=statistics.fmean(r.prompt_tokens for r in ok),
        first_error=first_error,
        ttft_ms_p99=percentile(ttfts, 99),
        tpot_ms_p90=tpot[1],
        tpot_ms_p99=tpot[2],
        itl_ms_median=itl[0],
        itl_ms_p90=itl[1],
        itl_ms_p99=itl[2],
        e2el_ms_median=e2el[0] or 0.0,
        e2el_ms_p90=e2el[1] or 0.0,
        e2el_ms_p99=e2el[2] or 0.0,
    )


PERCENTILES = (50, 90, 99)


def _pcts(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """p50, p90, p99 of `values` (all None when there are none)."""
    if not values:
        return None, None, None
    ordered = sorted(values)
    p50, p90, p99 = (percentile(ordered, q) for q in PERCENTILES)
    return p50, p90, p99


@dataclass(frozen=True)
class CellStats:
    """One (context, clients) cell over its repetitions."""

    context: int
    clients: int
    reps: tuple[RepStats, ...]

    def _mean(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.reps if getattr(r, attr) is not None]
        return statistics.fmean(values) if values else None

    def _cv(self, attr: str) -> float | None:
        return cv([getattr(r, attr) for r in self.reps if getattr(r, attr) is not None])

    @property
    def output_tokens_per_s(self) -> float:
        return statistics.fmean(r.output_tokens_per_s for r in self.reps)

    @property
    def output_tokens_per_s_cv(self) -> float | None:
        return self._cv("output_tokens_per_s")

    @property
    def ttft_ms_median(self) -> float:
        return statistics.fmean(r.ttft_ms_median for r in self.reps)

    @property
    def ttft_ms_median_cv(self) -> float | None:
        return self._cv("ttft_ms_median")

    @property
    def ttft_ms_p90(self) -> float:
        return statistics.fmean(r.ttft_ms_p90 for r in self.reps)

    @property
    def tpot_ms(self) -> float | None:
        return self._mean("tpot_ms_median")

    def mean_of(self, attr: str) -> float | None:
        """The mean over repetitions of one RepStats figure (None where no rep has it)."""
        return self._mean(attr)

    @property
    def per_stream_tokens_per_s(self) -> float | None:
        return self._mean("per_stream_tokens_per_s")

    @property
    def prompt_tokens_mean(self) -> float:
        return statistics.fmean(r.prompt_tokens_mean for r in self.reps)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.reps)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.reps)
