"""What a search will cost before it starts (derived, never measured): the plan's boots at
SPEC 4's measured boot times, the benchmark's time per candidate from a stated model, and the
boot that puts Terraform's script back at the end, at the stack's price.

Boots: the plan's nominal stages (tune/plan.py: shape), without the step-downs and the
memory-up stage, whose boots depend on what fails and what wins (the words say so; the budget
stops them). A candidate's first boot is cold (857 s, SPEC 4: its programs are new to the compile
cache), a later rung's boot of the same candidate and the final return to Terraform's script
(booted before the search) are warm (497 s, SPEC 4, the cache mounted).

The benchmark (the model, derived): a repetition of a context x clients cell sends clients x
bench's 4 requests per client, `clients` in flight, each of `output_tokens`; it takes
requests x output_tokens / the aggregate output tok/s of the nearest cell (in log context and
log clients) of the planner's throughput table (SPEC 6's measured grid, or the config's own),
and each cell adds one warm-up request at one client's rate. A trace's repetition is its output
tokens at the rate of its mean prompt length at each clients level. Prefill, TTFT and the
tuner's own seconds between candidates (about 1 s, docs/tune.md) are in those rates or left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve.ops.bench import DEFAULT_REQUESTS_PER_CLIENT
from tpuserve.planner.arithmetic import ThroughputTable
from tpuserve.tune import halving, plan
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.workload import Workload

COLD_BOOT_S = 857.0  # SPEC 4, measured cold start
WARM_BOOT_S = 497.0  # SPEC 4, measured restart with the compile cache mounted


@dataclass(frozen=True)
class BenchTime:
    """Seconds of one measurement: per repetition (all cells) and the cells' warm-ups."""

    per_rep_s: float
    warmup_s: float

    def seconds(self, reps: int) -> float:
        return reps * self.per_rep_s + self.warmup_s


def _rate(table: ThroughputTable, context: float, clients: int) -> float:
    cell = min(table.cells, key=lambda c: (math.log(c.context / max(context, 1))) ** 2
               + (math.log(c.clients / clients)) ** 2)
    return cell.output_tokens_per_s


def bench_time(workload: Workload, table: ThroughputTable) -> BenchTime:
    if workload.trace:
        out = sum(o for _p, o in workload.trace)
        prompt = sum(p for p, _o in workload.trace) / len(workload.trace)
        levels = workload.clients or (1,)
        return BenchTime(sum(out / _rate(table, prompt, n) for n in levels), 0.0)
    rep = warm = 0.0
    o = workload.output_tokens
    for c in workload.contexts:
        for n in workload.clients:
            rep += n * DEFAULT_REQUESTS_PER_CLIENT * o / _rate(table, c, n)
            warm += o / _rate(table, c, 1)
    return BenchTime(rep, warm)


def estimate(candidates: Sequence[Candidate], bench: BenchTime, base_reps: int,
             usd_per_hour: float) -> dict[str, Any]:
    """The plan's node time and money: its boots (cold and warm), the benchmark of each run,
    and the return boot; `boot_s` is the mean boot, so boots x boot_s is the boot time."""
    cold = warm = runs = 0
    bench_s = 0.0
    for i, (_name, n) in enumerate(plan.shape(candidates)):
        for rung, k in enumerate(halving.schedule(n) or [1]):
            new = k - (1 if i and rung == 0 else 0)  # a later stage's anchor is measured
            if rung == 0:
                cold += new
            else:
                warm += new
            runs += new
            bench_s += new * bench.seconds(base_reps * 2 ** rung)
    boot_total = cold * COLD_BOOT_S + warm * WARM_BOOT_S
    return_s = WARM_BOOT_S
    seconds = boot_total + bench_s + return_s
    boots = cold + warm
    return {"boots": boots, "cold_boots": cold, "warm_boots": warm, "runs": runs,
            "boot_s": boot_total / boots if boots else 0.0, "boot_total_s": boot_total,
            "bench_s": bench_s, "return_s": return_s, "seconds": seconds,
            "hours": seconds / 3600, "usd": seconds / 3600 * usd_per_hour}


def words(est: dict[str, Any], usd_per_hour: float, price_source: str) -> str:
    """The estimate as the command prints it, every figure's source named."""
    return (f"estimate: {est['boots']} boots ({est['cold_boots']} cold x {COLD_BOOT_S:.0f} s, "
            f"{est['warm_boots']} warm x {WARM_BOOT_S:.0f} s: SPEC 4's measured boots) + "
            f"{est['bench_s']:.0f} s of benchmark ({est['runs']} runs; derived from the "
            f"planner's throughput table) + the return to Terraform's script "
            f"({est['return_s']:.0f} s warm) = {est['hours']:.2f} node-hours, "
            f"${est['usd']:.2f} at ${usd_per_hour:.4g}/hour ({price_source}; derived); a "
            "candidate that fails to boot at the chosen memory is retried a step lower, and "
            "a winner on other programs is tried at the memory steps above, each one boot "
            "more, within the budget")
