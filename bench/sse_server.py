#!/usr/bin/env python3
"""A fast fake streaming chat server for measuring clients: it must never be the bottleneck.

One asyncio Protocol, no framework. A POST /v1/chat/completions gets its response head, the
role chunk and its first token at once (so TTFT measures the client, not a timer), then one
token per `--itl-ms` on a fixed-rate timer shared by every stream: each tick writes one
pre-built SSE chunk to each open stream, one write per chunk, as vLLM sends them. The last
chunks carry `finish_reason`, `usage` (stream_options.include_usage) and `data: [DONE]`.

GET /health answers 200 (what clients warm connections with). GET /stats answers this
process's CPU seconds, chunks written and how late the timer ran (late ticks: more than one
interval late), so a client can report the server's CPU share and whether it kept its rate.

    python bench/sse_server.py --itl-ms 4      # prints its base URL, serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

_DELTA = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"m",'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(payload: bytes) -> bytes:
    return _chunk(b"data: " + payload + b"\n\n")


HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
ROLE = _sse(_DELTA + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}')
TOKEN = _sse(_DELTA + b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,'
             b'"finish_reason":null}]}')
FINISH = _sse(_DELTA + b'"choices":[{"index":0,"delta":{"content":""},"logprobs":null,'
              b'"finish_reason":"length","stop_reason":null}]}')
DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _usage(n: int) -> bytes:
    return _sse(_DELTA + b'"choices":[],"usage":{"prompt_tokens":8,"total_tokens":%d,'
                b'"completion_tokens":%d}}' % (n + 8, n))


def _plain(status: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype
            + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


class Server:
    def __init__(self, itl_s: float) -> None:
        self.itl_s = itl_s
        self.streams: list[list[object]] = []  # [transport, tokens left, tokens total]
        self.chunks = 0
        self.ticks = 0
        self.late_ticks = 0  # ticks that ran more than one interval late
        self.max_lag_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0.0

    def start_stream(self, transport: asyncio.Transport, n: int) -> None:
        transport.write(HEAD + ROLE + TOKEN)
        self.chunks += 1
        if n <= 1:
            self.finish(transport, n)
            return
        self.streams.append([transport, n - 1, n])
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._next = loop.time() + self.itl_s
            self._timer = loop.call_at(self._next, self.tick)

    def finish(self, transport: asyncio.Transport, n: int) -> None:
        transport.write(FINISH + _usage(n) + DONE)

    def tick(self) -> None:
        loop = asyncio.get_running_loop()
        lag = loop.time() - self._next
        self.max_lag_s = max(self.max_lag_s, lag)
        self.late_ticks += lag > self.itl_s
        self.ticks += 1
        still = []
        for stream in self.streams:
            transport, left, total = stream
            if transport.is_closing():  # type: ignore[attr-defined]
                continue
            transport.write(TOKEN)  # type: ignore[attr-defined]
            self.chunks += 1
            if left == 1:  # type: ignore[comparison-overlap]
                self.finish(transport, total)  # type: ignore[arg-type]
            else:
                stream[1] = left - 1  # type: ignore[operator]
                still.append(stream)
        self.streams = still
        if still:
            self._next += self.itl_s  # a fixed rate: a late tick does not delay the next
            self._timer = loop.call_at(self._next, self.tick)
        else:
            self._timer = None

    def stats(self) -> bytes:
        """Counters since start; `max_lag_ms` since the previous /stats (then reset), so two
        reads around a measurement give that window's worst timer lag."""
        out = json.dumps({"cpu_s": time.process_time(), "wall_s": time.perf_counter(),
                          "chunks": self.chunks, "ticks": self.ticks,
                          "late_ticks": self.late_ticks,
                          "max_lag_ms": round(self.max_lag_s * 1000, 3)}).encode()
        self.max_lag_s = 0.0
        return out


class Conn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            size = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    size = int(value)
            if len(self.buf) < end + 4 + size:
                return
            body = self.buf[end + 4:end + 4 + size]
            self.buf = self.buf[end + 4 + size:]
            self.handle(head.split(" ", 2), body)

    def handle(self, request_line: list[str], body: bytes) -> None:
        assert self.transport is not None
        method, path = request_line[0], request_line[1]
        if method == "POST" and path == "/v1/chat/completions":
            n = int(json.loads(body).get("max_tokens") or 16)
            self.server.start_stream(self.transport, n)
        elif path == "/health":
            self.transport.write(_plain(b"200 OK", b"", b"text/plain"))
        elif path == "/stats":
            self.transport.write(_plain(b"200 OK", self.server.stats()))
        else:
            self.transport.write(_plain(b"404 Not Found", b'{"detail":"Not Found"}'))


async def serve(itl_s: float, port: int) -> None:
    server = Server(itl_s)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Conn(server), "127.0.0.1", port, backlog=1024)
    print(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--itl-ms", type=float, default=4.0, help="time between tokens per stream")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.itl_ms / 1000, args.port))


if __name__ == "__main__":
    main()
