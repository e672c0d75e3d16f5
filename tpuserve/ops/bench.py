"""The SPEC section 6 sweep: contexts x clients x repetitions against one OpenAI-compatible server.

Each repetition of a cell sends `clients x requests_per_client` streaming chat completions with
`clients` in flight at any time (a closed loop), each asking for exactly `output_tokens` tokens
(vLLM's ignore_eos). One client (loadgen.LoadClient) serves the whole run; a cell starts with
one unrecorded warm-up request, and each repetition with `clients` keep-alive connections
opened and warmed, so no timed window includes connection setup (unless `cold`: a new
connection per request).
Statistics: see bench_stats. The JSON (`BenchResult.to_json`) is the throughput table
planner.load_throughput reads: {"cells": [{"context", "clients", "output_tokens_per_s", ...}], ...}.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl as ssl_lib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve.planner.arithmetic import usd_per_million_tokens

from . import loadgen, prompts
from .bench_stats import CellStats, RepStats, rep_stats
from .errors import EXIT_USAGE, OpsError
from .server import ServerTarget

# SPEC 6's grid.
DEFAULT_CONTEXTS = (128, 1024, 8192)
DEFAULT_CLIENTS = (1, 4, 16, 64)
DEFAULT_REPETITIONS = 3
DEFAULT_OUTPUT_TOKENS = 256
DEFAULT_REQUESTS_PER_CLIENT = 4
# Listing models and calibrating prompt lengths (a few /tokenize calls per context).
PREFLIGHT_DEADLINE_S = 300.0


@dataclass(frozen=True)
class BenchPlan:
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    clients: tuple[int, ...] = DEFAULT_CLIENTS
    repetitions: int = DEFAULT_REPETITIONS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT
    warmup: bool = True
    ignore_eos: bool = True
    timeout_s: float = 600.0  # the longest wait for any one chunk
    deadline_s: float = 1800.0  # the longest one request may take, whatever the server sends
    run_deadline_s: float | None = None  # the whole sweep (None: unbounded)
    cold: bool = False  # a new connection per request: TTFT includes connection setup

    def validate(self, max_model_len: int | None) -> None:
        """Raise OpsError naming the option, the value and the rule."""
        def bad(option: str, value: object, rule: str) -> OpsError:
            return OpsError(f"{option} = {value!r}: {rule}", exit_code=EXIT_USAGE)

        if not self.contexts or any(c < 1 for c in self.contexts):
            raise bad("--contexts", self.contexts, "give positive token counts, e.g. 128,1024")
        if not self.clients or any(c < 1 for c in self.clients):
            raise bad("--clients", self.clients, "give positive client counts, e.g. 1,4,16,64")
        if self.repetitions < 1:
            raise bad("--repetitions", self.repetitions, "must be >= 1 (SPEC 6 used 3)")
        if self.output_tokens < 2:
            raise bad("--output-tokens", self.output_tokens, "must be >= 2 (TPOT needs two)")
        if self.requests_per_client < 1:
            raise bad("--requests-per-client", self.requests_per_client, "must be >= 1")
        if not self.deadline_s > 0:
            raise bad("--request-deadline", self.deadline_s, "must be > 0 seconds")
        if self.run_deadline_s is not None and not self.run_deadline_s > 0:
            raise bad("--deadline", self.run_deadline_s, "must be > 0 seconds")
        if max_model_len is not None:
            worst = max(self.contexts) + self.output_tokens
            if worst > max_model_len:
                raise bad(
                    "--contexts", max(self.contexts),
                    f"context + --output-tokens ({worst}) exceeds the server's max_model_len "
                    f"{max_model_len}",
                )


# RepStats fields named as vllm bench serve names its figures (p50 = median).
VLLM_METRICS = (
    "ttft_ms_median", "ttft_ms_p90", "ttft_ms_p99",
    "tpot_ms_median", "tpot_ms_p90", "tpot_ms_p99",
    "itl_ms_median", "itl_ms_p90", "itl_ms_p99",
    "e2el_ms_median", "e2el_ms_p90", "e2el_ms_p99",
)


@dataclass(frozen=True)
class FailedCell:
    context: int
    clients: int
    error: str


@dataclass
class BenchResult:
    base_url: str
    model: str
    plan: BenchPlan
    prompt_length_method: str  # "tokenize" or "approximation"
    prompt_tokens_target: dict[int, int | None]  # context -> count /tokenize gave
    started_at: str
    cells: list[CellStats] = field(default_factory=list)
    failed: list[FailedCell] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.cells) + len(self.failed)

    def to_json(self, usd_per_hour: Mapping[str, float]) -> dict[str, Any]:
        """planner.load_throughput's schema plus everything measured; prices are $/hour of
        the whole slice per provisioning model."""
        return {
            "cells": [_cell_json(c, usd_per_hour) for c in self.cells],
            "failed_cells": [vars(f) for f in self.failed],
            "base_url": self.base_url,
            "model": self.model,
            "started_at": self.started_at,
            "prompt_length_method": self.prompt_length_method,
            "plan": {
                "contexts": list(self.plan.contexts),
                "clients": list(self.plan.clients),
                "repetitions": self.plan.repetitions,
                "output_tokens": self.plan.output_tokens,
                "requests_per_client": self.plan.requests_per_client,
                "ignore_eos": self.plan.ignore_eos,
                "cold_connections": self.plan.cold,
            },
            "usd_per_hour": dict(usd_per_hour),
        }


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def _cell_json(c: CellStats, usd_per_hour: Mapping[str, float]) -> dict[str, Any]:
    return {
        "context": c.context,
        "clients": c.clients,
        "output_tokens_per_s": _r(c.output_tokens_per_s),
        "output_tokens_per_s_cv": _r(c.output_tokens_per_s_cv, 4),
        "ttft_ms_median_cv": _r(c.ttft_ms_median_cv, 4),
        "tpot_ms": _r(c.tpot_ms, 3),
        "per_stream_tokens_per_s": _r(c.per_stream_tokens_per_s),
        "prompt_tokens_mean": _r(c.prompt_tokens_mean, 1),
        # vllm bench serve's per-request metrics (docs/cli.md, "Benchmark metrics"), mean over reps.
        **{f: _r(c.mean_of(f), 3) for f in VLLM_METRICS},
        "requests": c.requests,
        "errors": c.errors,
        "usd_per_million_output_tokens": {
            model: _r(usd_per_million_tokens(price, c.output_tokens_per_s), 6)
            for model, price in usd_per_hour.items()
        }
        if c.output_tokens_per_s > 0
        else {},
        "reps": [_rep_json(r) for r in c.reps],
    }


def _rep_json(r: RepStats) -> dict[str, Any]:
    return {
        "output_tokens_per_s": _r(r.output_tokens_per_s),
        "tpot_ms": _r(r.tpot_ms_median, 3),
        "per_stream_tokens_per_s": _r(r.per_stream_tokens_per_s),
        **{f: _r(getattr(r, f), 3) for f in VLLM_METRICS},
        "output_tokens": r.output_tokens,
        "span_s": _r(r.span_s, 3),
        "requests": r.requests,
        "errors": r.errors,
        "first_error": r.first_error,
    }


Progress = Callable[[str], None]


async def run_bench(
    target: ServerTarget,
    model: str,
    plan: BenchPlan,
    words_for: Mapping[int, int],
    *,
    prompt_length_method: str,
    prompt_tokens_target: Mapping[int, int | None],
    progress: Progress = lambda _msg: None,
    clock: loadgen.Clock = time.perf_counter,
    ssl: ssl_lib.SSLContext | None = None,
    seconds_left: float | None = None,
) -> BenchResult:
    """Run the sweep. `words_for` maps each context to its filler word count (prompts.calibrate).
    A repetition where every request fails aborts the sweep (OpsError): the cause (a 401, a
    dead server) would fail every later cell the same way. `plan.run_deadline_s` bounds the
    whole sweep (OpsError naming it); `seconds_left`: what the caller's calls before the
    sweep left of it."""
    result = BenchResult(
        base_url=target.base_url,
        model=model,
        plan=plan,
        prompt_length_method=prompt_length_method,
        prompt_tokens_target=dict(prompt_tokens_target),
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    if ssl is None:
        ssl = target.ssl_context  # the node's pinned certificate (tpuserve/ops/tls.py)
    try:
        async with asyncio.timeout(seconds_left if seconds_left is not None
                                   else plan.run_deadline_s):
            await _sweep(result, target, model, plan, words_for, progress, clock, ssl)
    except TimeoutError:
        raise OpsError(
            f"bench did not finish within --deadline {plan.run_deadline_s:g} s "
            f"({len(result.cells)} cells done): the server is too slow or never ends a stream",
            hint="raise --deadline or shrink the sweep; nothing was written",
        ) from None
    return result


async def _sweep(
    result: BenchResult,
    target: ServerTarget,
    model: str,
    plan: BenchPlan,
    words_for: Mapping[int, int],
    progress: Progress,
    clock: loadgen.Clock,
    ssl: ssl_lib.SSLContext | None,
) -> None:
    url = target.v1 + "/chat/completions"
    headers = target.headers() | {"Content-Type": "application/json"}
    nonces = iter(range(1, 10**prompts.NONCE_DIGITS))  # every request its own prompt

    def bodies(words: int, n: int) -> list[bytes]:
        return [
            loadgen.chat_body(model, prompts.messages(words, next(nonces)), plan.output_tokens,
                              ignore_eos=plan.ignore_eos)
            for _ in range(n)
        ]

    async with loadgen.LoadClient(ssl=ssl, timeout_s=plan.timeout_s,
                                  deadline_s=plan.deadline_s, cold=plan.cold) as client:
        for context in plan.contexts:
            words = words_for[context]
            for clients in plan.clients:
                if plan.warmup:
                    (warm,) = await client.run(url, bodies(words, 1), headers, 1,
                                               max_tokens=plan.output_tokens, clock=clock)
                    if not warm.ok:  # every timed request would fail the same way
                        raise OpsError(
                            f"bench {context} ctx x {clients} clients, warm-up request: "
                            f"{warm.error}",
                            hint="fix the server or the key, then re-run; nothing was written",
                        )
                reps: list[RepStats] = []
                for rep in range(plan.repetitions):
                    # Built, and every connection opened (or re-opened where the server
                    # closed an idle one), before the timed window opens.
                    batch = bodies(words, clients * plan.requests_per_client)
                    await client.warm(url, clients)
                    records = await client.run(url, batch, headers, clients,
                                               max_tokens=plan.output_tokens, clock=clock)
                    try:
                        stats = rep_stats(records)
                    except ValueError as exc:
                        result.failed.append(FailedCell(context, clients, str(exc)))
                        raise OpsError(
                            f"bench {context} ctx x {clients} clients, repetition {rep + 1}: "
                            f"{exc}",
                            hint="fix the server or the key, then re-run; nothing was written",
                        ) from None
                    reps.append(stats)
                    progress(
                        f"{context:>6} ctx x {clients:>3} clients  rep {rep + 1}/"
                        f"{plan.repetitions}: {stats.output_tokens_per_s:,.1f} tok/s, TTFT "
                        f"median {stats.ttft_ms_median:,.1f} ms"
                        + (f", {stats.errors} errors ({stats.first_error})"
                           if stats.errors else "")
                    )
                result.cells.append(CellStats(context, clients, tuple(reps)))


def calibrate_prompts(
    contexts: Sequence[int], count: prompts.Counter
) -> tuple[dict[int, int], dict[int, int | None], str]:
    """Word counts per context, the token counts /tokenize confirmed, and the method used."""
    words: dict[int, int] = {}
    counted: dict[int, int | None] = {}
    for context in contexts:
        words[context], counted[context] = prompts.calibrate(context, count)
    method = "tokenize" if all(v is not None for v in counted.values()) else "approximation"
    return words, counted, method
