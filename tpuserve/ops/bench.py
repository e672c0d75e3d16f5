"""The SPEC section 6 sweep: contexts x clients x repetitions against one OpenAI-compatible server.

Each repetition of a cell sends `clients x requests_per_client` streaming chat completions with
`clients` in flight at any time (a closed loop), each asking for exactly `output_tokens` tokens
(vLLM's ignore_eos). A cell starts with one unrecorded warm-up request. Statistics: see
bench_stats. The JSON (`BenchResult.to_json`) is the throughput table planner.load_throughput
reads: {"cells": [{"context", "clients", "output_tokens_per_s", ...}], ...}.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve.planner import usd_per_million_tokens

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


@dataclass(frozen=True)
class BenchPlan:
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    clients: tuple[int, ...] = DEFAULT_CLIENTS
    repetitions: int = DEFAULT_REPETITIONS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT
    warmup: bool = True
    ignore_eos: bool = True
    timeout_s: float = 600.0

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
        if max_model_len is not None:
            worst = max(self.contexts) + self.output_tokens
            if worst > max_model_len:
                raise bad(
                    "--contexts", max(self.contexts),
                    f"context + --output-tokens ({worst}) exceeds the server's max_model_len "
                    f"{max_model_len}",
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
        "ttft_ms_median": _r(c.ttft_ms_median),
        "ttft_ms_median_cv": _r(c.ttft_ms_median_cv, 4),
        "ttft_ms_p90": _r(c.ttft_ms_p90),
        "tpot_ms": _r(c.tpot_ms, 3),
        "per_stream_tokens_per_s": _r(c.per_stream_tokens_per_s),
        "prompt_tokens_mean": _r(c.prompt_tokens_mean, 1),
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
        "ttft_ms_median": _r(r.ttft_ms_median),
        "ttft_ms_p90": _r(r.ttft_ms_p90),
        "tpot_ms": _r(r.tpot_ms_median, 3),
        "per_stream_tokens_per_s": _r(r.per_stream_tokens_per_s),
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
) -> BenchResult:
    """Run the sweep. `words_for` maps each context to its filler word count (prompts.calibrate).
    A repetition where every request fails aborts the sweep (OpsError): the cause (a 401, a
    dead server) would fail every later cell the same way."""
    result = BenchResult(
        base_url=target.base_url,
        model=model,
        plan=plan,
        prompt_length_method=prompt_length_method,
        prompt_tokens_target=dict(prompt_tokens_target),
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    url = target.v1 + "/chat/completions"
    headers = target.headers() | {"Content-Type": "application/json"}
    nonces = iter(range(1, 10**prompts.NONCE_DIGITS))  # every request its own prompt

    def bodies(words: int, n: int) -> list[bytes]:
        return [
            loadgen.chat_body(model, prompts.messages(words, next(nonces)), plan.output_tokens,
                              ignore_eos=plan.ignore_eos)
            for _ in range(n)
        ]

    for context in plan.contexts:
        words = words_for[context]
        for clients in plan.clients:
            if plan.warmup:
                await loadgen.run_requests(url, bodies(words, 1), headers, 1,
                                           timeout_s=plan.timeout_s, clock=clock,
                                           ssl_context=target.ssl_context)
            reps: list[RepStats] = []
            for rep in range(plan.repetitions):
                records = await loadgen.run_requests(
                    url, bodies(words, clients * plan.requests_per_client), headers, clients,
                    timeout_s=plan.timeout_s, clock=clock, ssl_context=target.ssl_context,
                )
                try:
                    stats = rep_stats(records)
                except ValueError as exc:
                    result.failed.append(FailedCell(context, clients, str(exc)))
                    raise OpsError(
                        f"bench {context} ctx x {clients} clients, repetition {rep + 1}: {exc}",
                        hint="fix the server or the key, then re-run; nothing was written",
                    ) from None
                reps.append(stats)
                progress(
                    f"{context:>6} ctx x {clients:>3} clients  rep {rep + 1}/{plan.repetitions}: "
                    f"{stats.output_tokens_per_s:,.1f} tok/s, TTFT median "
                    f"{stats.ttft_ms_median:,.1f} ms"
                    + (f", {stats.errors} errors ({stats.first_error})" if stats.errors else "")
                )
            result.cells.append(CellStats(context, clients, tuple(reps)))
    return result


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
