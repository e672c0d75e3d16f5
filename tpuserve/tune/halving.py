"""Successive halving's arithmetic, which every stage of the search plan (tune/plan.py) runs.

Every candidate of a stage is booted and measured at its first rung with the base repetitions;
the best 1/ETA (feasible ones first, then by $/M: score.rank_key) go on to the next rung,
measured again with twice the repetitions (a mean's standard error shrinks by sqrt 2), until
one is left. A candidate clearly dominated by its rung's results stops after one cheap
measurement, so most of the node time goes to the few that might win; that is successive
halving (Jamieson & Talwalkar 2016), with a boot as the unit of cost because compilation
dominates it.
"""

from __future__ import annotations

import math

from tpuserve.tune.state import Run, TuneState

ETA = 3


def reps_at(rung: int, base: int) -> int:
    return base * 2**rung


def schedule(n: int, eta: int = ETA) -> list[int]:
    """How many candidates each rung runs, for n at rung 0."""
    out = [n] if n else []
    while n > 1 and (n := math.ceil(n / eta)) > 1:
        out.append(n)
    return out


def top(ids: list[str], eta: int = ETA) -> list[str]:
    """The ids that go on from a rung ranked best first: ceil(n/eta) of them (all of one)."""
    return ids[:math.ceil(len(ids) / eta)] if len(ids) > 1 else ids


def latest(state: TuneState, cid: str) -> Run | None:
    runs = [r for r in state.runs.get(cid, []) if r.score is not None and r.error is None]
    return max(runs, key=lambda r: r.rung) if runs else None
