"""Successive halving over boots of the node.

Every candidate is booted and measured at rung 0 with the base repetitions; the best 1/ETA
(feasible ones first, then by $/M: score.rank_key) go on to the next rung, measured again with
twice the repetitions (a mean's standard error shrinks by sqrt 2), until one is left. A
candidate clearly dominated by its rung's results stops after one cheap measurement, so most
of the node time goes to the few that might win; that is successive halving (Jamieson &
Talwalkar 2016), with a boot as the unit of cost because compilation dominates it.
"""

from __future__ import annotations

import math

from tpuserve.tune.score import rank_key
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


def survivors(state: TuneState, eta: int = ETA) -> list[str]:
    """The ids of this rung that go on: the best ceil(n/eta) of those measured without error,
    only feasible ones when any is."""
    scored = []
    for cid in state.at_rung:
        run = next((r for r in state.runs.get(cid, []) if r.rung == state.rung), None)
        if run is not None and run.score is not None and run.error is None:
            scored.append((rank_key(run.score, run.boot.boot_s, cid), cid))
    scored.sort()
    feasible = [cid for key, cid in scored if not key[0]]
    pool = feasible or [cid for _, cid in scored]
    return pool[:math.ceil(len(pool) / eta)] if len(pool) > 1 else pool


def advance(state: TuneState, eta: int = ETA) -> bool:
    """Close the rung: the next one's candidates, or done (True) when one or none is left."""
    keep = survivors(state, eta)
    if len(keep) <= 1:
        state.done = True
        return True
    state.rung += 1
    state.at_rung = list(keep)
    state.pending = list(keep)
    return False


def latest(state: TuneState, cid: str) -> Run | None:
    runs = [r for r in state.runs.get(cid, []) if r.score is not None and r.error is None]
    return max(runs, key=lambda r: r.rung) if runs else None


def best(state: TuneState) -> str | None:
    """The chosen candidate: the final rung's survivor when the search is done, else the best
    feasible so far (by its latest measurement); None when none is feasible."""
    if state.done:
        keep = survivors(state)
        run = latest(state, keep[0]) if keep else None
        return keep[0] if run is not None and run.score is not None and run.score.feasible \
            else None
    ranked = sorted(
        (rank_key(r.score, r.boot.boot_s, cid), cid)
        for cid in state.runs if (r := latest(state, cid)) is not None and r.score is not None
        and r.score.feasible)
    return ranked[0][1] if ranked else None
