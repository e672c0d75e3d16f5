"""The benchmark's load generator: N concurrent streaming chat completions, timed per chunk.

Built so the client is never the bottleneck (`bench/client` measures it against a minimal
aiohttp client on the same server):

- aiohttp, one session per run (`LoadClient`): its C parser reads a chunked SSE response
  for a fraction of httpx's per-chunk cost (profiled: ~62% of the old client's CPU).
- Connections are opened and warmed (`LoadClient.warm`) before a timed cell, so a cell's TTFT
  never includes TCP or TLS setup, unless the user asks for cold connections.
- Request bodies are serialized once; raw bytes are split into SSE events by hand with one
  clock reading per network read (events that arrive together were seen together).
- Every stream is bounded by a deadline and a byte cap: a server that trickles, or streams
  forever, ends that request with a one-line error, never a hang or a MemoryError.

What a stream's bytes say (the SSE events, their tally, the timing rules that follow
`vllm bench serve`) and the request body are chat_stream's; its public names are re-exported
here, where bench and bench/client import them.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_lib
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from .chat_stream import BYTES_FIXED_CAP as BYTES_FIXED_CAP
from .chat_stream import BYTES_PER_TOKEN_CAP as BYTES_PER_TOKEN_CAP
from .chat_stream import RequestRecord as RequestRecord
from .chat_stream import SseParser as SseParser
from .chat_stream import StreamError as StreamError
from .chat_stream import _Tally
from .chat_stream import byte_cap as byte_cap
from .chat_stream import chat_body as chat_body
from .chat_stream import max_tokens_of as max_tokens_of
from .errors import one_line

Clock = Callable[[], float]

CONNECT_TIMEOUT_S = 10.0


class LoadClient:
    """One aiohttp session for a whole run, its connections kept open between cells.

    `ssl`: the context for an https:// server (None: the system's default trust for https,
    nothing for http); TLS pinning hands its own context here. `cold`: a new connection per
    request, so TTFT includes connection setup (what a client without keep-alive sees).
    """

    def __init__(
        self,
        *,
        ssl: ssl_lib.SSLContext | None = None,
        timeout_s: float = 600.0,
        deadline_s: float | None = None,
        cold: bool = False,
    ) -> None:
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.cold = cold
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None
        # Streams in flight: task -> [time of its last read, cut for idling]. One watchdog
        # enforces `timeout_s` between reads for all of them: aiohttp's own per-read timeout
        # re-arms a timer on every read, which measurably cost tokens per CPU-second.
        self._streams: dict[asyncio.Task[Any], list[Any]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._clock: Clock = time.perf_counter

    async def __aenter__(self) -> LoadClient:
        keep: dict[str, Any] = (
            {"force_close": True} if self.cold
            # Idle between cells; warm() re-opens what a server closed meanwhile.
            else {"keepalive_timeout": 3600}
        )
        connector = aiohttp.TCPConnector(
            limit=0,  # the closed loop bounds concurrency, not the pool
            ssl=self._ssl if self._ssl is not None else True,
            enable_cleanup_closed=True,
            **keep,
        )
        # The read timeout bounds the wait for any one chunk; a long prefill at 8K x 64
        # measured 11.7 s to first token (SPEC 6), so it must be generous. `total` bounds a
        # request whatever the server trickles.
        timeout = aiohttp.ClientTimeout(
            total=self.deadline_s, sock_connect=min(self.timeout_s, CONNECT_TIMEOUT_S),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False, auto_decompress=False,
        )
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def _watch(self) -> None:
        """Cut every stream that has waited `timeout_s` for its next read."""
        interval = min(1.0, self.timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = self._clock()
            for task, slot in list(self._streams.items()):
                if not slot[1] and now - slot[0] >= self.timeout_s:
                    slot[1] = True
                    task.cancel()

    async def __aexit__(self, *exc: object) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("LoadClient used outside `async with`")
        return self._session

    async def warm(self, url: str, connections: int) -> int:
        """Open `connections` keep-alive connections to `url`'s server (concurrent GETs of its
        /health, which vLLM and the API-key proxy answer without a key); returns how many
        answered. Connections a server closed since the last cell are replaced here, outside
        any timed window. A no-op with cold connections."""
        if self.cold or connections < 1:
            return 0
        health = url.split("/v1/", 1)[0] + "/health"

        async def one() -> bool:
            try:
                async with self.session.get(health) as resp:
                    await resp.content.read(65_536)
                    return True
            except (aiohttp.ClientError, TimeoutError):
                return False

        return sum(await asyncio.gather(*(one() for _ in range(connections))))

    async def stream_chat(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        max_tokens: int,
        clock: Clock = time.perf_counter,
    ) -> RequestRecord:
        """POST one streaming chat completion and time it; never raises for server faults."""
        tally = _Tally()
        parser = SseParser()
        cap = byte_cap(max_tokens)
        received = 0
        reads = 0
        start = clock()
        self._clock = clock
        task = asyncio.current_task()
        assert task is not None
        slot: list[Any] = [start, False]  # [last read, cut by the watchdog]
        self._streams[task] = slot

        def record(error: str | None) -> RequestRecord:
            usage = tally.usage or {}
            return RequestRecord(
                start=start, end=clock(), first_token=tally.first, last_token=tally.last,
                output_tokens=_int(usage.get("completion_tokens")),
                prompt_tokens=_int(usage.get("prompt_tokens")),
                chunks=tally.chunks, error=error, itl=tuple(tally.itl), reads=reads,
            )

        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(4096)).decode("utf-8", "replace")
                    return record(f"HTTP {resp.status}: {one_line(text, 200)}")
                event = tally.event
                feed = parser.feed
                readany = resp.content.readany  # iter_any() adds a generator step per read
                while data := await readany():
                    now = slot[0] = clock()
                    reads += 1
                    received += len(data)
                    if received > cap:
                        return record(f"stream exceeded {cap:,} bytes for {max_tokens} tokens "
                                      f"after {tally.chunks} chunks: the server does not stop")
                    for payload in feed(data):
                        event(payload, now)
        except asyncio.CancelledError:
            if not slot[1]:
                raise
            task.uncancel()  # our own watchdog's cancel, not the caller's
            return record(f"timed out after {clock() - start:.1f} s ({self.timeout_s:g} s "
                          f"without a chunk) after {tally.chunks} chunks")
        except StreamError as exc:
            return record(str(exc))
        except TimeoutError:
            limits = f"{self.timeout_s:g} s without a chunk" + (
                f" or {self.deadline_s:g} s per request" if self.deadline_s else "")
            return record(f"timed out after {clock() - start:.1f} s ({limits}) after "
                          f"{tally.chunks} chunks")
        except aiohttp.ClientConnectorCertificateError as exc:
            return record(f"TLS certificate of {url} refused "
                          f"({one_line(exc.certificate_error, 120)}): pass the server's pinned "
                          "ssl context")
        except aiohttp.ClientConnectorError as exc:
            return record(f"cannot connect to {url}: {one_line(exc, 120)}")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            return record(
                f"server closed the stream after {tally.chunks} chunks without [DONE] "
                f"({one_line(exc, 80) or type(exc).__name__})"
            )
        except aiohttp.ClientError as exc:
            return record(f"{type(exc).__name__}: {one_line(exc, 160)}")
        finally:
            self._streams.pop(task, None)
        if not tally.done:
            return record(f"stream ended after {tally.chunks} chunks without data: [DONE]")
        if tally.usage is None:
            return record(
                "no usage in the last chunk: the server ignored stream_options.include_usage"
            )
        return record(None)

    async def run(
        self,
        url: str,
        bodies: Sequence[bytes],
        headers: dict[str, str],
        concurrency: int,
        *,
        max_tokens: int,
        clock: Clock = time.perf_counter,
    ) -> list[RequestRecord]:
        """Closed loop: `concurrency` workers each send their next body as soon as one
        finishes; all start together (the timed window opens here, after `warm`)."""
        records: list[RequestRecord | None] = [None] * len(bodies)
        queue = iter(range(len(bodies)))

        async def worker() -> None:
            for i in queue:
                records[i] = await self.stream_chat(url, bodies[i], headers,
                                                    max_tokens=max_tokens, clock=clock)

        workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(bodies)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        return [r for r in records if r is not None]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def run_requests(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    concurrency: int,
    *,
    timeout_s: float = 600.0,
    deadline_s: float | None = None,
    ssl: ssl_lib.SSLContext | None = None,
    warm: bool = True,
    clock: Clock = time.perf_counter,
) -> list[RequestRecord]:
    """One-shot convenience: a client for this call only, warmed, then `LoadClient.run`."""
    max_tokens = max((max_tokens_of(b) for b in bodies), default=1)
    async with LoadClient(ssl=ssl, timeout_s=timeout_s, deadline_s=deadline_s,
                          cold=not warm) as client:
        await client.warm(url, min(concurrency, len(bodies)))
        return await client.run(url, bodies, headers, concurrency, max_tokens=max_tokens,
                                clock=clock)
