"""One call bounded in wall time, whatever the peer does.

A socket timeout (requests' and httpx's `timeout`, http.client's) bounds each read, so a peer
that trickles one byte per read, headers or body, holds a call for as long as it likes. `within`
bounds the whole call, from connect to the last byte: it runs in a daemon thread that is
abandoned when the time is up, and `cut` (if given) closes what the call had opened so the
thread ends too. No HTTP library is imported here: the Google edge (requests), the model-server
client (httpx) and the raw probes (http.client, ssl) all use it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

T = TypeVar("T")


class CallTimedOut(TimeoutError):
    """A call did not finish within its bound (its own cap or the command's deadline)."""


def within(seconds: float, call: Callable[[], T], expired: Callable[[], BaseException], *,
           cut: Callable[[], None] | None = None) -> T:
    """CALL's result, or EXPIRED() raised once SECONDS pass (at once when SECONDS <= 0).
    CALL's own exceptions are re-raised in the caller's thread."""
    if seconds <= 0:
        raise expired()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="bounded-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if cut is not None:
            with contextlib.suppress(Exception):  # best effort: the call is abandoned anyway
                cut()
        raise expired()
    if "error" in box:
        raise box["error"]
    return box["value"]


def client_deadline(client: Any, seconds: float | None, *, hint: str | None = None,
                    ) -> AbstractContextManager[Any]:
    """CLIENT's calls inside this block end within SECONDS (None: their own caps only): a
    Google API client's `deadline_within` (tpuserve.gcp.api.GoogleApi), HINT (if given) in
    the one line of a call it cuts; a client without one (a test's stand-in) is left as it
    is."""
    bound = getattr(client, "deadline_within", None)
    if not callable(bound) or seconds is None:
        return nullcontext()
    return bound(seconds, hint=hint) if hint else bound(seconds)
