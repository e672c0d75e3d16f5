"""The search plan: successive halving stage by stage, one group of flags per stage, each stage
anchored on the previous stage's winner.

Why stages and not one halving over every combination: a boot is the unit of cost (SPEC 4: 857 s
cold, 685 s of it compiling), and halving boots every candidate at its first rung. The planner's
sets on Gemma 4 E2B / v5litepod-1 cross to 144+ combinations: 216 boots, about $31 at flex's
$0.60/hour (SPEC 2), six times the `--budget-usd 5` a user would give. So the flags are grouped
by what they change, and only flags that interact in serving are crossed:

1. memory: gpu_memory_utilization, the KV pool, on the stack's own programs: more KV never
   serves worse, and the memory wall (SPEC 4: 0.95 died 691 s into boot, a program that did not
   fit) is where the steps stop. Run first, on the one program set known to boot.
2. programs: max_num_batched_tokens, max_num_seqs, VLLM_TPU_BUCKET_PADDING_GAP, at the memory
   the first stage chose. Together they set the compiled program set and the scheduler: the
   token buckets are the powers of two up to the batched-token budget, or steps of the gap past
   it (tpu-inference's runner/utils.get_token_paddings, tpu_runner.py passes
   padding_gap=VLLM_TPU_BUCKET_PADDING_GAP), so the gap changes every step's padding; the
   sequence cap sizes the batch those buckets serve. Crossed, and searched by halving.
3. speculative: off or n-gram (when allowed): drafting changes every decode step.
4. memory-up: the memory steps above the winner's, on the winner's programs, when they were not
   measured there (a program set smaller than the stack's may leave more headroom).
5. context: the max_model_len ladder on that pool (block size follows it, SPEC 4).
6. boot: NUM_PRECOMPILE_WORKERS. It changes only how the same programs are compiled, never
   what is served, so it is tried once per value on the final winner and chosen for its
   measured boot time among the variants whose $/M is within BOOT_TOLERANCE of the best (the
   benchmark's cv is at most 1% in most cells, SPEC 6: twice that is noise). Its boots hit the
   compile cache the winner published, so they measure a restart with those workers; a cold
   compile's speed-up shows only where the cache missed (each boot's cache is in the report).

Why memory is not simply one more stage after the programs: compiled programs take HBM (the
program that did not fit at 0.95, SPEC 4), so the memory a program set boots at depends on the
set. A fixed order of one-flag stages then stops at the wrong corner: a padding gap that wins
at 0.92 can lose to no gap at 0.94 where the gap's programs no longer fit, and no single stage
sees that (on the simulated server's model such a plan missed the optimum in 37 of 200 seeds
past the KV wall: bench/tune_plan_model, docs/tune.md). So each program set is measured at the
memory the first stage chose, and a candidate of a later stage that fails to boot at a memory
above the lowest step is retried one step lower, at the same rung (a step-down): each set is
then compared at the most memory it boots with, up to the first stage's choice, and memory-up
looks above it.

At a stage's first rung a candidate measured at an earlier rung (the anchor, or one an earlier
stage tried) is not booted again: its latest measurement competes, and a failure stands. A stage
of one value is skipped. Every candidate still comes from the candidate list (the planner's and
[tune]'s sets, validated), so the plan is derived from that list and the state's runs alone: the
state file needs nothing new, and a resume replays it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tpuserve.contracts import GA_FAILED_NOT_READY
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.halving import latest, top
from tpuserve.tune.score import rank_key
from tpuserve.tune.state import Run, TuneState

MEMORY = "gpu_memory_utilization"


class Stage(NamedTuple):
    name: str
    dims: tuple[str, ...]
    upward: bool = False  # only the values above the anchor's


STAGES: tuple[Stage, ...] = (
    Stage("memory", (MEMORY,)),
    Stage("programs", ("max_num_batched_tokens", "max_num_seqs", "VLLM_TPU_BUCKET_PADDING_GAP")),
    Stage("speculative", ("speculative_config",)),
    Stage("memory-up", (MEMORY,), upward=True),
    Stage("context", ("max_model_len",)),
    Stage("boot", ("NUM_PRECOMPILE_WORKERS",)),
)
BOOT_ONLY = "boot"
BOOT_TOLERANCE = 0.02  # $/M within 2% of the best: the same serving (twice SPEC 6's 1% cv)


@dataclass(frozen=True)
class Step:
    """One rung: the ids entering it, in a stage, at the state's rung `rung`."""

    stage: int
    local: int  # the rung within the stage (repetitions double with it)
    rung: int
    ids: tuple[str, ...]
    reuse: frozenset[str] = frozenset()  # measured at an earlier rung: not booted again
    base: tuple[str, ...] = ()  # the ids before any step-down joined (what a resume checks)

    @property
    def name(self) -> str:
        return STAGES[self.stage].name

    def to_boot(self) -> list[str]:
        return [i for i in self.ids if i not in self.reuse]


def stage_ids(stage: int, anchor: Candidate, candidates: Sequence[Candidate]) -> list[str]:
    """The candidates equal to the anchor but in the stage's flags, in the list's order (for an
    upward stage: at or above the anchor's values)."""
    st = STAGES[stage]
    a = anchor.as_dict
    return [c.id for c in candidates
            if all(v == a[k] for k, v in c.values if k not in st.dims)
            and (not st.upward or all(c.as_dict[k] >= a[k] for k in st.dims))]


def _earlier(state: TuneState, cid: str, rung: int) -> Run | None:
    """CID's latest run before RUNG, failed or not."""
    runs = [r for r in state.runs.get(cid, []) if r.rung < rung]
    return max(runs, key=lambda r: r.rung) if runs else None


def _first_step(stage: int, anchor: Candidate, candidates: Sequence[Candidate],
                state: TuneState, rung: int) -> Step | None:
    for k in range(stage, len(STAGES)):
        ids = stage_ids(k, anchor, candidates)
        if STAGES[k].upward:
            ids = _below_a_failure(state, ids, candidates, rung)
        if len(ids) > 1:
            reuse = frozenset(i for i in ids if _earlier(state, i, rung) is not None)
            return Step(k, 0, rung, tuple(ids), reuse, tuple(ids))
    return None


def _below_a_failure(state: TuneState, ids: list[str], candidates: Sequence[Candidate],
                     rung: int) -> list[str]:
    """IDS (one program set's memory steps) without the steps above one that died at boot:
    more memory than a step that did not fit does not fit either."""
    mem = {c.id: c.as_dict[MEMORY] for c in candidates}
    failed = [mem[i] for i in ids if (r := _earlier(state, i, rung)) is not None
              and _died_at_boot(r)]
    return [i for i in ids if not failed or mem[i] <= min(failed)]


def _run_at(state: TuneState, step: Step, cid: str) -> Run | None:
    """The run that stands for CID in STEP: its run at the step's rung, or for a reused id its
    latest earlier one; None when neither exists."""
    run = next((r for r in state.runs.get(cid, []) if r.rung == step.rung), None)
    if run is None and cid in step.reuse:
        run = _earlier(state, cid, step.rung)
    return run


def _good(run: Run | None) -> Run | None:
    return run if run is not None and run.score is not None and run.error is None else None


def _lower_memory(c: Candidate, candidates: Sequence[Candidate]) -> str | None:
    """The candidate equal to C but one memory step lower, if the list holds one."""
    a = c.as_dict
    lower = [o for o in candidates if o.as_dict[MEMORY] < a[MEMORY]
             and all(v == a[k] for k, v in o.values if k != MEMORY)]
    return max(lower, key=lambda o: o.as_dict[MEMORY]).id if lower else None


def _died_at_boot(run: Run) -> bool:
    """RUN's boot failed, and not by passing the readiness budget (a compile that long is not
    shortened by less memory): what a memory step lower may boot. A failed benchmark or a
    crash while measured is the candidate's, not its memory's."""
    return run.error is not None and not run.boot.ok and \
        not (run.boot.error or run.error).startswith(GA_FAILED_NOT_READY)


def _with_step_downs(state: TuneState, step: Step, candidates: Sequence[Candidate]) -> Step:
    """STEP with, for each id that failed at this very rung, its one-step-lower memory sibling
    (and so on down while those fail): only at a stage's first rung, never in a memory stage
    nor the boot stage (its workers change how programs compile, not what they hold), and
    not for a boot that passed the readiness budget."""
    if step.local != 0 or MEMORY in STAGES[step.stage].dims or step.name == BOOT_ONLY:
        return step
    by = {c.id: c for c in candidates}
    ids, reuse = list(step.ids), set(step.reuse)
    i = 0
    while i < len(ids):
        cid, i = ids[i], i + 1
        run = next((r for r in state.runs.get(cid, []) if r.rung == step.rung), None)
        if run is None or not _died_at_boot(run):
            continue
        sib = _lower_memory(by[cid], candidates)
        if sib is not None and sib not in ids:
            ids.append(sib)
            if _earlier(state, sib, step.rung) is not None:
                reuse.add(sib)
    return dataclasses.replace(step, ids=tuple(ids), reuse=frozenset(reuse))


def _keep(state: TuneState, step: Step) -> list[str]:
    """The ids of the step that go on: the best ceil(n/eta) measured without error, feasible
    ones only when any is; in the boot stage, the fastest boot among the same serving."""
    scored = []
    for cid in step.ids:
        if (run := _good(_run_at(state, step, cid))) is not None:
            assert run.score is not None
            scored.append((rank_key(run.score, run.boot.boot_s, cid), run, cid))
    scored.sort(key=lambda t: t[0])
    feasible = [t for t in scored if not t[0][0]]
    pool = feasible or scored
    if STAGES[step.stage].name == BOOT_ONLY and pool:
        cheapest = pool[0][1].score.usd_per_m  # type: ignore[union-attr]
        same = [t for t in pool if t[1].score.usd_per_m  # type: ignore[union-attr]
                <= cheapest * (1 + BOOT_TOLERANCE)]
        return [min(same, key=lambda t: (t[1].boot.boot_s, t[0]))[2]]
    return top([t[2] for t in pool])


def _next(state: TuneState, step: Step, keep: list[str],
          candidates: Sequence[Candidate]) -> Step | None:
    if len(keep) > 1:
        return Step(step.stage, step.local + 1, step.rung + 1, tuple(keep), base=tuple(keep))
    if not keep:
        return None
    winner = next(c for c in candidates if c.id == keep[0])
    return _first_step(step.stage + 1, winner, candidates, state, step.rung + 1)


def replay(state: TuneState, candidates: Sequence[Candidate]) -> tuple[Step | None, list[str]]:
    """The step at state.rung (None past the last; its step-downs so far joined) and the ids
    kept by the step before it."""
    if not candidates:
        return None, []
    step = _first_step(0, candidates[0], candidates, state, 0) \
        or Step(0, 0, 0, (candidates[0].id,), base=(candidates[0].id,))
    keep: list[str] = []
    for _rung in range(state.rung):
        step = _with_step_downs(state, step, candidates)
        keep = _keep(state, step)
        nxt = _next(state, step, keep, candidates)
        if nxt is None:
            return None, keep
        step = nxt
    return _with_step_downs(state, step, candidates), keep


def _unrun(state: TuneState, step: Step) -> list[str]:
    return [i for i in step.to_boot() if _run_at(state, step, i) is None]


def start(state: TuneState, candidates: Sequence[Candidate]) -> None:
    """A fresh state lists every candidate: narrow its first rung to the plan's first step
    (idempotent, so a resume at rung 0 changes nothing)."""
    if state.done or state.rung != 0:
        return
    step, _ = replay(state, candidates)
    if step is None:
        return
    state.at_rung = list(step.ids)
    state.pending = [p for p in state.pending if p in set(_unrun(state, step))]


def stale(state: TuneState, candidates: Sequence[Candidate]) -> bool:
    """A state this plan did not write (another plan's rung): its next steps cannot be
    trusted, so the search stops rather than resume it (fail closed)."""
    if state.done or state.rung == 0:
        return False
    step = current(state, candidates)
    return step is None or not set(step.base) <= set(state.at_rung) <= set(step.ids) or \
        not set(state.pending) <= set(step.to_boot())


def current(state: TuneState, candidates: Sequence[Candidate]) -> Step | None:
    return replay(state, candidates)[0]


def advance(state: TuneState, candidates: Sequence[Candidate]) -> bool:
    """Close the rung, or first add the step-downs its failures call for (the same rung goes
    on); the next step's candidates, or done (True) with the winner in at_rung."""
    step, _ = replay(state, candidates)
    if step is None:
        state.done, state.pending = True, []
        return True
    if missing := _unrun(state, step):
        state.at_rung, state.pending = list(step.ids), missing
        return False
    keep = _keep(state, step)
    nxt = _next(state, step, keep, candidates)
    if nxt is None:
        state.done, state.pending = True, []
        state.at_rung = keep[:1]
        return True
    state.rung += 1
    state.at_rung = list(nxt.ids)
    state.pending = _unrun(state, nxt)
    return False


def reps(state: TuneState, candidates: Sequence[Candidate], base: int) -> int:
    """Repetitions at the current rung: the base, doubled at each later rung of a stage."""
    step = current(state, candidates)
    return base * 2 ** (step.local if step is not None else 0)


def best(state: TuneState) -> str | None:
    """The chosen candidate: the plan's winner when it is done and feasible, else the best
    feasible so far by its latest measurement (a winner that broke a limit at its last rung
    does not hide a candidate measured within them); None when none is feasible."""
    if state.done:
        cid = state.at_rung[0] if state.at_rung else None
        run = latest(state, cid) if cid is not None else None
        if run is not None and run.score is not None and run.score.feasible:
            return cid
    ranked = sorted(
        (rank_key(r.score, r.boot.boot_s, cid), cid)
        for cid in state.runs if (r := latest(state, cid)) is not None and r.score is not None
        and r.score.feasible)
    return ranked[0][1] if ranked else None


def shape(candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
    """The stages the plan would run around the first candidate, each with its size (for the
    estimate: the winners are not known before the search). An upward stage is left out: around
    the stack's own programs its values were all measured by the first stage; what it and the
    step-downs add depends on what fails and wins (the estimate's words say so)."""
    if not candidates:
        return []
    sizes = ((st.name, len(stage_ids(k, candidates[0], candidates)))
             for k, st in enumerate(STAGES) if not st.upward)
    return [(name, n) for name, n in sizes if n > 1] or [(STAGES[0].name, 1)]
