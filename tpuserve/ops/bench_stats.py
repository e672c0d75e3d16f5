"""Benchmark statistics from recorded timestamps: pure arithmetic, no clocks, no I/O.

Definitions (SPEC 6's tables; per-stream figures exclude the wait for the first token, which
is why SPEC 6's single-client per-stream 125 tok/s exceeds its aggregate 123.7):

- aggregate output tok/s: output tokens of every successful request in a repetition, divided
  by the repetition's span (first request start to last request end).
- TTFT: first chunk carrying generated text minus request start; median and p90 over requests.
- TPOT: (last token - first token) / (output tokens - 1); median over requests.
- per-stream tok/s: (output tokens - 1) / (last token - first token); median over requests.
- a cell's value is the mean over its repetitions; cv = sample standard deviation / mean over
  the repetitions (SPEC 6 reports cv <= 3.4% for throughput, 56% for one TTFT cell).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .loadgen import RequestRecord


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
    return RepStats(
        requests=len(records),
        errors=len(failed),
        output_tokens=tokens,
        span_s=span,
        output_tokens_per_s=tokens / span if span > 0 else 0.0,
        ttft_ms_median=statistics.median(ttfts),
        ttft_ms_p90=percentile(ttfts, 90),
        tpot_ms_median=statistics.median(tpots) if tpots else None,
        per_stream_tokens_per_s=statistics.median(rates) if rates else None,
        prompt_tokens_mean=statistics.fmean(r.prompt_tokens for r in ok),
        first_error=first_error,
    )


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
