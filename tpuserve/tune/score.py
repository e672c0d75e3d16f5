"""What a measurement is worth: $/M output tokens at the stack's price, the constraints it
breaks, and the Pareto set of $/M, p90 TTFT and boot time.

Per cell the figures are `tpuserve bench`'s (ops/bench_stats.py CellStats: means over the
repetitions, cv across them). A config's $/M is the mean over the cells of
usd_per_hour / (aggregate output tok/s x 3600) x 1e6, each cell weighted alike (the workload
the user gave is the mix they serve); a constraint holds only when it holds in every cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tpuserve.ops.bench_stats import CellStats


@dataclass(frozen=True)
class Constraints:
    max_ttft_p90_ms: float | None = None
    max_tpot_p50_ms: float | None = None
    min_stream_tok_s: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return asdict(self)

    def words(self) -> str:
        parts = [f"{k} = {v:g}" for k, v in asdict(self).items() if v is not None]
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class CellFigures:
    """One cell as the tuner keeps it (and the state file stores it)."""

    context: int
    clients: int
    tok_s: float
    tok_s_cv: float | None
    ttft_p90_ms: float
    tpot_p50_ms: float | None
    stream_tok_s: float | None
    reps: int

    @classmethod
    def of(cls, c: CellStats) -> CellFigures:
        return cls(c.context, c.clients, c.output_tokens_per_s, c.output_tokens_per_s_cv,
                   c.ttft_ms_p90, c.tpot_ms, c.per_stream_tokens_per_s, len(c.reps))


@dataclass(frozen=True)
class Score:
    usd_per_m: float  # inf when a cell produced nothing
    tok_s: float  # mean aggregate output tok/s over the cells
    tok_s_cv: float | None  # the largest cv of a cell's throughput
    ttft_p90_ms: float  # the worst cell's
    tpot_p50_ms: float | None  # the worst cell's
    stream_tok_s: float | None  # the worst cell's
    violations: tuple[str, ...]
    cells: tuple[CellFigures, ...]

    @property
    def feasible(self) -> bool:
        return not self.violations and math.isfinite(self.usd_per_m)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["usd_per_m"] = None if not math.isfinite(self.usd_per_m) else self.usd_per_m
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Score:
        usd = doc["usd_per_m"]
        return cls(math.inf if usd is None else float(usd), doc["tok_s"], doc["tok_s_cv"],
                   doc["ttft_p90_ms"], doc["tpot_p50_ms"], doc["stream_tok_s"],
                   tuple(doc["violations"]), tuple(CellFigures(**c) for c in doc["cells"]))


def score(cells: Sequence[CellStats], usd_per_hour: float, limits: Constraints) -> Score:
    figs = tuple(CellFigures.of(c) for c in cells)
    if not figs:
        return Score(math.inf, 0.0, None, math.inf, None, None, ("no cell measured",), ())
    per_m = [usd_per_hour / (f.tok_s * 3600) * 1e6 if f.tok_s > 0 else math.inf for f in figs]
    cvs = [f.tok_s_cv for f in figs if f.tok_s_cv is not None]
    tpots = [f.tpot_p50_ms for f in figs if f.tpot_p50_ms is not None]
    streams = [f.stream_tok_s for f in figs if f.stream_tok_s is not None]
    worst_tpot = max(tpots) if len(tpots) == len(figs) else None
    worst_stream = min(streams) if len(streams) == len(figs) else None
    v = []
    worst_ttft = max(f.ttft_p90_ms for f in figs)
    if limits.max_ttft_p90_ms is not None and worst_ttft > limits.max_ttft_p90_ms:
        v.append(f"TTFT p90 {worst_ttft:.0f} ms > {limits.max_ttft_p90_ms:g}")
    if limits.max_tpot_p50_ms is not None and (
            worst_tpot is None or worst_tpot > limits.max_tpot_p50_ms):
        v.append(f"TPOT p50 {_ms(worst_tpot)} > {limits.max_tpot_p50_ms:g}")
    if limits.min_stream_tok_s is not None and (
            worst_stream is None or worst_stream < limits.min_stream_tok_s):
        shown = "none" if worst_stream is None else f"{worst_stream:.1f}"
        v.append(f"stream {shown} tok/s < {limits.min_stream_tok_s:g}")
    return Score(sum(per_m) / len(per_m), sum(f.tok_s for f in figs) / len(figs),
                 max(cvs) if cvs else None, worst_ttft, worst_tpot, worst_stream, tuple(v), figs)


def _ms(v: float | None) -> str:
    return "none" if v is None else f"{v:.2f} ms"


def rank_key(s: Score, boot_s: float, cid: str) -> tuple[bool, float, float, str]:
    """Feasible first, then cheaper, then faster to boot; the id breaks a tie (determinism)."""
    return (not s.feasible, s.usd_per_m, boot_s, cid)


def pareto(points: Mapping[str, tuple[float, float, float]]) -> list[str]:
    """The ids no other point beats on every objective (all minimized) and on one strictly."""
    out = []
    for a, pa in points.items():
        dominated = any(all(x <= y for x, y in zip(pb, pa, strict=True)) and pb != pa
                        for b, pb in points.items() if b != a)
        if not dominated:
            out.append(a)
    return sorted(out, key=lambda k: points[k])
