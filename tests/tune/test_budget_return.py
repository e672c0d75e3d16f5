"""--budget-usd and --budget-hours bound the whole run, the boot that returns the node to
Terraform's script included; a candidate that fails near the budget goes straight back to
Terraform's script rather than to the last good config and then again to Terraform's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tune.conftest import WORKLOAD, MakeTuner, flex_space
from tests.tune.toy_node import ToyNode, base_values
from tpuserve.tune.candidates import sets_for
from tpuserve.tune.runner import BUDGET, DONE, Budget, Tuner
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TERRAFORM, TuneState, save


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("usd", [0.5, 0.8, 1.3, 2.1])
def test_the_budget_holds_with_the_return_boot(make_tuner: MakeTuner, seed: int,
                                               usd: float) -> None:
    tuner, node, _ = make_tuner(seed, budget=Budget(usd=usd))
    out = tuner.run()
    spent = tuner.state.spent_s / 3600 * tuner.usd_per_hour
    assert spent <= usd, (spent, out.message)  # the return boot included
    assert node.current is None and out.node_on == TERRAFORM
    assert out.status in (BUDGET, DONE)
    if out.status == BUDGET:
        assert "with the return to Terraform's script" in out.message
    if usd == 0.5:  # a few candidates' worth: stopped
        assert out.status == BUDGET


def test_hours_hold_with_the_return_boot(make_tuner: MakeTuner) -> None:
    tuner, node, _ = make_tuner(1, budget=Budget(hours=1.2))
    out = tuner.run()
    assert out.status == BUDGET and tuner.state.runs
    assert tuner.state.spent_s <= 1.2 * 3600
    assert node.current is None


def test_a_failure_near_the_budget_returns_straight_to_terraform(tmp_path: Path) -> None:
    """Seed 1's memory wall fails 0.94. The budget affords that candidate and the return
    (1,200 s measured + 1,200 s estimated + a 720 s return = 3,120 s) but not, after it failed,
    a boot back to the last good config and then the return: the node goes straight back to
    Terraform's script, and the run stays within the budget."""
    tune = {"max_num_batched_tokens": [4096], "max_num_seqs": ["unset"],
            "max_model_len": [32768], "VLLM_TPU_BUCKET_PADDING_GAP": [0],
            "NUM_PRECOMPILE_WORKERS": [1], "gpu_memory_utilization": [0.92, 0.94]}
    d, _raw, sp = flex_space(tune)
    node = ToyNode(1, sets_for(d), base_values(d))
    ids = [c.id for c in sp.candidates]
    usd = 3200 / 3600 * d.usd_per_hour
    said: list[str] = []
    tuner = Tuner(node, {c.id: c for c in sp.candidates},
                  TuneState("flex", "fp", at_rung=list(ids), pending=list(ids)),
                  save=lambda s: save(s, tmp_path / "s.json"), usd_per_hour=d.usd_per_hour,
                  limits=Constraints(), workload=WORKLOAD,
                  budget=Budget(usd=usd, first_boot_s=700.0), log=said.append)
    out = tuner.run()
    failed = [s for s in said if " failed: " in s]
    assert failed and f"returning the node to {TERRAFORM}" in failed[0], said
    i = next(i for i, (op, o) in enumerate(node.log)
             if op == "apply" and o.get("gpu_memory_utilization") == 0.94)
    assert node.log[i + 1:] == [("restore", None)]  # one boot back, none after it
    assert node.current is None and out.node_on == TERRAFORM
    assert tuner.state.spent_s / 3600 * d.usd_per_hour <= usd


def test_the_return_is_reserved_at_a_warm_boot_not_a_candidates_cold_compile() -> None:
    """The return restarts Terraform's script, whose programs the cache holds: a candidate's
    2,500 s cold compile or a boot that failed at the readiness budget does not size it."""
    from tpuserve.tune.node import BootRecord
    from tpuserve.tune.score import Score
    from tpuserve.tune.state import Run

    score = Score(1.0, 100.0, 0.005, 300.0, 9.0, 100.0, (), ())
    st = TuneState("flex", "fp")
    st.runs = {"cold": [Run(0, 2, BootRecord(True, 2500.0, 2000.0, False), score)],
               "dead": [Run(0, 2, BootRecord(False, 2400.0, error="x"), error="x")]}
    budget = Budget(usd=1.0)
    assert budget.return_s(st) == 857.0  # no warm boot yet: SPEC 4's cold boot
    st.runs["warm"] = [Run(1, 4, BootRecord(True, 930.0, 330.0, True), score)]
    assert budget.return_s(st) == 930.0
