"""HTTP to an untrusted model server, bounded by an overall deadline and a byte cap.

`smoke` and `bench` talk to servers the user points them at: a server that trickles one byte
every few seconds, streams forever or answers gigabytes must end in a one-line failure within
the deadline, never a hang or a MemoryError (issue 10 section 6). httpx bounds each read, not
a whole answer, so every client of `server.http_client` goes through `BoundedTransport`:

- before a request, every timeout is shortened to what is left of the deadline;
- while the body streams in, each read counts against `max_bytes` and checks the deadline
  (so a trickle ends at the deadline plus at most one read);
- a `Content-Encoding` the client did not ask for is refused (a small gzip answer can expand
  past any cap after it was counted).

The errors are httpx errors, so every caller that reports `httpx.HTTPError` as one line
reports these too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

# /tokenize answers one id per prompt token: a 1M-token prompt is ~8 MB of JSON.
DEFAULT_MAX_BYTES = 32 << 20


class DeadlinePassed(httpx.ReadTimeout):
    """The overall deadline passed (before or during a request)."""


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


def within(seconds: float, call: Callable[[], T], expired: Callable[[], Exception]) -> T:
    """CALL's result, or EXPIRED() once SECONDS pass. A read timeout bounds each read, not a
    server that trickles its status line and headers one byte at a time: the call runs in a
    daemon thread, abandoned (its socket with it) when the deadline passes."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="bounded-http", daemon=True)
    worker.start()
    worker.join(max(seconds, 0.0))
    if worker.is_alive():
        raise expired()
    if "error" in box:
        raise box["error"]
    return box["value"]


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
    """Wraps a transport so every request obeys one deadline and every answer one byte cap."""

    def __init__(self, inner: httpx.BaseTransport, *, deadline: Deadline,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._inner = inner
        self.deadline = deadline
        self.max_bytes = max_bytes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        left = self.deadline.remaining()
        if left is not None:
            if left <= 0:
                raise DeadlinePassed(f"{self.deadline.describe()} passed before {request.url}",
                                     request=request)
            timeouts = dict(request.extensions.get("timeout") or {})
            for phase in ("connect", "read", "write", "pool"):
                current = timeouts.get(phase)
                timeouts[phase] = left if current is None else min(current, left)
            request.extensions["timeout"] = timeouts
        request.headers["Accept-Encoding"] = "identity"
        if left is None:
            response = self._inner.handle_request(request)
        else:
            response = within(left, lambda: self._inner.handle_request(request),
                              lambda: DeadlinePassed(
                                  f"{self.deadline.describe()} passed while {request.url} was "
                                  "sending its status line and headers", request=request))
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise UnaskedEncoding(
                f"{request.url} answered Content-Encoding {encoding!r} to a request for "
                "identity: refused (it could expand past the byte cap)", request=request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _CappedStream(response.stream, request, self.max_bytes, self.deadline)
        return response

    def close(self) -> None:
        self._inner.close()


def bounded_client(timeout_s: float, deadline: Deadline | None = None, *,
                   max_bytes: int = DEFAULT_MAX_BYTES, **transport_kwargs: object) -> httpx.Client:
    """An httpx.Client whose requests obey `deadline` (default: none) and `max_bytes`;
    `transport_kwargs` go to httpx.HTTPTransport (e.g. `verify=` an ssl.SSLContext)."""
    transport = BoundedTransport(httpx.HTTPTransport(**transport_kwargs),  # type: ignore[arg-type]
                                 deadline=deadline or Deadline(None), max_bytes=max_bytes)
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
                        trust_env=False, transport=transport)
