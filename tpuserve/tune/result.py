"""A tune run as a reviewable change: the TOML overlay ([stacks.NAME], each chosen value with
its measurement in a comment), the Markdown report (every candidate, the Pareto set, the boot
times) and the chart's points."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpuserve.accelerators import ACCELERATORS
from tpuserve.settings.accelerator_rules import memory_ceiling
from tpuserve.settings.learned_profiles import pin
from tpuserve.tune import halving
from tpuserve.tune.candidates import DIMENSIONS, OFF, UNSET, Candidate, Refused
from tpuserve.tune.plan import STAGES
from tpuserve.tune.score import Constraints, Score, pareto
from tpuserve.tune.state import Run, TuneState


@dataclass(frozen=True)
class Summary:
    stack: str
    usd_per_hour: float
    price_source: str
    limits: Constraints
    workload: str
    status: str
    best: str | None
    node_on: str
    estimate: Mapping[str, float]
    image: str | None = None  # the stack's vllm.image: the overlay pins the build measured
    accelerator: str | None = None  # the stack's slice: whose gpu_memory_utilization ceiling


def _money(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"${v:.4f}"


def _fig(s: Score) -> str:
    cv = f", cv {s.tok_s_cv:.1%}" if s.tok_s_cv is not None else ""
    tpot = f", TPOT p50 {s.tpot_p50_ms:.2f} ms" if s.tpot_p50_ms is not None else ""
    return (f"{_money(s.usd_per_m)}/M output tokens, {s.tok_s:.1f} tok/s{cv}, TTFT p90 "
            f"{s.ttft_p90_ms:.0f} ms{tpot}")


def points(state: TuneState) -> dict[str, tuple[float, float, float]]:
    """($/M, worst p90 TTFT, boot s) of every feasible candidate's latest measurement."""
    out = {}
    for cid in state.runs:
        r = halving.latest(state, cid)
        if r is not None and r.score is not None and r.score.feasible:
            out[cid] = (r.score.usd_per_m, r.score.ttft_p90_ms, r.boot.boot_s)
    return out


def pareto_set(state: TuneState) -> list[str]:
    return pareto(points(state))


def overlay_toml(summary: Summary, chosen: Candidate, state: TuneState,
                 candidates: Mapping[str, Candidate]) -> str:
    """The [stacks.NAME] overlay of the chosen config; TPUSERVE_CONFIG=yours.toml:THIS."""
    run = halving.latest(state, chosen.id)
    assert run is not None and run.score is not None
    name = summary.stack
    lines = [
        f"# tpuserve tune {name}: candidate {chosen.id!r}, measured on the stack's node",
        (f"# ({summary.workload}; {run.reps} repetitions at rung {run.rung}; boot "
        f"{run.boot.boot_s:.0f} s): {_fig(run.score)}"),
        (f"# at ${summary.usd_per_hour:.4g}/hour ({summary.price_source}); constraints: "
        f"{summary.limits.words()}."),
        "# Add it after your own file: TPUSERVE_CONFIG=your.toml:THIS_FILE",
        "",
        f"[stacks.{name}.vllm]",
    ]
    env_lines = []
    for dim, path in DIMENSIONS:
        value = chosen.as_dict[dim]
        # The header carries the chosen config's figures; each line, its $/M beside the best
        # measured config with another value of the flag.
        note = f"measured: {_money(run.score.usd_per_m)}/M" + _other(dim, value, state,
                                                                      candidates)
        if value == UNSET:
            lines.append(f"# {dim}: left to vLLM's default; {note}")
            continue
        if value == OFF:
            lines.append(f"# {dim}: none; {note}")
            continue
        if dim == "speculative_config":
            table = ", ".join(f"{k} = {json.dumps(x)}" for k, x in json.loads(value).items())
            lines.append(f"{dim} = {{ {table} }}  # {note}")
            continue
        line = f"{path[-1]} = {value!r}  # {note}".replace("True", "true")
        (env_lines if path[0] == "env" else lines).append(line)
    if chosen.overlay().get("allow_untested_gpu_memory_utilization"):
        lines.append("allow_untested_gpu_memory_utilization = true  # above "
                     f"{_ceiling(summary.accelerator)}: booted and measured on this node by "
                     "the tuner")
    lines += _image_lines(summary.image, run.boot.digest)
    lines += ["", f"[stacks.{name}.vllm.env]", *env_lines]
    return "\n".join(lines) + "\n"


def _ceiling(accelerator: str | None) -> str:
    """The ceiling the settings apply to the slice (settings/accelerator_rules.py), with its
    source: measured on the measured slice, derived on another."""
    a = ACCELERATORS.get(accelerator or "")
    if a is None:
        return "the slice's gpu_memory_utilization ceiling"
    c = memory_ceiling(a)
    return f"the slice's gpu_memory_utilization ceiling {c.value:g}, {c.source}"


def _image_lines(image: str | None, digest: str | None) -> list[str]:
    """`image` pinned to the build the chosen boot ran (its `image` phase): the overlay then
    deploys what was measured, and `plan` uses the recorded profile of that digest."""
    if image is None:
        return []
    if digest is None:
        return [(f"# image: not pinned: the chosen config's boot reported no image digest, so "
                 f"which build of {image} was measured is not known")]
    return [(f"image = {json.dumps(pin(image, digest))}  # the build measured (the boot's "
             "image phase): a tag moves")]


def _other(dim: str, value: object, state: TuneState,
           candidates: Mapping[str, Candidate]) -> str:
    """The best measured config with another value of DIM, for comparison."""
    best: tuple[float, object] | None = None
    infeasible: set[str] = set()
    for cid in state.runs:
        r = halving.latest(state, cid)
        c = candidates.get(cid)
        if c is None or r is None or r.score is None or c.as_dict[dim] == value:
            continue
        if not r.score.feasible:
            infeasible.add(str(c.as_dict[dim]))
        elif best is None or r.score.usd_per_m < best[0]:
            best = (r.score.usd_per_m, c.as_dict[dim])
    if best is not None:
        return f"; best with {dim} = {best[1]}: {_money(best[0])}/M"
    if infeasible:
        return f"; with {dim} = {', '.join(sorted(infeasible))}: none met the constraints"
    return ""


def report_md(summary: Summary, state: TuneState, candidates: Mapping[str, Candidate],
              refused: Sequence[Refused], chart_name: str | None) -> str:
    front = pareto_set(state)
    pts = points(state)
    out = [f"# tpuserve tune {summary.stack}", "",
           (f"- status: **{summary.status}**; chosen: `{summary.best or 'none'}`; the node is "
           f"on: `{summary.node_on}`"),
           f"- workload: {summary.workload}",
           (f"- objective: $/M output tokens at ${summary.usd_per_hour:.4g}/hour "
           f"({summary.price_source}); constraints: {summary.limits.words()}"),
           (f"- search: successive halving (eta {halving.ETA}) stage by stage "
           f"({', '.join(st.name for st in STAGES)}), {len(candidates)} candidates, "
           f"{len(refused)} refused by the settings, the planner or the workload; "
           f"{sum(len(v) for v in state.runs.values())} boots"),
           (f"- node time: estimated {summary.estimate['hours']:.2f} h "
           f"(${summary.estimate['usd']:.2f}; derived: {summary.estimate['boots']:.0f} boots, "
           f"{summary.estimate.get('bench_s', 0):.0f} s of benchmark and the return boot), "
           f"spent {state.spent_s / 3600:.2f} h "
           f"(${state.spent_s / 3600 * summary.usd_per_hour:.2f}; measured)"), ""]
    if chart_name:
        x0, x1 = (min(p[0] for p in pts.values()), max(p[0] for p in pts.values())) \
            if pts else (0, 0)
        y0, y1 = (min(p[1] for p in pts.values()), max(p[1] for p in pts.values())) \
            if pts else (0, 0)
        out += [f"![Pareto chart]({chart_name})", "",
                (f"Across: $/M output tokens {_money(x0)} to {_money(x1)}; up: worst-cell TTFT "
                f"p90 {y0:.0f} to {y1:.0f} ms. Blue: the Pareto set; green ring: chosen."), ""]
    out += ["## Pareto set ($/M, TTFT p90, boot time)", ""]
    out += [f"- `{cid}`: {_money(pts[cid][0])}/M, TTFT p90 {pts[cid][1]:.0f} ms, boot "
            f"{pts[cid][2]:.0f} s" for cid in front] or ["- none feasible"]
    out += ["", "## Every candidate", "",
            ("| candidate | runs (rung:reps) | $/M | tok/s (cv) | TTFT p90 ms | TPOT p50 ms | "
            "stream tok/s | boot s | compile s | cache | result |"),
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cid in candidates:
        out.append(_row(cid, state.runs.get(cid, []), cid in front, cid == summary.best))
    out += ["", "## Boot times (measured on the node, from its guest attributes)", ""]
    out += _boot_lines(state)
    if refused:
        out += ["", "## Refused before any boot", ""]
        out += [f"- `{r.what}`: {r.reason}" for r in refused]
    return "\n".join(out) + "\n"


def _row(cid: str, runs: Sequence[Run], front: bool, chosen: bool) -> str:
    if not runs:
        return f"| `{cid}` | - | | | | | | | | | not run |"
    last = max(runs, key=lambda r: r.rung)
    s, b = last.score, last.boot
    tried = " ".join(f"{r.rung}:{r.reps}" for r in runs)
    boot = f"{b.boot_s:.0f}"
    comp = "" if b.compile_s is None else f"{b.compile_s:.0f}"
    cache = {True: "warm", False: "cold", None: ""}[b.cache_hit]
    if last.error or s is None:
        why = (last.error or "").replace("|", "/")
        return f"| `{cid}` | {tried} | | | | | | {boot} | {comp} | {cache} | failed: {why} |"
    result = "chosen" if chosen else "Pareto" if front else \
        ("breaks " + "; ".join(s.violations)) if s.violations else "dominated"
    cv = f" ({s.tok_s_cv:.1%})" if s.tok_s_cv is not None else ""
    tpot = "" if s.tpot_p50_ms is None else f"{s.tpot_p50_ms:.2f}"
    stream = "" if s.stream_tok_s is None else f"{s.stream_tok_s:.1f}"
    return (f"| `{cid}` | {tried} | {_money(s.usd_per_m)} | {s.tok_s:.1f}{cv} | "
            f"{s.ttft_p90_ms:.0f} | {tpot} | {stream} | {boot} | {comp} | {cache} | {result} |")


def _boot_lines(state: TuneState) -> list[str]:
    boots = [r.boot for rs in state.runs.values() for r in rs if r.boot.ok]
    out = []
    groups = (("cold (compile cache missed)", [b for b in boots if b.cache_hit is False]),
              ("warm (compile cache hit)", [b for b in boots if b.cache_hit]), ("all", boots))
    for label, group in groups:
        if group:
            comp = [b.compile_s for b in group if b.compile_s is not None]
            secs = [b.boot_s for b in group]
            out.append(f"- {label}: {len(group)} boots, boot {statistics.median(secs):.0f} s "
                       f"median ({min(secs):.0f}-{max(secs):.0f})"
                       + (f", compile {statistics.median(comp):.0f} s median" if comp else ""))
    return out or ["- no boot reached readiness"]
