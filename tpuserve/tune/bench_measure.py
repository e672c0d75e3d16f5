"""A TuneNode's `measure` on a real server: the project's benchmark (ops/bench.py, what
`tpuserve bench` runs) over the workload's cells, or the workload's request trace replayed
through the same engine (tune/trace_replay.py), its figures as bench reports them. A sweep
with a failed request is no proof the config serves: the candidate fails (fail closed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpuserve.ops import bench as engine
from tpuserve.ops import server
from tpuserve.ops.bounded_http import Deadline
from tpuserve.ops_error import OpsError
from tpuserve.tune import trace_replay
from tpuserve.tune.node import CandidateFailed, Measurement
from tpuserve.tune.workload import Workload

if TYPE_CHECKING:
    from tpuserve.ops.server import ServerTarget


def bench_measure(target_for: Callable[[], ServerTarget], max_model_len: int,
                  log: Callable[[str], None] = lambda _: None,
                  ) -> Callable[[Workload, int], Measurement]:
    # The prompts' calibration (/tokenize at each context) depends on the served model's
    # tokenizer alone, which no candidate changes: done once per model, not per candidate.
    calibrated: dict[tuple[Any, ...], Any] = {}

    def measure(workload: Workload, repetitions: int) -> Measurement:
        if workload.trace:
            return _replay(target_for, workload, repetitions, log, calibrated)
        plan = engine.BenchPlan(contexts=workload.contexts, clients=workload.clients,
                                repetitions=repetitions, output_tokens=workload.output_tokens)
        start = time.monotonic()
        try:
            target = target_for()
            with server.http_client(60.0, verify=target.ssl_context,
                                    deadline=Deadline(engine.PREFLIGHT_DEADLINE_S)) as http:
                model, mml = server.served_model(http, target)
                plan.validate(mml or max_model_len)
                key = ("cells", model, tuple(plan.contexts))
                if key not in calibrated:
                    calibrated[key] = engine.calibrate_prompts(
                        plan.contexts, lambda m: server.tokenize_count(http, target, model, m))
                words, counted, method = calibrated[key]
            result = asyncio.run(engine.run_bench(
                target, model, plan, words, prompt_length_method=method,
                prompt_tokens_target=counted, progress=log))
        except OpsError as exc:
            raise CandidateFailed(f"the benchmark failed: {exc.line}") from None
        if result.errors or not result.cells:
            raise CandidateFailed(f"{result.errors} request(s) failed in the benchmark; "
                                  f"{len(result.cells)} cell(s) measured")
        return Measurement(tuple(result.cells), time.monotonic() - start, result.errors)

    return measure


def _replay(target_for: Callable[[], ServerTarget], workload: Workload, repetitions: int,
            log: Callable[[str], None], calibrated: dict[tuple[Any, ...], Any]) -> Measurement:
    start = time.monotonic()
    levels = workload.clients or (1,)
    try:
        target = target_for()
        with server.http_client(60.0, verify=target.ssl_context,
                                deadline=Deadline(engine.PREFLIGHT_DEADLINE_S)) as http:
            model, mml = server.served_model(http, target)
            longest = max(p + o for p, o in workload.trace)
            if mml is not None and longest > mml:
                raise OpsError(f"--trace {workload.trace_path}: a request of {longest} tokens "
                               f"exceeds the server's max_model_len {mml}")
            key = ("trace", model, tuple(p for p, _o in workload.trace))
            if key not in calibrated:
                calibrated[key] = trace_replay.prompt_words(
                    [p for p, _o in workload.trace],
                    lambda m: server.tokenize_count(http, target, model, m))
            words, _method = calibrated[key]
        cells = asyncio.run(trace_replay.replay(target, model, workload.trace, levels,
                                                repetitions, words, log))
    except OpsError as exc:
        raise CandidateFailed(f"the trace replay failed: {exc.line}") from None
    errors = sum(c.errors for c in cells)
    if errors or not cells:
        raise CandidateFailed(f"{errors} request(s) failed in the trace replay; "
                              f"{len(cells)} cell(s) measured")
    return Measurement(tuple(cells), time.monotonic() - start, errors)
