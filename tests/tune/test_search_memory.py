"""Memory and the programs interact: compiled programs take HBM (SPEC 4: the program that did
not fit at 0.95), so the memory a program set boots at depends on the set. The plan measures
memory first on the stack's own programs, each program set at that memory, a set that fails
there one step lower (a step-down, at the same rung), and the memory steps above the winner's
where its programs were not measured there (memory-up). These tests drive the plan alone with a
stated outcome per candidate ($/M, or a boot that fails) standing in for the node."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tests.tune.conftest import flex_space
from tpuserve.contracts import GA_FAILED_NOT_READY
from tpuserve.paths import REPO_ROOT
from tpuserve.tune import plan
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.node import BootRecord
from tpuserve.tune.score import Score
from tpuserve.tune.state import Run, TuneState

WALL = "RuntimeProgramAllocationFailure"
# One flag of the programs (the padding gap) and the memory steps; the rest fixed.
TUNE = {"max_num_batched_tokens": [4096], "max_num_seqs": ["unset"], "max_model_len": [32768],
        "VLLM_TPU_BUCKET_PADDING_GAP": [0, 128], "NUM_PRECOMPILE_WORKERS": [1],
        "gpu_memory_utilization": [0.92, 0.93, 0.94]}
# (gap, memory) -> $/M; None: dies on memory at boot; NOT_READY: passes the readiness budget
Outcome = Mapping[tuple[int, float], float | str | None]
NOT_READY = "not ready"
CRASH = "crash"  # booted, then the server died while measured


def _cands() -> list[Candidate]:
    return list(flex_space(TUNE)[2].candidates)


def _key(c: Candidate) -> tuple[int, float]:
    return c.as_dict["VLLM_TPU_BUCKET_PADDING_GAP"], c.as_dict["gpu_memory_utilization"]


def _run(rung: int, usd: float | str | None) -> Run:
    if usd == NOT_READY:  # as the boot script says it (templates/boot/readiness.sh.j2)
        why = f"{GA_FAILED_NOT_READY} 2400 s (last /health: HTTP 502)"
        return Run(rung, 2, BootRecord(False, 2400.0, error=why), error=why)
    if usd == CRASH:
        why = "vLLM exited while measured (status 139)"
        return Run(rung, 2, BootRecord(True, 700.0, 580.0, True), error=why)
    if usd is None or isinstance(usd, str):
        return Run(rung, 2, BootRecord(False, 691.0, error=WALL), error=WALL)
    return Run(rung, 2, BootRecord(True, 700.0, 580.0, True),
               Score(usd, 100.0, 0.005, 300.0, 9.0, 100.0, (), ()), measure_s=120.0)


def drive(outcome: Outcome, cands: list[Candidate],
          check: Callable[[TuneState], None] = lambda _s: None,
          ) -> tuple[TuneState, list[tuple[int, float]]]:
    """Run the plan to its end as the runner does, OUTCOME standing in for each boot; CHECK
    sees the state after every recorded run. Returns the state and every boot, in order."""
    by = {c.id: c for c in cands}
    st = TuneState("flex", "fp", at_rung=list(by), pending=list(by))
    plan.start(st, cands)
    booted: list[tuple[int, float]] = []
    while not st.done:
        if not st.pending:
            plan.advance(st, cands)
            continue
        c = by[st.pending.pop(0)]
        booted.append(_key(c))
        st.runs.setdefault(c.id, []).append(_run(st.rung, outcome[_key(c)]))
        check(st)
    return st, booted


def _chosen(st: TuneState, cands: list[Candidate]) -> tuple[int, float]:
    best = plan.best(st)
    assert best is not None
    return _key(next(c for c in cands if c.id == best))


def test_a_program_set_that_fits_only_lower_is_compared_where_it_fits() -> None:
    """The gap wins at 0.92 but its programs do not fit above it; no gap at 0.94 is cheapest of
    all. Programs first would have kept the gap at 0.92 (0.95 $/M); the plan finds 0.85."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): 0.90, (0, 0.94): 0.85,
                        (128, 0.92): 0.95, (128, 0.93): None, (128, 0.94): None}

    def resumable(s: TuneState) -> None:  # after every run, as a resume would find it
        assert not plan.stale(s, cands), s

    st, booted = drive(outcome, cands, check=resumable)
    assert _chosen(st, cands) == (0, 0.94)
    # Memory on the stack's programs, then the gap at 0.94, stepping down where it fails; the
    # stack's programs above 0.94 were measured already, so memory-up boots nothing.
    assert booted == [(0, 0.92), (0, 0.93), (0, 0.94), (128, 0.94), (128, 0.93), (128, 0.92)]


def test_a_winner_that_fits_higher_than_the_stacks_programs_is_tried_higher() -> None:
    """The stack's programs do not fit above 0.92, the gap's do: memory-up finds 0.94."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): None, (0, 0.94): None,
                        (128, 0.92): 0.97, (128, 0.93): 0.92, (128, 0.94): 0.88}
    st, booted = drive(outcome, cands)
    assert _chosen(st, cands) == (128, 0.94)
    assert booted == [(0, 0.92), (0, 0.93), (0, 0.94), (128, 0.92), (128, 0.93), (128, 0.94)]


def test_no_step_above_one_that_failed_is_booted_again() -> None:
    """The gap fails at 0.94 and wins at 0.93: memory-up has nothing to boot (0.94 failed for
    these programs), and nothing is booted twice at a stage's first rung."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): 0.95, (0, 0.94): 0.90,
                        (128, 0.92): 0.85, (128, 0.93): 0.80, (128, 0.94): None}
    st, booted = drive(outcome, cands)
    assert _chosen(st, cands) == (128, 0.93)
    assert booted == [(0, 0.92), (0, 0.93), (0, 0.94), (128, 0.94), (128, 0.93)]
    assert len(booted) == len(set(booted))


def test_a_resume_mid_step_down_continues_it() -> None:
    """Interrupted right after a failure called for a step-down: the state is not stale, and
    the resumed plan boots the lower step and ends where an uninterrupted run ends."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): 0.90, (0, 0.94): 0.85,
                        (128, 0.92): 0.80, (128, 0.93): None, (128, 0.94): None}
    whole, booted = drive(outcome, cands)
    by = {c.id: c for c in cands}
    st = TuneState("flex", "fp", at_rung=list(by), pending=list(by))
    plan.start(st, cands)
    while (128, 0.94) not in [_key(by[c]) for c in st.runs]:
        if not st.pending:
            plan.advance(st, cands)
            continue
        c = by[st.pending.pop(0)]
        st.runs.setdefault(c.id, []).append(_run(st.rung, outcome[_key(c)]))
    assert not plan.stale(st, cands)  # as the resume finds it
    step = plan.current(st, cands)
    assert step is not None and step.name == "programs"
    assert [_key(by[i]) for i in step.to_boot() if i not in st.runs] == [(128, 0.93)]
    assert _chosen(whole, cands) == (128, 0.92) and booted[-2:] == [(128, 0.93), (128, 0.92)]


def test_a_boot_past_the_readiness_budget_is_not_retried_lower() -> None:
    """The gap's programs compile past the readiness budget at 0.93: less memory compiles no
    faster, so no step-down is booted for it."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): 0.90, (0, 0.94): None,
                        (128, 0.92): 0.80, (128, 0.93): NOT_READY, (128, 0.94): NOT_READY}
    st, booted = drive(outcome, cands)
    assert _chosen(st, cands) == (0, 0.93)
    assert booted == [(0, 0.92), (0, 0.93), (0, 0.94), (128, 0.93)]


def test_the_boot_scripts_readiness_failure_begins_with_the_tuners_words() -> None:
    text = (REPO_ROOT / "templates/boot/readiness.sh.j2").read_text()
    assert f'fail "{GA_FAILED_NOT_READY} $READY_TIMEOUT s' in text


def test_a_crash_while_measured_is_not_retried_lower() -> None:
    """The gap's set booted at 0.93 and its server died in the benchmark: that is the
    candidate's failure, not its memory's, so no step-down is booted for it."""
    cands = _cands()
    outcome: Outcome = {(0, 0.92): 1.00, (0, 0.93): 0.90, (0, 0.94): None,
                        (128, 0.92): 0.80, (128, 0.93): CRASH, (128, 0.94): 0.70}
    st, booted = drive(outcome, cands)
    assert _chosen(st, cands) == (0, 0.93)
    assert booted == [(0, 0.92), (0, 0.93), (0, 0.94), (128, 0.93)]


def test_a_winner_that_breaks_a_limit_at_its_last_rung_does_not_hide_a_feasible_one() -> None:
    """Done, the plan's winner's latest run broke a constraint: the choice is the cheapest
    candidate whose latest run met them, not none."""
    cands = _cands()
    by = {_key(c): c.id for c in cands}
    st = TuneState("flex", "fp", done=True, at_rung=[by[(0, 0.93)]])
    st.runs = {by[(0, 0.92)]: [_run(0, 1.0)], by[(0, 0.93)]: [_run(0, 0.9)]}
    broke = Score(0.85, 100.0, 0.005, 900.0, 9.0, 100.0, ("TTFT p90 900 ms > 800",), ())
    st.runs[by[(0, 0.93)]].append(Run(1, 4, BootRecord(True, 500.0, 300.0, True), broke,
                                      measure_s=240.0))
    assert plan.best(st) == by[(0, 0.92)]
