"""A hostile OpenAI-compatible server on 127.0.0.1, for the CLI's deadlines and byte caps.

GET /v1/models answers a normal list (so `bench` reaches its streams) unless the mode is
about the answer itself; POST /tokenize answers 404 (no /tokenize: the approximation).
Everything else, depending on `mode`:

- "trickle": a 200 with a large Content-Length (or an SSE stream for a streamed chat), then
  one byte every `interval_s`, forever.
- "endless": a 200 chunked answer that never ends, as fast as the socket takes it (an endless
  JSON array, or endless SSE token chunks for a streamed chat).
- "silent": headers, then nothing.
- "headers": the status line, then one header byte every `interval_s`, forever (a read
  timeout, which bounds each read, never fires).
- "hang": reads the request, then never answers a byte (a TPU API that hangs).

Pointed at as a Google API root (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU), every API path gets the
mode's answer ("trickle": a JSON 200 trickled one byte every `interval_s`).

`models_too`: /v1/models misbehaves as well (smoke's second check).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

TOKEN_EVENT = (b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
               b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n')


def finishes_within(seconds: float, fn: Callable[[], T]) -> T:
    """FN's result; AssertionError if it is still running after SECONDS. A hang detector, not
    a timing: the bound is generous, so a test fails on a hang instead of hanging itself."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name="hang-detector", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise AssertionError(f"still running after {seconds:g} s: the deadline bounds nothing")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class HostileServer:
    def __init__(self, mode: str, *, interval_s: float = 0.5, models_too: bool = False,
                 model: str = "google/gemma-4-E2B-it") -> None:
        self.mode = mode
        self.interval_s = interval_s
        self.models_too = models_too
        self.model = model
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        self._thread = threading.Thread(target=self._run, name="hostile", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("hostile server did not start")
        return self.base_url

    def __exit__(self, *exc: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        await self._stop.wait()
        server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError,
                                 asyncio.CancelledError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                size = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        size = int(value)
                body: dict[str, Any] = json.loads(await reader.readexactly(size)) if size else {}
                if path == "/tokenize":
                    self._plain(w, 404, b'{"detail":"Not Found"}')
                elif path == "/v1/models" and not self.models_too:
                    card = {"id": self.model, "object": "model", "max_model_len": 4096}
                    self._plain(w, 200, json.dumps({"object": "list", "data": [card]}).encode())
                elif (path == "/health" and method == "GET"
                      and self.mode not in ("trickle", "headers")):
                    self._plain(w, 200, b"")
                else:
                    await self._misbehave(w, stream=bool(body.get("stream")))
                    return
                await w.drain()
        with contextlib.suppress(Exception):
            w.close()

    @staticmethod
    def _plain(w: asyncio.StreamWriter, status: int, payload: bytes) -> None:
        w.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % (status, len(payload)) + payload)

    async def _misbehave(self, w: asyncio.StreamWriter, *, stream: bool) -> None:
        ctype = b"text/event-stream" if stream else b"application/json"
        if self.mode == "hang":
            await asyncio.Event().wait()  # cancelled when the server stops
        if self.mode == "headers":
            w.write(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
            while True:
                w.write(b"a")
                await w.drain()
                await asyncio.sleep(self.interval_s)
        if self.mode == "endless":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype
                    + b"\r\ntransfer-encoding: chunked\r\n\r\n")
            piece = _chunk(TOKEN_EVENT * 64 if stream else b"[" * 65_536)
            while True:
                w.write(piece)
                await w.drain()
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype
                + b"\r\ncontent-length: 100000000\r\n\r\n")
        await w.drain()
        payload = TOKEN_EVENT if stream else b"[" * 100
        i = 0
        while True:
            if self.mode == "trickle":
                w.write(payload[i % len(payload):i % len(payload) + 1])
                i += 1
                await w.drain()
            await asyncio.sleep(self.interval_s)
