"""HTTP to an untrusted model server, bounded by an overall deadline and a byte cap.

`smoke` and `bench` talk to servers the user points them at: a server that trickles one byte
every few seconds, streams forever or answers gigabytes must end in a one-line failure within
the deadline, never a hang or a MemoryError. httpx bounds each read, not
a whole answer, so every client of `server.http_client` goes through `BoundedTransport`:

- each request, from connect to its last byte, ends within its own timeout (`total_s`) and
  what is left of the deadline, whichever is sooner (a server trickling one byte
  per read timeout once held `smoke --timeout 5` until the 900 s deadline); it runs in a worker
  (tpuserve.bounded_call.within) whose connection is shut when the time is up;
- before a request, every socket timeout is shortened to that bound (plus half a second);
- while the body comes in, each read counts against `max_bytes` and checks the deadline;
- a `Content-Encoding` the client did not ask for is refused (a small gzip answer can expand
  past any cap after it was counted).

The errors are httpx errors, so every caller that reports `httpx.HTTPError` as one line
reports these too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tpuserve.bounded_call import within

__all__ = ["BoundedTransport", "Deadline", "DeadlinePassed", "RequestTimedOut",
           "ResponseTooLarge", "UnaskedEncoding", "bounded_client", "within"]

# /tokenize answers one id per prompt token: a 1M-token prompt is ~8 MB of JSON.
DEFAULT_MAX_BYTES = 32 << 20


class DeadlinePassed(httpx.ReadTimeout):
    """The overall deadline passed (before or during a request)."""


class RequestTimedOut(httpx.ReadTimeout):
    """One request did not finish, connect to last byte, within its own timeout."""


class ResponseTooLarge(httpx.ReadError):
    """The answer exceeded the byte cap."""


class UnaskedEncoding(httpx.DecodingError):
    """The server compressed an answer the client asked to receive uncompressed."""


class Deadline:
    """An overall deadline on one clock; None seconds: unbounded."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._end = None if seconds is None else clock() + seconds

    def remaining(self) -> float | None:
        return None if self._end is None else self._end - self._clock()

    @property
    def passed(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def describe(self) -> str:
        return f"the overall deadline of {self.seconds:g} s" if self.seconds else "no deadline"


class _CappedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, request: httpx.Request, max_bytes: int,
                 deadline: Deadline) -> None:
        self._inner = inner
        self._request = request
        self._max = max_bytes
        self._deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        total = 0
        for chunk in self._inner:
            total += len(chunk)
            if total > self._max:
                raise ResponseTooLarge(
                    f"the answer from {self._request.url} exceeded {self._max:,} bytes",
                    request=self._request)
            if self._deadline.passed:
                raise DeadlinePassed(
                    f"{self._deadline.describe()} passed while {self._request.url} was "
                    f"answering ({total:,} bytes so far)", request=self._request)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class BoundedTransport(httpx.BaseTransport):
    """Wraps a transport so every request obeys its own timeout (`total_s`, connect to last
    byte; None: none) and one deadline, and every answer one byte cap. The answer is read
    whole inside the bound (nothing here streams: bench's streams are aiohttp's, loadgen)."""

    def __init__(self, inner: httpx.BaseTransport, *, deadline: Deadline,
                 max_bytes: int = DEFAULT_MAX_BYTES, total_s: float | None = None) -> None:
        self._inner = inner
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.total_s = total_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        left = self.deadline.remaining()
        if left is not None and left <= 0:
            raise DeadlinePassed(f"{self.deadline.describe()} passed before {request.url}",
                                 request=request)
        bounds = [b for b in (left, self.total_s) if b is not None]
        budget = min(bounds) if bounds else None
        if budget is not None:
            # Each socket timeout a little past the whole-request bound (or its own, if
            # sooner): the bound, not a read timeout racing it, reports the cut.
            cap = budget + 0.5
            timeouts = dict(request.extensions.get("timeout") or {})
            for phase in ("connect", "read", "write", "pool"):
                current = timeouts.get(phase)
                timeouts[phase] = cap if current is None else min(current, cap)
            request.extensions["timeout"] = timeouts
        request.headers["Accept-Encoding"] = "identity"
        streams: list[Any] = []  # the connection(s) this request opened or got its answer on

        def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
                streams.append(info.get("return_value"))

        def call() -> httpx.Response:
            response = self._inner.handle_request(request)
            streams.append(response.extensions.get("network_stream"))
            return self._read_whole(request, response)

        if budget is None:
            return call()
        request.extensions["trace"] = trace
        overall = left is not None and left <= budget

        def expired() -> Exception:
            if overall:
                return DeadlinePassed(f"{self.deadline.describe()} passed while {request.url} "
                                      "was answering (status line, headers or body)",
                                      request=request)
            return RequestTimedOut(f"{request.url} did not finish answering within {budget:g} s "
                                   "(the per-request timeout, connect to last byte)",
                                   request=request)

        return within(budget, call, expired, cut=lambda: _shut(streams))

    def _read_whole(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise UnaskedEncoding(
                f"{request.url} answered Content-Encoding {encoding!r} to a request for "
                "identity: refused (it could expand past the byte cap)", request=request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        capped = _CappedStream(response.stream, request, self.max_bytes, self.deadline)
        try:
            content = b"".join(capped)
        finally:
            capped.close()
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=httpx.ByteStream(content),
                              extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()


def _shut(streams: list[Any]) -> None:
    """Shut the sockets of a request whose time is up: the worker blocked on one wakes and
    ends (close() alone does not wake a blocked recv)."""
    for stream in streams:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


def bounded_client(timeout_s: float, deadline: Deadline | None = None, *,
                   max_bytes: int = DEFAULT_MAX_BYTES, **transport_kwargs: object) -> httpx.Client:
    """An httpx.Client whose requests each end within `timeout_s` (connect to last byte) and
    `deadline` (default: none), their answers within `max_bytes`; `transport_kwargs` go to
    httpx.HTTPTransport (e.g. `verify=` an ssl.SSLContext)."""
    transport = BoundedTransport(httpx.HTTPTransport(**transport_kwargs),  # type: ignore[arg-type]
                                 deadline=deadline or Deadline(None), max_bytes=max_bytes,
                                 total_s=timeout_s)
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
                        trust_env=False, transport=transport)
