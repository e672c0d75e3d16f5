"""The one retry policy and loop for every Google call: the REST edge
(tpuserve.gcp.api.GoogleApi) and the google-cloud-tpu node calls (tpuserve.gcp.tpu.nodes) both
retry transient answers (TRANSIENT_CODES, a dropped connection, a timeout) through
`call_with_retry` under a `RetryPolicy`."""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from tpuserve.contracts import TIME_SCALE_ENV

# The one list of transient answers: throttling and Google-side errors. Both the
# REST path (GoogleApi) and the google-cloud-tpu node path (tpuserve.gcp.tpu.nodes) use it.
TRANSIENT_CODES = frozenset({429, 500, 502, 503, 504})
# A TPU create answered 429 means quota, not load: retrying it only delays the real error.
CREATE_TRANSIENT_CODES = TRANSIENT_CODES - {429}


T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Which answers are retried, how often, how long: capped exponential backoff with full
    jitter, honouring Retry-After (capped), inside a per-call and a per-command deadline."""

    tries: int = 6  # the first call and up to 5 retries
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_delay_s: float = 30.0  # one pause's cap (without Retry-After)
    max_retry_after_s: float = 60.0  # a server's Retry-After is honoured up to this
    deadline_s: float = 120.0  # one logical call, its retries included
    # A retry is not started with less than this left before the deadline: it would be cut,
    # and the failure it repeats says more than the cut.
    min_try_s: float = 1.0
    transient_codes: frozenset[int] = TRANSIENT_CODES
    time_scale: float = 1.0  # tests: TPUSERVE_TIME_SCALE

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """The pause before retry number `retry` (1-based): full jitter over the capped step."""
        step = min(self.max_delay_s, self.initial_s * self.multiplier ** (retry - 1))
        return step * rand()

    def pause(self, retry: int, retry_after: float | None,
              rand: Callable[[], float] = random.random) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_retry_after_s) * self.time_scale
        return self.backoff(retry, rand) * self.time_scale

    def is_transient(self, code: int) -> bool:
        """An HTTP status worth a retry; 0 = no complete answer (reset, refused, timeout)."""
        return code == 0 or code in self.transient_codes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetryPolicy:
        env = os.environ if environ is None else environ
        raw = env.get(TIME_SCALE_ENV, "")
        if not raw:
            return cls()
        try:
            scale = float(raw)
        except ValueError:
            scale = -1.0
        if not 0 <= scale <= 1:
            raise ValueError(f"{TIME_SCALE_ENV} = {raw!r}: a factor for retry pauses, 0-1 "
                             "(tests shorten waits with it)")
        return replace(cls(), time_scale=scale)

    def describe(self) -> str:
        """The policy in one line (for reports and --help)."""
        codes = ", ".join(str(c) for c in sorted(self.transient_codes))
        return (f"HTTP {codes}, resets and timeouts: up to {self.tries} tries, full-jitter "
                f"backoff {self.initial_s:g} s doubling to {self.max_delay_s:g} s, Retry-After "
                f"honoured up to {self.max_retry_after_s:g} s, {self.deadline_s:g} s per call")


DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True)
class Transient:
    """call_with_retry's classifier answer: retry this failure (after Retry-After, if given)."""

    retry_after: float | None = None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (delta-seconds or an HTTP-date) as seconds, or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def call_with_retry(
    attempt: Callable[[], T], classify: Callable[[Exception], Transient | None], *,
    policy: RetryPolicy = DEFAULT_POLICY, deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """`attempt()` until it returns, or raises something `classify` calls permanent, or the
    tries, the policy's per-call deadline or `deadline` (an absolute `clock()` time: the
    command's own timeout) are spent; then the last failure is raised."""
    start = clock()
    stop = start + policy.deadline_s
    if deadline is not None:
        stop = min(stop, deadline)
    retry = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            verdict = classify(exc)
            retry += 1
            if verdict is None or retry >= policy.tries:
                raise
            pause = policy.pause(retry, verdict.retry_after, rand)
            if clock() + pause + policy.min_try_s > stop:
                raise
            sleep(pause)
