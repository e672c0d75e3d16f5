"""The search plan: successive halving stage by stage, one group of flags per stage, each stage
anchored on the previous stage's winner.

Why stages and not one halving over every combination: a boot is the unit of cost (SPEC 4: 857 s
cold, 685 s of it compiling), and halving boots every candidate at its first rung. The planner's
sets on Gemma 4 E2B / v5litepod-1 cross to 144+ combinations: 216 boots, about $31 at flex's
$0.60/hour (SPEC 2), six times the `--budget-usd 5` a user would give. So the flags are grouped
by what they change, and only flags that interact are crossed:

1. programs: max_num_batched_tokens, max_num_seqs, VLLM_TPU_BUCKET_PADDING_GAP. Together they
   set the compiled program set and the scheduler: the token buckets are the powers of two up
   to the batched-token budget, or steps of the gap past it (tpu-inference's
   runner/utils.get_token_paddings, tpu_runner.py passes padding_gap=VLLM_TPU_BUCKET_PADDING_GAP),
   so the gap changes every step's padding, that is serving, not only compile time; the
   sequence cap sizes the batch those buckets serve. Crossed, and searched by halving.
2. speculative: off or n-gram (when allowed): drafting changes every decode step.
3. memory: gpu_memory_utilization, the KV pool (and the memory wall, SPEC 4): its steps run on
   the winner's programs, after them, so a step that dies at boot costs one boot.
4. context: the max_model_len ladder on that pool (block size follows it, SPEC 4).
5. boot: NUM_PRECOMPILE_WORKERS. It changes only how the same programs are compiled, never
   what is served, so it is tried once per value on the final winner and chosen for its
   measured boot time among the variants whose $/M is within BOOT_TOLERANCE of the best (the
   benchmark's cv is at most 1% in most cells, SPEC 6: twice that is noise). Its boots hit the
   compile cache the winner published, so they measure a restart with those workers; a cold
   compile's speed-up shows only where the cache missed (each boot's cache is in the report).

Within a stage the anchor (the winner so far) is not booted again at the stage's first rung: its
latest measurement competes. A stage of one value is skipped. Every candidate still comes from
the candidate list (the planner's and [tune]'s sets, validated), so the plan is derived from that
list and the state's runs alone: the state file needs nothing new, and a resume replays it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpuserve.tune.candidates import Candidate
from tpuserve.tune.halving import latest, top
from tpuserve.tune.score import rank_key
from tpuserve.tune.state import Run, TuneState

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("programs", ("max_num_batched_tokens", "max_num_seqs", "VLLM_TPU_BUCKET_PADDING_GAP")),
    ("speculative", ("speculative_config",)),
    ("memory", ("gpu_memory_utilization",)),
    ("context", ("max_model_len",)),
    ("boot", ("NUM_PRECOMPILE_WORKERS",)),
)
BOOT_ONLY = "boot"
BOOT_TOLERANCE = 0.02  # $/M within 2% of the best: the same serving (twice SPEC 6's 1% cv)


@dataclass(frozen=True)
class Step:
    """One rung: the ids entering it, in a stage; the anchor was measured before it."""

    stage: int
    local: int  # the rung within the stage (repetitions double with it)
    ids: tuple[str, ...]
    anchor: str | None = None  # not booted again at the stage's first rung

    @property
    def name(self) -> str:
        return STAGES[self.stage][0]

    def to_boot(self) -> list[str]:
        return [i for i in self.ids if i != self.anchor]


def stage_ids(stage: int, anchor: Candidate, candidates: Sequence[Candidate]) -> list[str]:
    """The candidates equal to the anchor but in the stage's flags, in the list's order."""
    dims = set(STAGES[stage][1])
    a = anchor.as_dict
    return [c.id for c in candidates if all(v == a[k] for k, v in c.values if k not in dims)]


def _first_step(stage: int, anchor: Candidate, candidates: Sequence[Candidate],
                measured: bool) -> Step | None:
    for k in range(stage, len(STAGES)):
        ids = stage_ids(k, anchor, candidates)
        if len(ids) > 1:
            return Step(k, 0, tuple(ids), anchor.id if measured else None)
    return None


def _run_for(state: TuneState, step: Step, rung: int, cid: str) -> Run | None:
    runs = state.runs.get(cid, [])
    run = next((r for r in runs if r.rung == rung), None)
    if run is None and cid == step.anchor:
        earlier = [r for r in runs if r.rung < rung and r.score is not None and r.error is None]
        run = max(earlier, key=lambda r: r.rung) if earlier else None
    return run if run is not None and run.score is not None and run.error is None else None


def _keep(state: TuneState, step: Step, rung: int) -> list[str]:
    """The ids of the step that go on: the best ceil(n/eta) measured without error, feasible
    ones only when any is; in the boot stage, the fastest boot among the same serving."""
    scored = []
    for cid in step.ids:
        if (run := _run_for(state, step, rung, cid)) is not None:
            assert run.score is not None
            scored.append((rank_key(run.score, run.boot.boot_s, cid), run, cid))
    scored.sort(key=lambda t: t[0])
    feasible = [t for t in scored if not t[0][0]]
    pool = feasible or scored
    if STAGES[step.stage][0] == BOOT_ONLY and pool:
        cheapest = pool[0][1].score.usd_per_m  # type: ignore[union-attr]
        same = [t for t in pool if t[1].score.usd_per_m  # type: ignore[union-attr]
                <= cheapest * (1 + BOOT_TOLERANCE)]
        return [min(same, key=lambda t: (t[1].boot.boot_s, t[0]))[2]]
    return top([t[2] for t in pool])


def _next(step: Step, keep: list[str], candidates: Sequence[Candidate]) -> Step | None:
    if len(keep) > 1:
        return Step(step.stage, step.local + 1, tuple(keep))
    if not keep:
        return None
    winner = next(c for c in candidates if c.id == keep[0])
    return _first_step(step.stage + 1, winner, candidates, measured=True)


def replay(state: TuneState, candidates: Sequence[Candidate]) -> tuple[Step | None, list[str]]:
    """The step at state.rung (None past the last) and the ids kept by the step before it."""
    if not candidates:
        return None, []
    step = _first_step(0, candidates[0], candidates, measured=False) \
        or Step(0, 0, (candidates[0].id,))
    keep: list[str] = []
    for rung in range(state.rung):
        keep = _keep(state, step, rung)
        nxt = _next(step, keep, candidates)
        if nxt is None:
            return None, keep
        step = nxt
    return step, keep


def start(state: TuneState, candidates: Sequence[Candidate]) -> None:
    """A fresh state lists every candidate: narrow its first rung to the plan's first step
    (idempotent, so a resume at rung 0 changes nothing)."""
    if state.done or state.rung != 0:
        return
    step, _ = replay(state, candidates)
    if step is None:
        return
    state.at_rung = list(step.ids)
    boot = set(step.to_boot())
    state.pending = [p for p in state.pending if p in boot]


def stale(state: TuneState, candidates: Sequence[Candidate]) -> bool:
    """A state this plan did not write (another plan's rung): its next steps cannot be
    trusted, so the search stops rather than resume it (fail closed)."""
    if state.done or state.rung == 0:
        return False
    step = current(state, candidates)
    return step is None or set(state.at_rung) != set(step.ids) or \
        not set(state.pending) <= set(step.to_boot())


def current(state: TuneState, candidates: Sequence[Candidate]) -> Step | None:
    return replay(state, candidates)[0]


def advance(state: TuneState, candidates: Sequence[Candidate]) -> bool:
    """Close the rung: the next step's candidates, or done (True) with the winner in at_rung."""
    step, _ = replay(state, candidates)
    if step is None:
        state.done, state.pending = True, []
        return True
    keep = _keep(state, step, state.rung)
    nxt = _next(step, keep, candidates)
    if nxt is None:
        state.done, state.pending = True, []
        state.at_rung = keep[:1]
        return True
    state.rung += 1
    state.at_rung = list(nxt.ids)
    state.pending = nxt.to_boot()
    return False


def reps(state: TuneState, candidates: Sequence[Candidate], base: int) -> int:
    """Repetitions at the current rung: the base, doubled at each later rung of a stage."""
    step = current(state, candidates)
    return base * 2 ** (step.local if step is not None else 0)


def best(state: TuneState) -> str | None:
    """The chosen candidate: the plan's winner when it is done (if feasible), else the best
    feasible so far by its latest measurement; None when none is feasible."""
    if state.done:
        cid = state.at_rung[0] if state.at_rung else None
        run = latest(state, cid) if cid is not None else None
        return cid if run is not None and run.score is not None and run.score.feasible \
            else None
    ranked = sorted(
        (rank_key(r.score, r.boot.boot_s, cid), cid)
        for cid in state.runs if (r := latest(state, cid)) is not None and r.score is not None
        and r.score.feasible)
    return ranked[0][1] if ranked else None


def shape(candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
    """The stages the plan would run around the first candidate, each with its size (for the
    estimate: the winners are not known before the search)."""
    if not candidates:
        return []
    sizes = ((name, len(stage_ids(k, candidates[0], candidates)))
             for k, (name, _dims) in enumerate(STAGES))
    return [(name, n) for name, n in sizes if n > 1] or [(STAGES[0][0], 1)]
