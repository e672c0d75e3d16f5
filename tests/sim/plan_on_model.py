"""The search plan (tune/plan.py) run on the simulator's response model with no node: each
candidate's measurement is the model's expected tok/s at one workload cell (no noise), its boot
the model's cold boot (a failure, or past the readiness budget, fails the candidate). What the
plan alone chooses, beside the model's optimum over the same candidates: a check of the plan's
order of stages that costs no boots.

The candidates are the tuner's (its default space for the stack); how a candidate's values
become what the simulator reads is written out here (support.with_flags), not rendered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tests.sim import response_model as rm
from tests.sim.support import READY_BUDGET_S, with_flags
from tpuserve.contracts import GA_FAILED_NOT_READY
from tpuserve.tune.candidates import UNSET, Candidate
from tpuserve.tune.node import BootRecord
from tpuserve.tune.score import Score
from tpuserve.tune.state import Run, TuneState

USD_PER_HOUR = 0.6  # flex, SPEC 2
WALL = "RuntimeProgramAllocationFailure"
NOT_READY = f"{GA_FAILED_NOT_READY} 2400 s (last /health: HTTP 502)"  # as the script says it


def config(c: Candidate) -> rm.Config:
    v = c.as_dict
    seqs = rm.DEFAULT_SEQS if v["max_num_seqs"] == UNSET else int(v["max_num_seqs"])
    return with_flags(max_num_batched_tokens=v["max_num_batched_tokens"], max_num_seqs=seqs,
                      padding_gap=v["VLLM_TPU_BUCKET_PADDING_GAP"],
                      gpu_memory_utilization=v["gpu_memory_utilization"],
                      max_model_len=v["max_model_len"],
                      precompile_workers=v["NUM_PRECOMPILE_WORKERS"])


def serving(c: Candidate) -> tuple[Any, ...]:
    """What a candidate serves with (the workers change only how it compiles)."""
    return tuple(v for k, v in c.values if k != "NUM_PRECOMPILE_WORKERS")


@dataclass(frozen=True)
class Model:
    seed: int
    context: int
    clients: int
    output: int

    def outcome(self, c: Candidate) -> float | str:
        """C's $/M, or the error its cold boot fails with."""
        p = rm.Params.draw(self.seed)
        cfg = config(c)
        boot = rm.boot(cfg, p, warm=False)
        if boot.error is not None:
            return WALL
        if (boot.ready_s or 0) >= READY_BUDGET_S:
            return NOT_READY
        return rm.usd_per_million(rm.cell(cfg, p, self.context, self.clients,
                                          self.output).tok_s, USD_PER_HOUR)

    def usd_per_m(self, c: Candidate) -> float | None:
        out = self.outcome(c)
        return None if isinstance(out, str) else out

    def optimum(self, candidates: Sequence[Candidate], workers: int = 1) -> float:
        """The lowest $/M a candidate with the stack's WORKERS serves at (several may tie:
        below the KV wall the model gives every memory step the same figures). The plan
        compares serving at the stack's workers and tunes them last, for boot time: a program
        set whose cold compile passes the readiness budget with them fails there (the boot
        script's budget would fail its deploy alike), even where more workers would boot it
        in time. docs/tune.md states this limit."""
        return min(u for c in candidates if c.as_dict["NUM_PRECOMPILE_WORKERS"] == workers
                   and (u := self.usd_per_m(c)) is not None)


def _run(rung: int, usd: float | str) -> Run:
    if isinstance(usd, str):
        return Run(rung, 2, BootRecord(False, 691.0, error=usd), error=usd)
    return Run(rung, 2, BootRecord(True, 700.0, 580.0, True),
               Score(usd, 100.0, 0.005, 300.0, 9.0, 100.0, (), ()), measure_s=120.0)


def drive(plan: ModuleType, candidates: Sequence[Candidate],
          outcome: Callable[[Candidate], float | str]) -> tuple[Candidate | None, int]:
    """PLAN (tune/plan.py, or an older revision's) run to its end as the runner runs it, OUTCOME
    standing in for each boot and measurement: the chosen candidate and the boots made."""
    by = {c.id: c for c in candidates}
    memo: dict[str, float | str] = {}
    st = TuneState("flex", "fp", at_rung=list(by), pending=list(by))
    plan.start(st, list(candidates))
    boots = 0
    while not st.done:
        if not st.pending:
            plan.advance(st, list(candidates))
            continue
        cid = st.pending.pop(0)
        boots += 1
        if cid not in memo:
            memo[cid] = outcome(by[cid])
        st.runs.setdefault(cid, []).append(_run(st.rung, memo[cid]))
    best = plan.best(st)
    return (by[best] if best is not None else None), boots
