"""The default search fits the headline run (`tpuserve tune flex --budget-usd 5` on E2B/v5e-1):
the staged plan (tune/plan.py) tries every value of every flag the planner offers, crosses only
the flags of one stage, and its estimate (boots, benchmark, return boot) stays under $5."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_support import invoke
from tests.tune.conftest import MakeTuner
from tests.tune.toy_node import ToyNode, base_values
from tpuserve.planner.arithmetic import SPEC_THROUGHPUT
from tpuserve.settings import load
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune import plan
from tpuserve.tune import state as state_file
from tpuserve.tune.candidates import NAMES, OFF, Candidate, sets_for, space
from tpuserve.tune.estimate import COLD_BOOT_S, WARM_BOOT_S, BenchTime, bench_time, estimate
from tpuserve.tune.node import BootRecord
from tpuserve.tune.runner import DONE, INTERRUPTED, Budget, Tuner
from tpuserve.tune.score import Constraints, Score
from tpuserve.tune.state import TERRAFORM, Run, TuneState, save
from tpuserve.tune.workload import Workload

DEFAULT_WORKLOAD = Workload((1024, 8192), (1, 16, 64), 256)  # the command's defaults


def _default() -> tuple[object, list[Candidate]]:
    raw = load_raw(environ={})
    d = from_raw(raw).deployments["flex"]
    return d, list(space(d, raw).candidates)


def test_the_default_search_fits_five_dollars_on_e2b_v5e_1_flex() -> None:
    d, cands = _default()
    est = estimate(cands, bench_time(DEFAULT_WORKLOAD, SPEC_THROUGHPUT), 2, d.usd_per_hour)
    assert d.usd_per_hour == 0.6  # SPEC 2's flex list price, one chip
    assert est["usd"] <= 5.0, est
    # Every part counted: boots at SPEC 4's times, the benchmark, the return boot.
    assert est["boot_total_s"] == est["cold_boots"] * COLD_BOOT_S + \
        est["warm_boots"] * WARM_BOOT_S
    assert est["bench_s"] > 0 and est["return_s"] == WARM_BOOT_S
    assert est["seconds"] == est["boot_total_s"] + est["bench_s"] + est["return_s"]
    # Before the plan: one halving over all of them, 144 candidates, 216 boots, about $31.
    assert len(cands) == 144 and est["boots"] < 30


def test_the_default_search_ends_within_five_dollars_on_the_toy_node(tmp_path: Path) -> None:
    """All of the planner's default candidates, the command's default workload, a $5 budget:
    the search ends (not stopped by the budget), having measured every value of every flag,
    and the whole run, the return boot included, cost at most $5."""
    d, cands = _default()
    sets = sets_for(d)
    node = ToyNode(1, sets, base_values(d))
    ids = [c.id for c in cands]
    st = TuneState("flex", "fp", at_rung=list(ids), pending=list(ids))
    tuner = Tuner(node, {c.id: c for c in cands}, st,
                  save=lambda s: save(s, tmp_path / "s.json"), usd_per_hour=d.usd_per_hour,
                  limits=Constraints(), workload=DEFAULT_WORKLOAD, budget=Budget(usd=5.0))
    out = tuner.run()
    assert out.status == DONE, out.message
    assert st.spent_s / 3600 * d.usd_per_hour <= 5.0
    by = {c.id: c for c in cands}
    for name in NAMES:
        tried = {by[cid].as_dict[name] for cid in st.runs}
        offered = {c.as_dict[name] for c in cands}
        assert tried == offered, name  # no dimension dropped
    assert {by[c].as_dict["speculative_config"] for c in st.runs} == {OFF}


def test_the_stages_cross_only_their_own_flags() -> None:
    _d, cands = _default()
    first = plan.replay(TuneState("flex", "fp"), cands)[0]
    # Memory first, on the stack's own programs (the one set known to boot): 0.92-0.94.
    assert first is not None and first.name == "memory" and not first.reuse
    assert len(first.ids) == 3
    st = TuneState("flex", "fp", at_rung=list(first.ids), pending=[])
    st.runs = {cid: [_run(0, 1.0 + i / 100, 700.0)] for i, cid in enumerate(first.ids)}
    assert not plan.advance(st, cands)
    step = plan.current(st, cands)
    # 2 batched-token buckets x 2 sequence caps x 2 padding gaps; the rest at the winner's.
    assert step is not None and step.name == "programs" and len(step.ids) == 8
    by = {c.id: c for c in cands}
    varied = {n for i in step.ids for n in NAMES
              if by[i].as_dict[n] != by[step.ids[0]].as_dict[n]}
    assert varied == {"max_num_batched_tokens", "max_num_seqs", "VLLM_TPU_BUCKET_PADDING_GAP"}
    assert {by[i].as_dict["gpu_memory_utilization"] for i in step.ids} == {0.92}
    assert [(n, k) for n, k in plan.shape(cands)] == [
        ("memory", 3), ("programs", 8), ("context", 2), ("boot", 3)]


def _run(rung: int, usd: float, boot_s: float) -> Run:
    return Run(rung, 2, BootRecord(True, boot_s, boot_s - 120, True),
               Score(usd, 100.0, 0.005, 300.0, 9.0, 100.0, (), ()), measure_s=120.0)


def test_the_boot_stage_picks_the_fastest_boot_among_the_same_serving() -> None:
    """Workers change how the programs compile, not what is served: among variants whose $/M
    is within the tolerance (noise), the fastest boot wins; a dearer one never does."""
    base = {"max_num_batched_tokens": 4096, "max_num_seqs": "unset", "max_model_len": 32768,
            "VLLM_TPU_BUCKET_PADDING_GAP": 0, "gpu_memory_utilization": 0.92,
            "speculative_config": OFF}
    cands = [Candidate(tuple((n, w if n == "NUM_PRECOMPILE_WORKERS" else base[n])
                             for n in NAMES)) for w in (1, 2, 4)]
    w1, w2, w4 = (c.id for c in cands)
    # Only the workers vary, so the plan's one step is the boot stage, at rung 0.
    step = plan.current(TuneState("flex", "fp"), cands)
    assert step is not None and step.name == "boot" and step.ids == (w1, w2, w4)
    st = TuneState("flex", "fp", at_rung=[w1, w2, w4])
    st.runs = {w1: [_run(0, 1.000, 800.0)], w2: [_run(0, 1.004, 600.0)],
               w4: [_run(0, 0.990, 500.0)]}
    assert plan.advance(st, cands) and st.at_rung == [w4]
    st.runs[w4] = [_run(0, 0.990, 700.0)]  # within 2% of w4's $/M, w2 boots faster
    st.done, st.at_rung = False, [w1, w2, w4]
    assert plan.advance(st, cands) and st.at_rung == [w2] and plan.best(st) == w2
    st = TuneState("flex", "fp", at_rung=[w1, w2, w4])
    st.runs = {w1: [_run(0, 1.000, 800.0)], w2: [_run(0, 1.010, 600.0)],
               w4: [_run(0, 1.100, 400.0)]}  # w4 serves 10% dearer: not the same serving
    assert plan.advance(st, cands) and st.at_rung == [w2]


def test_a_later_stage_does_not_boot_its_anchor_again() -> None:
    _d, cands = _default()
    first = plan.replay(TuneState("flex", "fp"), cands)[0]
    assert first is not None
    st = TuneState("flex", "fp", at_rung=list(first.ids), pending=[])
    # Rung 0, memory: 0.93 cheapest. Rung 1, the programs at 0.93: the anchor is measured.
    st.runs = {cid: [_run(0, 1.0 - (i == 1) / 100, 700.0)] for i, cid in enumerate(first.ids)}
    assert not plan.advance(st, cands)
    step = plan.current(st, cands)
    assert step is not None and step.name == "programs" and step.reuse == {first.ids[1]}
    assert st.rung == 1 and first.ids[1] in st.at_rung and first.ids[1] not in st.pending
    assert len(st.pending) == 7
    assert plan.reps(st, cands, 2) == 2  # a stage's first rung: the base repetitions
    # Its anchor's rung-0 measurement competes: cheapest again, it leads rung 2's three.
    for cid in st.pending:
        st.runs.setdefault(cid, []).append(_run(1, 1.5, 700.0))
    assert not plan.advance(st, cands)
    assert st.rung == 2 and st.at_rung[0] == first.ids[1] and len(st.pending) == 3
    assert plan.reps(st, cands, 2) == 4


def test_the_benchmark_time_model() -> None:
    """Per repetition: clients x 4 requests x output tokens at the nearest cell's tok/s."""
    one = bench_time(Workload((1024,), (16,), 256), SPEC_THROUGHPUT)
    cell = SPEC_THROUGHPUT.get(1024, 16)
    warm = SPEC_THROUGHPUT.get(1024, 1)
    assert cell is not None and warm is not None
    assert one.per_rep_s == 16 * 4 * 256 / cell.output_tokens_per_s
    assert one.warmup_s == 256 / warm.output_tokens_per_s
    assert BenchTime(10.0, 1.0).seconds(4) == 41.0


def test_an_interruption_in_a_later_stage_resumes_to_the_same_choice(
        make_tuner: MakeTuner, tmp_path: Path) -> None:
    """Ctrl-C past the programs (after memory's 3 measurements and the programs' 7 + 3); the
    state file alone carries the plan on: the same choice as an uninterrupted run, nothing
    measured twice at a rung."""
    free, _node, _sp = make_tuner(2)
    want = free.run().best
    tuner, node, _ = make_tuner(2)
    node.interrupt_at_measure = 14
    assert tuner.run().status == INTERRUPTED
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None and saved.rung == 3  # the first rung after the programs
    step = plan.current(saved, list(tuner.candidates.values()))
    assert step is not None and step.name in ("memory-up", "context")
    tuner2, _, _ = make_tuner(2, state=saved, node=node)
    out = tuner2.run()
    assert out.status == DONE and out.best == want
    for cid, runs in tuner2.state.runs.items():
        rungs = [r.rung for r in runs]
        assert len(rungs) == len(set(rungs)), cid


def test_a_state_another_plan_wrote_is_not_resumed(make_tuner: MakeTuner,
                                                   tmp_path: Path) -> None:
    tuner, node, sp = make_tuner(2)
    node.interrupt_at_measure = 10  # in the programs' second rung
    tuner.run()
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None and saved.rung == 1
    saved.at_rung = [c.id for c in sp.candidates[:32]]  # as an older, unstaged halving wrote
    tuner2, node2, _ = make_tuner(2, state=saved, node=node)
    out = tuner2.run()
    assert out.status == "failed" and "--fresh" in out.message
    assert node2.current is None and out.node_on == TERRAFORM


def test_the_headline_command_fits_without_restricting_the_sets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tpuserve tune flex --budget-usd 5` with no [tune] table (the planner's 144 candidates,
    the default workload): the estimate is under $5 and the run ends done (the toy node)."""
    cfg = tmp_path / "mine.toml"
    cfg.write_text("# the defaults\n")
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    node = ToyNode(3, sets_for(d), base_values(d))
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: node)
    monkeypatch.chdir(tmp_path)
    r = invoke("tune", "flex", "--yes", "--budget-usd", "5", "--out", str(tmp_path / "out"),
               env=env)
    assert r.exit_code == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "tune flex: 144 candidates" in said
    assert "estimate: 16 boots (13 cold x 857 s, 3 warm x 497 s" in said
    assert "return to Terraform's script (497 s warm) = 7.21 node-hours, $4.32" in said
    assert node.current is None
