"""An in-process node for the tuner's tests, with a stated toy response model (no tests here).

The model, per seed (random.Random(seed)), for a config's values:
- throughput: each searched flag has one best value (factor 1.0) and the others lose 6-25%
  (drawn per value); aggregate tok/s of a cell = 40 x clients^0.8 x the product of the factors,
  each repetition times 1 + N(0, 0.5%) noise;
- TTFT p90 = (60 + context / 20) x clients^0.3 ms x a factor per value drawn in [0.8, 1.25];
  TPOT p50 = 1000 / per-stream tok/s, per-stream = aggregate / clients;
- boot: 120 s + compile, compile = 600 s / sqrt(NUM_PRECOMPILE_WORKERS) on a cold cache,
  a fifth of it when the same program set (every flag but the memory fraction and the
  workers) booted before (a cache hit);
- a memory wall: gpu_memory_utilization at or above the seed's wall fails at 691 s with
  RuntimeProgramAllocationFailure (the wall is 0.94, 0.93 or none, by seed).
The tuner sees only BootRecords and Measurements; `expected_best` is the test's own brute force.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve.ops.bench_stats import CellStats, RepStats
from tpuserve.tune.candidates import NAMES, UNSET, Candidate, configured, speculative_value
from tpuserve.tune.node import BootRecord, CandidateFailed, Measurement, NodeGone
from tpuserve.tune.score import Constraints
from tpuserve.tune.workload import Workload

WALLS = {1: 0.94, 2: 1.01, 3: 0.93}
TERRAFORM = None


def values_of(overlay: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    env = overlay.get("env", {})
    out = dict(base)
    for name in NAMES:
        if name == "speculative_config":  # a table in the overlay, its JSON in a candidate
            out[name] = speculative_value(overlay.get(name))
        elif name in overlay:
            out[name] = overlay[name]
        elif name in env:
            out[name] = env[name]
        elif name == "max_num_seqs":
            out[name] = UNSET
    return out


TOY_DIGEST = "sha256:" + "7" * 64  # the toy's image build, as a boot's `image` phase says it


class ToyNode:
    def __init__(self, seed: int, sets: Mapping[str, Sequence[Any]], base: Mapping[str, Any],
                 *, wall: float | None = None) -> None:
        rng = random.Random(seed)
        self._tput: dict[tuple[str, Any], float] = {}
        self._ttft: dict[tuple[str, Any], float] = {}
        for name in NAMES:
            values = list(sets[name])
            best = rng.choice(values)
            for v in values:
                self._tput[name, v] = 1.0 if v == best else 1 - rng.uniform(0.06, 0.25)
                self._ttft[name, v] = rng.uniform(0.8, 1.25)
        self._wall = WALLS.get(seed, 1.01) if wall is None else wall
        self._noise = random.Random(seed * 7919)
        self._base = dict(base)
        self._seen: set[tuple[Any, ...]] = set()
        self.current: dict[str, Any] | None = None  # None: Terraform's script
        self.half_tried = False  # True between an apply and its measurement
        self.log: list[tuple[str, Any]] = []
        self.measures = 0
        self.interrupt_at_measure: int | None = None
        self.interrupt_in_apply_of: str | None = None
        self.crash: set[str] = set()
        self.gone_at_measure: int | None = None
        # The build each boot reports in its `image` phase (None: a boot that never got there).
        self.digest: str | None = TOY_DIGEST
        self.failed_digest: str | None = TOY_DIGEST

    # ---- the response model
    def values(self) -> dict[str, Any]:
        return values_of(self.current or {}, self._base)

    def factor(self, values: Mapping[str, Any]) -> float:
        return math.prod(self._tput[n, values[n]] for n in NAMES)

    def ttft_factor(self, values: Mapping[str, Any]) -> float:
        return math.prod(self._ttft[n, values[n]] for n in NAMES)

    def boots(self, values: Mapping[str, Any]) -> bool:
        return values["gpu_memory_utilization"] < self._wall

    def _boot(self, overlay: Mapping[str, Any] | None) -> BootRecord:
        v = values_of(overlay or {}, self._base)
        if not self.boots(v):
            return BootRecord(False, 691.0, error="RuntimeProgramAllocationFailure",
                              digest=self.failed_digest)
        programs = tuple(v[n] for n in NAMES if n not in ("gpu_memory_utilization",
                                                         "NUM_PRECOMPILE_WORKERS"))
        warm = programs in self._seen
        self._seen.add(programs)
        compile_s = 600 / math.sqrt(v["NUM_PRECOMPILE_WORKERS"]) * (0.2 if warm else 1.0)
        return BootRecord(True, 120 + compile_s, compile_s, warm, digest=self.digest)

    # ---- TuneNode
    def apply(self, overlay: Mapping[str, Any]) -> BootRecord:
        self.log.append(("apply", dict(overlay)))
        self.current, self.half_tried = dict(overlay), True
        if self.interrupt_in_apply_of is not None and \
                Candidate(tuple(values_of(overlay, self._base).items())).id == \
                self.interrupt_in_apply_of:
            self.interrupt_in_apply_of = None
            raise KeyboardInterrupt
        rec = self._boot(overlay)
        if rec.ok:
            self.half_tried = True
        return rec

    def measure(self, workload: Workload, repetitions: int) -> Measurement:
        self.measures += 1
        if self.measures == self.interrupt_at_measure:
            raise KeyboardInterrupt
        if self.measures == self.gone_at_measure:
            raise NodeGone("the flex run ended")
        v = self.values()
        if Candidate(tuple(v.items())).id in self.crash:
            raise CandidateFailed("the server exited with status 139 while measured")
        cells = []
        for context in workload.contexts:
            for clients in workload.clients:
                reps = []
                for _ in range(repetitions):
                    tok_s = self.tok_s(v, clients) * (1 + self._noise.gauss(0, 0.005))
                    ttft = self.ttft(v, context, clients)
                    stream = tok_s / clients
                    reps.append(RepStats(
                        requests=clients, errors=0, output_tokens=clients * 256, span_s=60.0,
                        output_tokens_per_s=tok_s, ttft_ms_median=ttft * 0.7,
                        ttft_ms_p90=ttft, tpot_ms_median=1000 / stream,
                        per_stream_tokens_per_s=stream, prompt_tokens_mean=context))
                cells.append(CellStats(context, clients, tuple(reps)))
        self.half_tried = False
        return Measurement(tuple(cells), 60.0 * repetitions * len(cells))

    def restore(self) -> BootRecord:
        self.log.append(("restore", None))
        self.current, self.half_tried = TERRAFORM, False
        return self._boot(None)

    def tok_s(self, v: Mapping[str, Any], clients: int) -> float:
        return 40 * clients ** 0.8 * self.factor(v)

    def ttft(self, v: Mapping[str, Any], context: int, clients: int) -> float:
        return (60 + context / 20) * clients ** 0.3 * self.ttft_factor(v)


def expected_best(node: ToyNode, candidates: Sequence[Candidate], workload: Workload,
                  limits: Constraints) -> str | None:
    """The test's brute force: the noise-free cheapest candidate that boots and meets LIMITS."""
    best: tuple[float, str] | None = None
    for c in candidates:
        v = c.as_dict
        if not node.boots(v):
            continue
        cells = [(ctx, n) for ctx in workload.contexts for n in workload.clients]
        ok = all((limits.max_ttft_p90_ms is None
                  or node.ttft(v, ctx, n) <= limits.max_ttft_p90_ms)
                 and (limits.min_stream_tok_s is None
                      or node.tok_s(v, n) / n >= limits.min_stream_tok_s) for ctx, n in cells)
        if not ok:
            continue
        cost = sum(1 / node.tok_s(v, n) for _, n in cells)
        if best is None or cost < best[0]:
            best = (cost, c.id)
    return None if best is None else best[1]


def base_values(d: Any) -> dict[str, Any]:
    return configured(d)
