"""A fake GCE metadata server on 127.0.0.1: access token, instance attributes, guest attributes.

Accepts what the real server documents and nothing else: every request needs
`Metadata-Flavor: Google` (403 otherwise, as the real one answers), requests carrying
`X-Forwarded-For` are refused, guest attributes are written with PUT to
`/computeMetadata/v1/instance/guest-attributes/NAMESPACE/KEY` with the value as the body.
Point code at it with `GCE_METADATA_HOST=<fake.host>`, the variable google-auth reads.

Instance attributes answer with an `ETag` header and take the documented "waiting for
updates" query (compute/docs/metadata/querying-metadata, and Google's own watchers:
compute-image-packages metadata_watcher.py, cloud.google.com/go/compute/metadata Subscribe):
  wait_for_change=true  hold the request until the value changes; `false` (or absent): answer
                        at once. Any other value: 400
  last_etag=E           with E not the current ETag, answer at once (how a client that missed
                        a change catches up; Google's watcher starts with last_etag=0)
  timeout_sec=N         hold at most N seconds, then answer the current value and ETag (200).
                        N must be an integer: anything else is a 400, as the real one answers
A key that does not exist is a 404 at once, waiting or not; one deleted while a request
waits ends it with a 404. The ETag changes with every write of the value, the same content
included (a metadata update that rewrites it). `set_attribute` (and `touch_attribute`, a new
ETag for the same value) wake the waiters; a direct change of `attributes` is noticed within
50 ms.

Fault modes, beyond `faults` (any answer instead of the real one): `refuse_key` (every write of
one guest attribute refused, 400 by default), `throttle_guest` (the next writes get a 429 with
a Retry-After), `drip` (answers sent a byte at a time after their headers). The real server's
bodies for these refusals are not documented: plain text here. `guest_requests` logs every
guest-attribute request, refused ones included.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from werkzeug import Request, Response
from werkzeug.serving import WSGIRequestHandler, make_server

TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
ATTRIBUTES_PREFIX = "/computeMetadata/v1/instance/attributes/"
GUEST_PREFIX = "/computeMetadata/v1/instance/guest-attributes/"
# The first access config's external IP (text); 404 when the node has none.
EXTERNAL_IP_PATH = "/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _QuietHandler(WSGIRequestHandler):
    # Headers and body go out as separate writes: without TCP_NODELAY the second waits for
    # the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True

    def log_request(self, *args: Any, **kwargs: Any) -> None:  # tests read the fakes' records
        pass


# What Google's front end answers, instead of the API, when a backend is unreachable.
FRONT_END_PAGE = ("<!DOCTYPE html><html lang=en><meta charset=utf-8><title>Error {code} "
                  "({phrase})!!1</title><p><b>{code}.</b> <ins>That's an error.</ins><p>Please "
                  "try again in 30 seconds. <ins>That's all we know.</ins>\n")


def dropped() -> Response:
    """A marker answer: LoopbackServer closes the connection without answering."""
    response = Response("", 500)
    response.drop = True  # type: ignore[attr-defined]
    return response


@dataclass
class Fault:
    """Answer the next `times` requests that `matches` accepts with `answer()` instead."""

    matches: Callable[[Request], bool]
    answer: Callable[[], Response]
    times: int


class FaultQueue:
    """Faults a test queues for a fake: error bodies (with Retry-After), the front end's HTML
    page, dropped connections. The fake asks `take(request)` first; None: answer normally."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, matches: Callable[[Request], bool], answer: Callable[[], Response],
            times: int = 1) -> None:
        with self._lock:
            self._faults.append(Fault(matches, answer, times))

    def html(self, matches: Callable[[Request], bool], code: int = 502, times: int = 1) -> None:
        page = FRONT_END_PAGE.format(code=code, phrase=HTTPStatus(code).phrase)
        self.add(matches, lambda: Response(page, code, mimetype="text/html"), times)

    def drop(self, matches: Callable[[Request], bool], times: int = 1) -> None:
        self.add(matches, dropped, times)

    def take(self, request: Request) -> Response | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(request):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    answer = fault.answer()
                    # Asked for by the test: a discovery guard passes it on unchecked.
                    answer.deliberate = True  # type: ignore[attr-defined]
                    return answer
        return None


def any_request(_request: Request) -> bool:
    return True


def dripping(response: Response, every: float, stop: threading.Event) -> Response:
    """RESPONSE with its status, headers (Content-Length included) and body as they were, the
    body sent one byte every EVERY seconds: a server that answers, but never fast enough to
    end (a per-recv timeout never fires; only a bound on the whole read ends it). STOP ends
    the drip early (the fake stops)."""
    body = response.get_data()

    def drip() -> Iterator[bytes]:
        for i in range(len(body)):
            if stop.wait(every):
                return
            yield body[i:i + 1]

    out = Response(drip(), response.status_code, headers=list(response.headers.items()))
    out.headers["Content-Length"] = str(len(body))
    return out


def throttled(retry_after: str | None = None, code: int = 429) -> Response:
    """A refusal with an optional Retry-After (delta-seconds or an HTTP-date, RFC 9110 10.2.3).
    The metadata server's exact 429 body is not documented: plain text here."""
    response = Response(f"{HTTPStatus(code).phrase}\n", code, mimetype="text/plain")
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after
    return response


class LoopbackServer:
    """A threaded werkzeug server on 127.0.0.1 (a free port) around one request handler.

    Shared by the boot fakes (metadata, Secret Manager, Cloud Storage). A 10 ms serve poll
    keeps stop() fast. A handler's `dropped()` answer closes the connection unanswered.
    """

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        self._handler = handler
        self._server: Any = None

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        response = self._handler(Request(environ))
        if getattr(response, "drop", False):
            # Shut, not closed: werkzeug's own writes then fail as a dropped peer, quietly.
            environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
            start_response("500 INTERNAL SERVER ERROR", [])
            return []
        return response(environ, start_response)

    def start(self) -> None:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True,
                                   request_handler=_QuietHandler)
        threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        return self._server.server_port


@dataclass(frozen=True)
class GuestWrite:
    """One PUT of a guest attribute; `at` is time.time() (comparable across processes)."""

    at: float
    namespace: str
    key: str
    value: str


class FakeMetadata:
    """The instance's metadata server. `guest_attributes[(namespace, key)]` holds the values."""

    def __init__(self, *, access_token: str, attributes: dict[str, str] | None = None) -> None:
        self.access_token = access_token
        self.attributes = dict(attributes or {})
        # Every request for an instance attribute: (time.time(), key, query string, status).
        self.attribute_requests: list[tuple[float, str, str, int]] = []
        self._writes_of: dict[str, int] = {}  # key -> writes so far (a part of its ETag)
        self._changed = threading.Condition()
        self._stopped = False
        self.external_ip: str | None = None  # None: no external access config (404)
        self.guest_attributes: dict[tuple[str, str], str] = {}
        self.writes: list[GuestWrite] = []
        self.token_requests = 0
        self.token_failures = 0  # answer the next N token requests with 503
        # GCE's default: guest attributes are off unless the instance metadata has
        # enable-guest-attributes=TRUE; the fake starts with them on.
        self.guest_attributes_enabled = True
        self.faults = FaultQueue()  # e.g. faults.drop(lambda r: r.path == TOKEN_PATH)
        # Every guest-attribute request, faulted ones included: (time.time(), method, key, status)
        self.guest_requests: list[tuple[float, str, str, int]] = []
        # key -> (status, body) answered to every PUT of that guest attribute (refuse_key)
        self.refused_keys: dict[str, tuple[int, str]] = {}
        # Answers these requests match are sent one byte every `drip_every` seconds (drip)
        self.drip_matches: Callable[[Request], bool] | None = None
        self.drip_every = 0.5
        self.drip_times: int | None = None
        self._drip_stop = threading.Event()
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    def refuse_key(self, key: str, code: int = 400,
                   body: str = "Invalid guest attribute value.\n") -> None:
        """Answer every PUT of guest attribute KEY (any namespace) with CODE, nothing stored:
        one value the server will not take. The real server's body for it is not documented."""
        self.refused_keys[key] = (code, body)

    def throttle_guest(self, retry_after: str | None = None, times: int = 1,
                       key: str | None = None) -> None:
        """The next TIMES guest-attribute writes (of KEY, or any) get a 429 with Retry-After."""
        def matches(r: Request) -> bool:
            return (r.method == "PUT" and r.path.startswith(GUEST_PREFIX)
                    and (key is None or r.path.rsplit("/", 1)[-1] == key))

        self.faults.add(matches, lambda: throttled(retry_after), times)

    def drip(self, matches: Callable[[Request], bool] | None, every: float = 0.5,
             times: int | None = None) -> None:
        """Answers to the next TIMES (None: all) requests MATCHES accepts (None: none) are sent
        one byte every EVERY seconds: status and headers at once, the body never fast enough."""
        self.drip_every, self.drip_matches, self.drip_times = every, matches, times

    @property
    def host(self) -> str:
        """host:port, the value of GCE_METADATA_HOST."""
        return f"127.0.0.1:{self.server.port}"

    def start(self) -> FakeMetadata:
        self.server.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._drip_stop.set()
        self.server.stop()

    # -- instance attributes
    def set_attribute(self, key: str, value: str | None) -> None:
        """Write (None: delete) an instance attribute, as a metadata update does: a new ETag,
        and every request waiting on the key answers."""
        with self._changed:
            if value is None:
                self.attributes.pop(key, None)
            else:
                self.attributes[key] = value
            self._writes_of[key] = self._writes_of.get(key, 0) + 1
            self._changed.notify_all()

    def touch_attribute(self, key: str) -> None:
        """Rewrite an attribute with its own value: same content, a new ETag."""
        self.set_attribute(key, self.attributes[key])

    def etag(self, key: str) -> str | None:
        """The current ETag of an attribute (16 hex, like the real one's), None if absent."""
        value = self.attributes.get(key)
        if value is None:
            return None
        seed = f"{key}\0{self._writes_of.get(key, 0)}\0{value}".encode()
        return hashlib.sha256(seed).hexdigest()[:16]

    def attribute_polls(self, key: str) -> list[tuple[float, str, int]]:
        """(time, query string, status) of the requests for one attribute."""
        with self._lock:
            return [(at, q, status) for at, k, q, status in self.attribute_requests if k == key]

    def namespace(self, namespace: str) -> dict[str, str]:
        """Current guest attributes of one namespace, key -> value."""
        with self._lock:
            return {k: v for (ns, k), v in self.guest_attributes.items() if ns == namespace}

    def writes_in(self, namespace: str) -> list[GuestWrite]:
        with self._lock:
            return [w for w in self.writes if w.namespace == namespace]

    def _handle(self, request: Request) -> Response:
        response = self._answer(request)
        if request.path.startswith(GUEST_PREFIX):
            with self._lock:
                self.guest_requests.append((time.time(), request.method,
                                            request.path.rsplit("/", 1)[-1],
                                            response.status_code))
        matches = self.drip_matches
        if matches is not None and matches(request) and not getattr(response, "drop", False):
            with self._lock:
                if self.drip_times is not None:
                    self.drip_times -= 1
                    if self.drip_times <= 0:
                        self.drip_matches = None
            return dripping(response, self.drip_every, self._drip_stop)
        return response

    def guest_puts(self, key: str) -> list[tuple[float, int]]:
        """(time, status) of every PUT of guest attribute KEY, refused ones included."""
        with self._lock:
            return [(at, status) for at, method, k, status in self.guest_requests
                    if method == "PUT" and k == key]

    def _answer(self, request: Request) -> Response:
        if (fault := self.faults.take(request)) is not None:
            return fault
        if request.headers.get("Metadata-Flavor") != "Google":
            return Response("Missing Metadata-Flavor:Google header.\n", 403, mimetype="text/html")
        if "X-Forwarded-For" in request.headers:
            return Response("Request is not allowed with X-Forwarded-For.\n", 403)
        path = request.path
        if path == TOKEN_PATH and request.method == "GET":
            return self._token()
        if path.startswith(ATTRIBUTES_PREFIX) and request.method == "GET":
            key = path.removeprefix(ATTRIBUTES_PREFIX)
            response = self._attribute(request, key)
            with self._lock:
                self.attribute_requests.append(
                    (time.time(), key, request.query_string.decode(), response.status_code))
            return response
        if path == EXTERNAL_IP_PATH and request.method == "GET":
            if self.external_ip is None:
                return _not_found()
            return Response(self.external_ip, 200, mimetype="application/text")
        if path.startswith(GUEST_PREFIX):
            return self._guest(request, path.removeprefix(GUEST_PREFIX))
        return _not_found()

    def _attribute(self, request: Request, key: str) -> Response:
        args = request.args
        wait = args.get("wait_for_change", "false")
        if wait not in ("true", "false"):
            return Response("Invalid value for wait_for_change\n", 400)
        timeout: float | None = None
        if "timeout_sec" in args:
            if not re.fullmatch(r"[0-9]+", args["timeout_sec"]):
                return Response("timeout_sec must be an integer\n", 400)
            timeout = int(args["timeout_sec"])
        with self._changed:
            etag = self.etag(key)
            if wait == "true" and etag is not None and args.get("last_etag", etag) == etag:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self.etag(key) == etag and not self._stopped:
                    left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                    if left <= 0:
                        break
                    self._changed.wait(left)
                etag = self.etag(key)
            value = self.attributes.get(key)
        if value is None or etag is None:
            return _not_found()
        response = Response(value, 200, mimetype="application/text")
        response.headers["ETag"] = etag
        return response

    def _token(self) -> Response:
        with self._lock:
            self.token_requests += 1
            if self.token_failures > 0:
                self.token_failures -= 1
                return Response("Service Unavailable\n", 503)
        body = json.dumps(
            {"access_token": self.access_token, "expires_in": 3599, "token_type": "Bearer"},
            separators=(",", ":"),
        )
        return Response(body, 200, mimetype="application/json")

    def _guest(self, request: Request, rest: str) -> Response:
        parts = rest.split("/")
        if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
            return Response(
                "guest attributes are NAMESPACE/KEY (letters, digits, _ and -)\n", 400
            )
        namespace, key = parts
        if not self.guest_attributes_enabled:
            return Response("Guest attributes endpoint access is disabled.\n", 403)
        if request.method == "PUT" and key in self.refused_keys:
            code, body = self.refused_keys[key]
            return Response(body, code, mimetype="text/plain")
        with self._lock:
            if request.method == "PUT":
                value = request.get_data(as_text=True)
                self.guest_attributes[(namespace, key)] = value
                self.writes.append(GuestWrite(time.time(), namespace, key, value))
                return Response("", 200)
            if request.method == "GET":
                if (namespace, key) not in self.guest_attributes:
                    return _not_found()
                return Response(self.guest_attributes[(namespace, key)], 200)
            if request.method == "DELETE":
                self.guest_attributes.pop((namespace, key), None)
                return Response("", 200)
        return Response("Method Not Allowed\n", 405)


def _not_found() -> Response:
    return Response("Not Found\n", 404, mimetype="text/html")
