"""The wire format of one streaming chat completion: the request body, and the response's SSE
events split from raw bytes and tallied into a RequestRecord. No I/O (loadgen does that).

Token counts come from the `usage` the server puts in the last chunk
(`stream_options.include_usage`), not from counting chunks (a chunk may carry several).

Times follow `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py): the first
token is the first chunk that carries generated text; after it every chunk with `choices`
adds one inter-token latency (ITL) and moves the request's end (`last_token`), which is
vLLM's end-to-end latency.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import one_line

_loads = json.JSONDecoder().decode

# A stream may carry at most this many bytes per requested token (a vLLM chunk with one token
# is ~250 bytes) plus a fixed allowance for the role, finish and usage chunks.
BYTES_PER_TOKEN_CAP = 16_384
BYTES_FIXED_CAP = 1 << 20


@dataclass(frozen=True)
class RequestRecord:
    """One streamed request, times in seconds on one clock."""

    start: float
    end: float
    first_token: float | None = None  # first chunk carrying generated text
    last_token: float | None = None  # last chunk with choices: vLLM's end-to-end latency end
    output_tokens: int = 0  # usage.completion_tokens
    prompt_tokens: int = 0  # usage.prompt_tokens
    chunks: int = 0  # chunks with choices from the first token on
    error: str | None = None
    itl: tuple[float, ...] = field(default=(), repr=False)  # gaps between chunks after the first
    reads: int = 0  # network reads that delivered the stream: reads == chunks means one per read

    @property
    def ok(self) -> bool:
        return self.error is None


class SseParser:
    """Incremental `text/event-stream` splitter: bytes in, `data:` payloads out. Correct for
    events split anywhere (inside a field name, a CRLF or the blank line between events)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        tail = b""
        if b"\r" in buf:
            if buf[-1:] == b"\r":  # the \n of a CRLF may come in the next read
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *events, rest = buf.split(b"\n\n")
        self._buf = rest + tail if tail else rest
        if len(events) == 1:  # the common case: one event per read, one `data: ` line
            event = events[0]
            if event.startswith(b"data: ") and b"\n" not in event:
                return [event[6:]]
        out: list[bytes] = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                out.append(event[6:])
                continue
            payload = [
                line[6:] if line[5:6] == b" " else line[5:]
                for line in event.split(b"\n") if line[:5] == b"data:"
            ]
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

    __slots__ = ("chunks", "done", "first", "itl", "last", "usage")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0
        self.itl: list[float] = []
        self.usage: dict[str, Any] | None = None
        self.done = False

    def event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = _loads(payload.decode())
        except ValueError:
            raise StreamError(f"malformed SSE event (not JSON): {one_line(payload, 80)}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"malformed SSE event (not an object): {one_line(payload, 80)}")
        choices = obj.get("choices")
        if choices:
            if self.first is not None:
                self.itl.append(now - self.last)  # type: ignore[operator]
                self.last = now
                self.chunks += 1
            elif _has_text(choices):
                self.first = self.last = now
                self.chunks = 1
        elif "error" in obj:
            raise StreamError(f"server error in stream: {one_line(obj['error'], 200)}")
        usage = obj.get("usage")
        if usage:
            if not isinstance(usage, dict):
                raise StreamError(f"malformed usage in stream: {one_line(usage, 80)}")
            self.usage = usage


def _has_text(choices: Any) -> bool:
    for choice in choices if isinstance(choices, list) else ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            or delta.get("tool_calls")
        ):
            return True
    return False


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


def byte_cap(max_tokens: int) -> int:
    """The most bytes one stream of `max_tokens` tokens may carry before it is cut off."""
    return BYTES_FIXED_CAP + BYTES_PER_TOKEN_CAP * max(max_tokens, 1)


def max_tokens_of(body: bytes) -> int:
    """The max_tokens a serialized chat body asks for (for its stream's byte cap)."""
    obj = json.loads(body)
    return int(obj.get("max_tokens") or obj.get("max_completion_tokens") or 1)
