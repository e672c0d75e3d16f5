"""The search finds each seed's optimum of the toy node under constraints; the node ends on
Terraform's script (or the best with keep_best); the budget stops it."""

from __future__ import annotations

import pytest

from tests.tune.conftest import WORKLOAD, MakeTuner
from tests.tune.toy_node import expected_best
from tpuserve.tune.halving import schedule
from tpuserve.tune.runner import BUDGET, DONE, Budget
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TERRAFORM

SEEDS = (1, 2, 3)


def test_the_seeds_have_different_optima(make_tuner: MakeTuner) -> None:
    optima = set()
    for seed in SEEDS:
        _t, node, sp = make_tuner(seed)
        optima.add(expected_best(node, sp.candidates, WORKLOAD, Constraints()))
    assert len(optima) == len(SEEDS)


@pytest.mark.parametrize("seed", SEEDS)
def test_finds_each_seeds_optimum(make_tuner: MakeTuner, seed: int) -> None:
    tuner, node, sp = make_tuner(seed)
    out = tuner.run()
    assert out.status == DONE
    assert out.best == expected_best(node, sp.candidates, WORKLOAD, Constraints())
    # Successive halving ran fewer boots than trying everything at every rung.
    boots = sum(len(r) for r in tuner.state.runs.values())
    assert boots <= sum(schedule(len(sp.candidates)))  # failed boots drop out
    assert boots < len(sp.candidates) * len(schedule(len(sp.candidates)))
    # The end: Terraform's script back on the node.
    assert out.node_on == TERRAFORM and node.current is None
    assert node.log[-1][0] == "restore"


@pytest.mark.parametrize("seed", SEEDS)
def test_constraints_move_the_optimum_and_are_respected(make_tuner: MakeTuner,
                                                        seed: int) -> None:
    tuner, node, sp = make_tuner(seed)
    free = expected_best(node, sp.candidates, WORKLOAD, Constraints())
    free_c = next(c for c in sp.candidates if c.id == free)
    # A TTFT bound the unconstrained optimum breaks, which some config meets.
    bound = max(node.ttft(free_c.as_dict, ctx, n) for ctx in WORKLOAD.contexts
                for n in WORKLOAD.clients) * 0.97
    limits = Constraints(max_ttft_p90_ms=bound)
    want = expected_best(node, sp.candidates, WORKLOAD, limits)
    assert want is not None and want != free
    tuner, node, sp = make_tuner(seed, limits=limits)
    out = tuner.run()
    # The staged plan (tune/plan.py) crosses only the flags of one stage; the toy node makes
    # NUM_PRECOMPILE_WORKERS move serving too, which a real node's workers do not, so under a
    # constraint that couples stages the plan's choice is the best feasible config it
    # measured (seeds 2 and 3: the global optimum as well).
    measured = [c for c in sp.candidates if c.id in tuner.state.runs]
    assert out.best == expected_best(node, measured, WORKLOAD, limits)
    assert out.best != free
    if seed != 1:
        assert out.best == want
    run = max(tuner.state.runs[out.best], key=lambda r: r.rung)
    assert run.score is not None and run.score.ttft_p90_ms <= bound


def test_no_feasible_candidate_fails(make_tuner: MakeTuner) -> None:
    tuner, node, _ = make_tuner(1, limits=Constraints(max_ttft_p90_ms=1.0))
    out = tuner.run()
    assert out.status == "failed" and out.best is None
    assert node.current is None  # Terraform's script back


def test_keep_best_leaves_the_node_on_it(make_tuner: MakeTuner) -> None:
    tuner, node, sp = make_tuner(2, keep_best=True)
    out = tuner.run()
    assert out.node_on == out.best
    best = next(c for c in sp.candidates if c.id == out.best)
    assert node.current == best.overlay()


def test_budget_stops_before_the_candidate_that_would_pass_it(make_tuner: MakeTuner) -> None:
    tuner, node, _ = make_tuner(1, budget=Budget(usd=1.0))
    out = tuner.run()
    assert out.status == BUDGET and "--budget-usd 1" in out.message
    spent = tuner.state.spent_s / 3600 * tuner.usd_per_hour
    runs = sum(len(r) for r in tuner.state.runs.values())
    assert 0 < runs < 10
    # Spent stays within the budget, the end's restore boot included.
    assert spent <= 1.0
    assert node.current is None


def test_budget_hours(make_tuner: MakeTuner) -> None:
    tuner, _node, _ = make_tuner(1, budget=Budget(hours=0.1))
    out = tuner.run()
    assert out.status == BUDGET and not tuner.state.runs
