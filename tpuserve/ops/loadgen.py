"""The benchmark's load generator: N concurrent streaming chat completions, timed per chunk.

Built so the client is never the bottleneck (issue 5: >= 64 streams and >= 20,000 tok/s on one
core; `bench/client` measures it): one asyncio loop, one httpx.AsyncClient per simulated user,
request bodies serialized once, raw bytes split into SSE events by hand with one clock reading
per network read (events that arrive together were seen together), and token counts taken
from the `usage` the server puts in the last chunk (`stream_options.include_usage`), not from
counting chunks (a chunk may carry several tokens).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .errors import one_line

Clock = Callable[[], float]
_SSL_CONTEXT: ssl.SSLContext | None = None
_raw_decode = json.JSONDecoder().raw_decode


@dataclass(frozen=True)
class RequestRecord:
    """One streamed request, times in seconds on one clock."""

    start: float
    end: float
    first_token: float | None = None  # first chunk carrying generated text
    last_token: float | None = None
    output_tokens: int = 0  # usage.completion_tokens
    prompt_tokens: int = 0  # usage.prompt_tokens
    chunks: int = 0  # chunks carrying generated text
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class SseParser:
    """Incremental `text/event-stream` splitter: bytes in, `data:` payloads out."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
        out: list[bytes] = []
        for event in events:
            payload = [line[5:].lstrip() for line in event.split(b"\n") if line[:5] == b"data:"]
            if payload:
                out.append(b"\n".join(payload))
        return out

    @property
    def pending(self) -> bytes:
        return self._buf


class StreamError(Exception):
    pass


class _Tally:
    """What the events of one stream said so far."""

    __slots__ = ("chunks", "done", "first", "last", "usage")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False

    def event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            # raw_decode on text skips json.loads' encoding sniffing (profiled: json was the
            # largest cost per token after httpx's own).
            text = payload.decode()
            obj, end = _raw_decode(text)
            if end != len(text) and text[end:].strip():
                raise ValueError("trailing data")
        except ValueError:
            raise StreamError(f"malformed SSE event (not JSON): {one_line(payload, 80)}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"malformed SSE event (not an object): {one_line(payload, 80)}")
        if "error" in obj and not obj.get("choices"):
            raise StreamError(f"server error in stream: {one_line(obj['error'], 200)}")
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if delta and (
                delta.get("content")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
                or delta.get("tool_calls")
            ):
                if self.first is None:
                    self.first = now
                self.last = now
                self.chunks += 1
        if obj.get("usage"):
            self.usage = obj["usage"]


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    clock: Clock = time.perf_counter,
) -> RequestRecord:
    """POST one streaming chat completion and time it; never raises for server faults."""
    start = clock()
    tally = _Tally()
    parser = SseParser()

    def record(error: str | None) -> RequestRecord:
        usage = tally.usage or {}
        return RequestRecord(
            start=start,
            end=clock(),
            first_token=tally.first,
            last_token=tally.last,
            output_tokens=int(usage.get("completion_tokens") or 0),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            chunks=tally.chunks,
            error=error,
        )

    try:
        async with client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                return record(f"HTTP {resp.status_code}: {one_line(text, 200)}")
            async for data in resp.aiter_raw():
                now = clock()
                for payload in parser.feed(data):
                    tally.event(payload, now)
    except StreamError as exc:
        return record(str(exc))
    except httpx.TimeoutException as exc:
        return record(f"timed out ({type(exc).__name__}) after {tally.chunks} chunks")
    except httpx.ConnectError as exc:
        return record(f"cannot connect to {url}: {one_line(exc, 120)}")
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        return record(
            f"server closed the stream after {tally.chunks} chunks without [DONE] "
            f"({one_line(exc, 80) or type(exc).__name__})"
        )
    except httpx.HTTPError as exc:
        return record(f"{type(exc).__name__}: {one_line(exc, 160)}")
    if not tally.done:
        return record(f"stream ended after {tally.chunks} chunks without data: [DONE]")
    if tally.usage is None:
        return record(
            "no usage in the last chunk: the server ignored stream_options.include_usage"
        )
    return record(None)


def chat_body(
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """A streaming chat request asking for exactly `max_tokens` tokens and usage at the end."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        # vLLM's extension: generate the full max_tokens, so every request has the same length.
        body["ignore_eos"] = True
    body.update(extra or {})
    return json.dumps(body, separators=(",", ":")).encode()


def make_client(timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                ) -> httpx.AsyncClient:
    """One client, one keep-alive connection, per simulated user: httpcore scans every pooled
    connection on every read, so one shared pool of 64 cost more CPU than the SSE parsing
    (profiled: 19,000 -> 25,000 tokens per CPU-second)."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        # Loading the CA bundle costs ~30 ms: once per process, not once per worker.
        _SSL_CONTEXT = ssl.create_default_context()
    # The read timeout bounds the wait for any one chunk; a long prefill at 8K x 64 measured
    # 11.7 s to first token (SPEC 6), so it must be generous.
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    return httpx.AsyncClient(
        # SSL_CONTEXT: the target's pinned certificate (tpuserve/ops/tls.py), when it has one.
        timeout=timeout, trust_env=False, verify=ssl_context or _SSL_CONTEXT,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
    )


async def run_requests(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    concurrency: int,
    *,
    timeout_s: float = 600.0,
    clock: Clock = time.perf_counter,
    ssl_context: ssl.SSLContext | None = None,
) -> list[RequestRecord]:
    """Closed loop: `concurrency` workers each send their next body as soon as one finishes."""
    records: list[RequestRecord | None] = [None] * len(bodies)
    queue = iter(range(len(bodies)))

    async def worker() -> None:
        async with make_client(timeout_s, ssl_context) as client:
            for i in queue:
                records[i] = await stream_chat(client, url, bodies[i], headers, clock)

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(bodies)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return [r for r in records if r is not None]
