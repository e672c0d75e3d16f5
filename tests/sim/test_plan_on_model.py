"""The search plan alone, on the simulator's response model (tests/sim/plan_on_model.py): for
the default candidates of E2B/v5litepod-1 flex (144, the planner's), every seed's optimum is
what the plan chooses, past the KV wall where memory and the programs interact and below it.
No boots: the model's expected figures stand in for measurements (no noise), so this holds the
order of the stages, not the measuring (test_tune_default_set does that, end to end)."""

from __future__ import annotations

import pytest

from tests.sim.plan_on_model import Model, drive
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune import plan
from tpuserve.tune.candidates import space

SEEDS = range(40)
# Past the KV wall (48 and 64 streams of 8,192-token prompts: where memory and the programs
# interact, test_response_model), and below it (SPEC 6's 1024 x 16 cell).
WORKLOADS = [(8192, 48, 16), (8192, 64, 256), (1024, 16, 256)]


@pytest.fixture(scope="module")
def candidates() -> list:
    raw = load_raw(environ={})
    d = from_raw(raw).deployments["flex"]
    return list(space(d, raw).candidates)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: "x".join(map(str, w)))
def test_the_plan_chooses_each_seeds_optimum_on_the_model(candidates: list,
                                                          workload: tuple) -> None:
    assert len(candidates) == 144
    missed = []
    for seed in SEEDS:
        m = Model(seed, *workload)
        chosen, boots = drive(plan, candidates, m.outcome)
        assert chosen is not None
        usd, best = m.usd_per_m(chosen), m.optimum(candidates)
        assert usd is not None
        if usd > best * (1 + 1e-9):
            missed.append((seed, chosen.id, f"{usd / best - 1:.1%}"))
        assert boots <= 30, (seed, boots)  # 16 nominal, plus step-downs and memory-up
    assert not missed, missed
