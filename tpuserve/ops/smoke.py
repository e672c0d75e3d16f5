"""`smoke`: the checks SPEC's validation ran, each one pass / fail / skip with a one-line detail.

OpenAI-compatible calls are plain JSON over the same bounded httpx client as the raw ones
(health, the refusals without a key), always on /v1/chat/completions (SPEC 1: raw
/v1/completions answers an empty string on -it models, which would look like a broken
deploy). Every check is bounded by the overall deadline (`SmokeOptions.deadline_s`) and every
answer by a byte cap (bounded_http): a hostile server fails a check in one line, never hangs.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from . import png, prompts, server
from .bounded_http import Deadline, within
from .errors import one_line
from .server import ServerTarget

PASS, FAIL, SKIP = "pass", "fail", "skip"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
RED = (220, 20, 20)
# The long prompt leaves room for the answer; without /tokenize the approximation may be off
# by a few percent, so it aims lower.
LONG_PROMPT_MARGIN = 64
LONG_PROMPT_APPROX_FRACTION = 0.90
LONG_PROMPT_NEAR_FRACTION = 0.80  # accepted prompt must be at least this share of the limit
# The longest context a server may claim: Gemma 4 E2B is a 128K-token model (its config's
# max_position_embeddings); 8x that is still a prompt builder's few megabytes, while a
# server claiming 10**12 would otherwise make the long-prompt check build terabytes.
MAX_PLAUSIBLE_MODEL_LEN = 1 << 20


@dataclass(frozen=True)
class Check:
    name: str
    result: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.result != FAIL

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "result": self.result, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


class CheckFailed(Exception):
    """The check ran and the server's answer is wrong."""


class _Skip(Exception):
    """The check cannot run here (no model, no max_model_len, proxy off)."""


@dataclass(frozen=True)
class SmokeOptions:
    model: str | None = None  # None: the first model of /v1/models
    max_model_len: int | None = None  # None: from /v1/models
    expect_auth: bool = True  # the API-key proxy guards /v1 and /metrics
    timeout_s: float = 300.0  # any one request
    deadline_s: float = 900.0  # every check together


class _Api:
    """The OpenAI-compatible calls smoke makes: JSON in, JSON out, one-line errors."""

    def __init__(self, http: httpx.Client, target: ServerTarget) -> None:
        self.http = http
        self.target = target

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = self.target.headers()
        try:
            resp = self.http.request(method, self.target.v1 + path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise CheckFailed(f"{method} /v1{path}: {type(exc).__name__}: "
                              f"{one_line(exc, 160) or 'no answer'}") from None
        if resp.status_code != 200:
            raise CheckFailed(f"HTTP {resp.status_code}: {one_line(resp.text, 200)}")
        try:
            data = resp.json()
        except ValueError:
            raise CheckFailed(f"{method} /v1{path} answered non-JSON: "
                              f"{one_line(resp.text, 120)}") from None
        if not isinstance(data, dict):
            raise CheckFailed(f"{method} /v1{path} answered {type(data).__name__}, not an object")
        return data

    def chat(self, **body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the first choice's message, usage) of a non-streamed chat completion."""
        data = self.call("POST", "/chat/completions", body)
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            raise CheckFailed(f"no choices[0].message in the answer: {one_line(data, 120)}")
        usage = data.get("usage")
        return message, usage if isinstance(usage, dict) else {}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content.strip() if isinstance(content, str) else ""


def run_smoke(
    target: ServerTarget,
    opts: SmokeOptions,
    *,
    http: httpx.Client,
    on_check: Callable[[Check], None] = lambda _c: None,
    clock: Callable[[], float] = time.perf_counter,
    deadline: Deadline | None = None,
) -> list[Check]:
    """Run every check; `http` should be `server.http_client(..., deadline=DEADLINE)` with the
    same DEADLINE, so that no single answer outlives it either and the checks and the client
    agree on when it passed (default: opts.deadline_s from now on CLOCK)."""
    smoke = _Smoke(target, opts, http, on_check, deadline or Deadline(opts.deadline_s, clock),
                   clock)
    smoke.run("health", smoke.health)
    smoke.run("models", smoke.models)
    smoke.run("chat completion", smoke.chat)
    smoke.run("tool call", smoke.tool_call)
    smoke.run("image input", smoke.image)
    smoke.run("long prompt", smoke.long_prompt)
    smoke.run("no key on /v1 refused", smoke.refused("/v1/models"))
    smoke.run("no key on /metrics refused", smoke.refused("/metrics"))
    smoke.run("no key: encoded variants refused", smoke.bypass)
    return smoke.checks


class _Smoke:
    """One smoke run: the checks, each a method returning its detail, and what they learn
    (the served model and its max_model_len, which later checks need)."""

    def __init__(self, target: ServerTarget, opts: SmokeOptions, http: httpx.Client,
                 on_check: Callable[[Check], None], deadline: Deadline,
                 clock: Callable[[], float]) -> None:
        self.target, self.opts, self.http = target, opts, http
        self.api = _Api(http, target)
        self.on_check, self.clock = on_check, clock
        self.deadline = deadline
        self.checks: list[Check] = []
        self.model = opts.model
        self.max_model_len = opts.max_model_len

    def run(self, name: str, fn: Callable[[], str]) -> None:
        """Run one check within the overall deadline; any failure becomes one line."""
        t0 = self.clock()
        try:
            if self.deadline.passed:
                raise CheckFailed(f"not run: the overall deadline of {self.opts.deadline_s:g} s "
                                  "passed (--deadline)")
            detail, result = fn(), PASS
        except CheckFailed as exc:
            detail, result = str(exc), FAIL
        except _Skip as exc:
            detail, result = str(exc), SKIP
        except Exception as exc:  # a check reports any failure as one line
            detail, result = f"{type(exc).__name__}: {one_line(exc, 200)}", FAIL
        check = Check(name, result, one_line(detail, 300), self.clock() - t0)
        self.checks.append(check)
        self.on_check(check)

    def health(self) -> str:
        ok, detail = server.health(self.http, self.target)
        if not ok:
            raise CheckFailed(f"GET /health: {detail}")
        return f"GET /health: {detail}"

    def models(self) -> str:
        data = self.api.call("GET", "/models")
        cards = [c for c in data.get("data") or () if isinstance(c, dict) and c.get("id")]
        if not cards:
            raise CheckFailed("GET /v1/models listed no model")
        served = str(cards[0]["id"])
        mml = cards[0].get("max_model_len")
        if self.model and self.model not in [c["id"] for c in cards]:
            raise CheckFailed(f"the server serves {served!r}, not {self.model!r}")
        self.model = self.model or served
        if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool)
                                or not 1 <= mml <= MAX_PLAUSIBLE_MODEL_LEN):
            raise CheckFailed(
                f"{served} claims max_model_len = {one_line(repr(mml), 40)}: not a context "
                f"length (1 to {MAX_PLAUSIBLE_MODEL_LEN:,} tokens); the long prompt will not "
                "be built from it")
        if mml:
            self.max_model_len = mml
        return f"{served} (max_model_len {mml if mml else 'not reported'})"

    def need_model(self) -> str:
        if not self.model:
            raise _Skip("no model: /v1/models failed and --model was not given")
        return str(self.model)

    def chat(self) -> str:
        message, _ = self.api.chat(
            model=self.need_model(),
            messages=[{"role": "user", "content": "Reply with exactly one word: pong"}],
            max_tokens=64, temperature=0,
        )
        text = _text(message)
        if not text:
            raise CheckFailed("/v1/chat/completions answered an empty message")
        return f"answered {text[:60]!r}"

    def tool_call(self) -> str:
        msg, _ = self.api.chat(
            model=self.need_model(),
            messages=[{"role": "user",
                       "content": "What is the weather in Paris right now? Use the tool."}],
            tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=256, temperature=0,
        )
        return f"get_weather({json.dumps(_weather_arguments(msg))})"

    def image(self) -> str:
        url = png.data_url(png.solid_png(64, 64, RED))
        message, _ = self.api.chat(
            model=self.need_model(),
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "What colour fills this image? Answer in one word."},
                {"type": "image_url", "image_url": {"url": url}},
            ]}],
            max_tokens=32, temperature=0,
        )
        text = _text(message)
        if "red" not in text.lower():
            raise CheckFailed(f"a solid red image; the model answered {text[:80]!r}")
        return f"a solid red 64x64 PNG: {text[:60]!r}"

    def long_prompt(self) -> str:
        mml = self.max_model_len
        if not mml:
            raise _Skip("max_model_len unknown: pass --max-model-len")
        model = self.need_model()
        max_tokens = 8

        def count(msgs: prompts.Messages) -> int | None:
            return server.tokenize_count(self.http, self.target, model, msgs)

        target_tokens = mml - LONG_PROMPT_MARGIN - max_tokens
        words, counted = prompts.calibrate(target_tokens, count)
        if counted is None:
            words = prompts.approx_words(int(target_tokens * LONG_PROMPT_APPROX_FRACTION))
        _, usage = self.api.chat(model=model, messages=prompts.messages(words, 424242),
                                 max_tokens=max_tokens, temperature=0)
        used = usage.get("prompt_tokens")
        if not isinstance(used, int):
            raise CheckFailed("accepted, but the answer has no usage.prompt_tokens")
        if used < LONG_PROMPT_NEAR_FRACTION * mml:
            raise CheckFailed(f"only {used:,} prompt tokens of max_model_len {mml:,} were sent")
        how = "/tokenize" if counted is not None else "approximation"
        return f"{used:,} of {mml:,} tokens accepted (length by {how})"

    def refused(self, path: str) -> Callable[[], str]:
        def check() -> str:
            if not self.opts.expect_auth:
                raise _Skip("the API-key proxy is off (access.api_key_proxy = false)")
            try:
                resp = self.http.get(self.target.base_url + path)  # deliberately without the key
            except httpx.HTTPError as exc:
                raise CheckFailed(f"GET {path}: {type(exc).__name__}: {one_line(exc, 120)}"
                                  ) from None
            if resp.status_code in (401, 403):
                return f"GET {path} without the key: HTTP {resp.status_code}"
            raise CheckFailed(
                f"GET {path} without the key: HTTP {resp.status_code}, expected 401: it is open"
            )
        return check

    def bypass(self) -> str:
        opts = self.opts
        if not opts.expect_auth:
            raise _Skip("the API-key proxy is off (access.api_key_proxy = false)")
        for method, raw_path in BYPASS_PROBES:
            remaining = self.deadline.remaining()
            left = opts.timeout_s if remaining is None else remaining
            if left <= 0:
                raise CheckFailed(f"the overall deadline of {opts.deadline_s:g} s passed")
            # A status line trickled byte by byte outlives any read timeout: `within` bounds
            # the whole probe by --timeout and what is left of the deadline.
            budget = min(opts.timeout_s, left)

            def expired(m: str = method, p: str = raw_path, b: float = budget) -> CheckFailed:
                if b < opts.timeout_s:
                    return CheckFailed(f"the overall deadline of {opts.deadline_s:g} s "
                                       "passed while the server was answering")
                return CheckFailed(f"{m} {p}: no status line within {b:g} s (--timeout, "
                                   "connect to last byte)")

            try:
                status = within(budget, lambda m=method, p=raw_path, t=budget: raw_status(
                    self.target, m, p, timeout_s=min(30, t)), expired)
            except OSError as exc:
                raise CheckFailed(f"{method} {raw_path}: {type(exc).__name__}: "
                                  f"{one_line(exc, 80)}") from None
            if status != 401:  # nginx parses each of them, so its key rule must answer
                raise CheckFailed(f"{method} {raw_path} without the key: HTTP {status}, "
                                  "expected 401: the proxy lets it through")
        return f"{len(BYPASS_PROBES)} encoded variants of /health and /metrics: 401"


def _weather_arguments(msg: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the get_weather call in an answer, or CheckFailed saying what is off."""
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list) or not calls:
        raise CheckFailed(f"no tool call; the model answered {_text(msg)[:80]!r}")
    fn = calls[0].get("function") if isinstance(calls[0], dict) else None
    if not isinstance(fn, dict):
        raise CheckFailed(f"a tool call without a function: {one_line(calls[0], 80)}")
    if fn.get("name") != "get_weather":
        raise CheckFailed(f"the call names {fn.get('name')!r}, not 'get_weather'")
    arguments = fn.get("arguments")
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        args = None
    if args is None:
        raise CheckFailed(f"arguments are not JSON: {str(arguments)[:80]!r}")
    if not isinstance(args, dict) or not isinstance(args.get("city"), str) or not args[
        "city"
    ].strip():
        raise CheckFailed(f"arguments carry no 'city': {str(arguments)[:80]!r}")
    return args


# Requests only exactly GET/HEAD /health may make without the key, sent as written (no client
# normalisation): dot segments plain and encoded, double slashes, case, query, trailing
# segment, another method. vLLM routes on the raw path and its /metrics mount takes any path
# under it; tests/render/test_proxy_nginx.py holds the full table run against the real nginx.
BYPASS_PROBES: tuple[tuple[str, str], ...] = (
    ("GET", "/metrics/../health"), ("GET", "/metrics/%2e%2e/health"),
    ("GET", "/metrics%2F..%2Fhealth"), ("GET", "/health/../metrics"),
    ("GET", "/health/%2e%2e/metrics"), ("GET", "//health"), ("GET", "/HEALTH"),
    ("GET", "/health?x"), ("GET", "/health/x"), ("POST", "/health"),
)


def raw_status(target: ServerTarget, method: str, raw_path: str, *, timeout_s: float) -> int:
    """The status of METHOD RAW_PATH sent byte for byte (http.client does not normalise a
    path), without the key, through the target's TLS context."""
    parts = urlsplit(target.base_url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        ctx = target.ssl_context or ssl.create_default_context()
        conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request(method, parts.path + raw_path, headers={"Content-Length": "0"})
        return conn.getresponse().status
    finally:
        conn.close()
