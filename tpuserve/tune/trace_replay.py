"""A request trace replayed through the project's benchmark engine (ops/loadgen.py's client,
ops/prompts.py's calibrated prompts, ops/bench_stats.py's figures), as `tpuserve bench`
measures cells.

Each repetition sends every request of the trace, in order, as a streaming chat completion of
its prompt length (calibrated by the server's /tokenize where it has one, as bench does) asking
for exactly its output tokens (ignore_eos), `clients` in flight at a time (a closed loop); each
--clients level is one cell, labelled with the trace's mean prompt length. Prompt lengths are
calibrated at up to ANCHORS of the trace's distinct lengths and interpolated between them, so a
trace of many lengths costs a bounded number of /tokenize calls.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence

from tpuserve.ops import bench as engine
from tpuserve.ops import loadgen, prompts
from tpuserve.ops.bench_stats import CellStats, RepStats, rep_stats
from tpuserve.ops.errors import OpsError
from tpuserve.ops.server import ServerTarget

ANCHORS = 16
REQUEST_TIMEOUT_S = 600.0  # the longest wait for any one chunk (bench's)
REQUEST_DEADLINE_S = 1800.0  # the longest one request may take (bench's)
REPLAY_DEADLINE_S = 6 * 3600.0  # the whole replay, however long the trace

Trace = Sequence[tuple[int, int]]


def anchors(lengths: Sequence[int]) -> list[int]:
    """The distinct lengths calibrated: all of them, or ANCHORS spread over them (ends kept)."""
    distinct = sorted(set(lengths))
    if len(distinct) <= ANCHORS:
        return distinct
    step = (len(distinct) - 1) / (ANCHORS - 1)
    return sorted({distinct[round(i * step)] for i in range(ANCHORS)})


def prompt_words(lengths: Sequence[int], count: prompts.Counter) -> tuple[dict[int, int], str]:
    """Filler words per distinct prompt length, and how they were found (bench's method)."""
    points = anchors(lengths)
    words, _counted, method = engine.calibrate_prompts(points, count)
    out: dict[int, int] = {}
    for n in sorted(set(lengths)):
        if n in words:
            out[n] = words[n]
            continue
        lo = max(a for a in points if a < n)
        hi = min(a for a in points if a > n)
        out[n] = max(1, round(words[lo] + (words[hi] - words[lo]) * (n - lo) / (hi - lo)))
    return out, method


async def replay(target: ServerTarget, model: str, trace: Trace, clients: Sequence[int],
                 repetitions: int, words: dict[int, int],
                 progress: Callable[[str], None] = lambda _: None,
                 deadline_s: float = REPLAY_DEADLINE_S) -> list[CellStats]:
    """One cell per clients level, `repetitions` replays of the whole trace each. OpsError
    when every request of a repetition failed or the replay passes its deadline."""
    url = target.v1 + "/chat/completions"
    headers = target.headers() | {"Content-Type": "application/json"}
    nonces = iter(range(1, 10**prompts.NONCE_DIGITS))  # every request its own prompt
    longest = max(o for _p, o in trace)
    context = round(statistics.fmean(p for p, _o in trace))
    cells: list[CellStats] = []
    try:
        async with asyncio.timeout(deadline_s), loadgen.LoadClient(
                ssl=target.ssl_context, timeout_s=REQUEST_TIMEOUT_S,
                deadline_s=REQUEST_DEADLINE_S) as client:
            for level in clients:
                reps: list[RepStats] = []
                for rep in range(repetitions):
                    bodies = [loadgen.chat_body(model, prompts.messages(words[p], next(nonces)),
                                                o, ignore_eos=True) for p, o in trace]
                    await client.warm(url, min(level, len(bodies)))
                    records = await client.run(url, bodies, headers, level,
                                               max_tokens=longest)
                    try:
                        stats = rep_stats(records)
                    except ValueError as exc:
                        raise OpsError(f"trace x {level} clients, repetition {rep + 1}: "
                                       f"{exc}") from None
                    reps.append(stats)
                    progress(f"trace x {level:>3} clients  rep {rep + 1}/{repetitions}: "
                             f"{stats.output_tokens_per_s:,.1f} tok/s, TTFT median "
                             f"{stats.ttft_ms_median:,.1f} ms")
                cells.append(CellStats(context, level, tuple(reps)))
    except TimeoutError:
        raise OpsError(f"the trace replay did not finish within {deadline_s:g} s "
                       f"({len(cells)} cells done)") from None
    return cells
