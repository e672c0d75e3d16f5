"""The shared edge for every Google REST call made by the CLI and the Terraform provisioners:
`GoogleApi`, one REST API with its root (tpuserve.gcp.endpoints), an authorized session
(tpuserve.gcp.credentials), retries (tpuserve.gcp.retry) and one-line errors
(tpuserve.gcp.errors).

An answer proves only what it says: a redirect is not followed (a 3xx is an error: an API
never redirects, a proxy or a wrong endpoint does), and a 2xx whose body is empty or JSON that
is not an object is an `UnprovenAnswer`, not `{}`, unless the caller's method documents an
empty response (`empty_ok=True`).
"""

from __future__ import annotations

import contextlib
import http
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import requests

from tpuserve.bounded_call import within
from tpuserve.gcp.credentials import auth_error, authorized_session
from tpuserve.gcp.endpoints import TOKEN_ENV, api_root
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.retry import RetryPolicy, Transient, call_with_retry

DEFAULT_TIMEOUT_S = 30.0  # one try's cap, connect to last byte
DEADLINE_HINT = ("the API did not answer in time: try again, or give the command more time (its "
                 "--timeout or --deadline)")


class UnprovenAnswer(ApiError):
    """A 2xx (or 3xx) answer that does not prove what the caller asked for: an empty body,
    JSON that is not an object, a redirect, a list with unreachable locations, a resource
    that is not the one asked for. One line, never retried, never taken as proof."""

    def __init__(self, code: int, message: str, *, action: str, service: str,
                 hint: str = "", status: str = "") -> None:
        super().__init__(code, status or _status_name(code), message, action=action,
                         service=service, hint=hint)


def _status_name(code: int) -> str:
    try:
        return http.HTTPStatus(code).name
    except ValueError:
        return "UNKNOWN"


def json_kind(data: Any) -> str:
    """How an answer's JSON value is named in an error ("null", "a list", "a string" ...)."""
    if data is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", dict: "an object"}.get(type(data), type(data).__name__)


def not_a_list_answer(answer: Mapping[str, Any], fields: tuple[str, ...]) -> str | None:
    """Why a 2xx answer to a List method is not one, or None. proto3 JSON omits empty repeated
    fields and empty strings, so `{}` is the documented answer of an empty list; an answer
    with fields but none of its list's (a 200 carrying `error`, a proxy's own object) is not
    that answer, and its missing list proves nothing."""
    if not answer or any(f in answer for f in fields):
        return None
    others = ", ".join(sorted(map(str, answer))[:3])
    return (f"the answer has none of the list's fields ({', '.join(fields)}) but {others}: "
            "it is not a list answer, and proves nothing")


class GoogleApi:
    """One Google REST API: its root, an authorized session, retries, one-line errors."""

    def __init__(
        self, service: str, default_root: str, *, session: requests.Session | None = None,
        root: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        policy: RetryPolicy | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.service = service
        self.root = root or api_root(service, default_root, environ)
        self._environ = environ
        self._session = session
        self.timeout = timeout
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self.policy = policy or RetryPolicy.from_env(environ)
        self.deadline: float | None = None  # the running command's end (absolute clock time)
        self.deadline_hint = DEADLINE_HINT  # what a cut by that deadline tells the user to do
        # Did an earlier try of the last request fail in a way that may have acted (no answer,
        # or a 5xx)? A create that then gets 409 may be looking at its own resource.
        self.earlier_try_unanswered = False
        env = os.environ if environ is None else environ
        self._token_in_env = bool(env.get(TOKEN_ENV, "").strip())

    @property
    def session(self) -> requests.Session:
        if self._session is None:  # created on first use: constructing a client is free
            self._session = authorized_session(self._environ)
        return self._session

    def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
        body: Any = None, action: str | None = None, idempotent: bool | None = None,
        transient_codes: frozenset[int] | None = None, empty_ok: bool = False,
    ) -> dict[str, Any]:
        """Call ROOT + path; return the JSON object, or raise ApiError (one line).

        Reads and idempotent writes (GET, DELETE, PATCH, PUT by default; `idempotent=True` for
        a POST that is one) are retried on transient failures by the policy; other POSTs once.
        A redirect, an empty body or JSON that is not an object raise UnprovenAnswer;
        `empty_ok=True` (a method whose documented response is empty, like google.protobuf.Empty
        or a 204) returns {} for an empty body instead.
        """
        url = self.root + path.lstrip("/")
        action = action or f"{method} {path.lstrip('/')}"
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "DELETE", "PATCH", "PUT")
        policy = self.policy
        if transient_codes is not None:
            policy = replace(policy, transient_codes=transient_codes)
        if not idempotent:
            policy = replace(policy, tries=1)
        self.earlier_try_unanswered = False

        def attempt() -> dict[str, Any]:
            try:
                return answer()
            except ApiError as exc:
                if exc.code == 0 or exc.code >= 500:
                    self.earlier_try_unanswered = True
                raise

        def answer() -> dict[str, Any]:
            budget = self.call_budget()
            if budget <= 0:
                raise self._cut(action, 0.0)
            try:
                resp = self._bounded_request(method, url, params, body, budget, action)
            except ApiError:
                raise
            except requests.RequestException as exc:
                raise ApiError(
                    0, "UNAVAILABLE", f"{type(exc).__name__} reaching {urlsplit(self.root).netloc}",
                    action=action, service=self.service,
                ) from None
            except Exception as exc:
                # ADC sessions refresh their token inside request(): google.auth's own errors
                # (a transport fault: transient; a refused refresh: one line) are ours too.
                raise auth_error(exc, action, self.service) from None
            if resp.status_code >= 400:
                raise ApiError.from_response(resp, action=action, service=self.service,
                                             token_in_env=self._token_in_env)
            if 300 <= resp.status_code < 400:
                # Only the host: a Location's path or query may carry anything.
                to = urlsplit(resp.headers.get("Location", "")).netloc or "nowhere named"
                raise UnprovenAnswer(
                    resp.status_code, f"the answer is a redirect (to {to}), not an API answer; "
                    "redirects are not followed", action=action, service=self.service,
                    hint="check the endpoint override and any proxy in between")
            if not resp.content:
                if empty_ok:
                    return {}
                raise UnprovenAnswer(resp.status_code, "the answer is empty: it proves nothing",
                                     action=action, service=self.service)
            try:
                data = resp.json()
            except ValueError:
                raise ApiError.from_parts(
                    resp.status_code, "UNKNOWN", "the response is not JSON",
                    action=action, service=self.service,
                ) from None
            if not isinstance(data, dict):
                raise UnprovenAnswer(
                    resp.status_code, f"the answer is {json_kind(data)}, not a JSON object: it "
                    "proves nothing", action=action, service=self.service)
            return data

        def classify(exc: Exception) -> Transient | None:
            if isinstance(exc, ApiError) and policy.is_transient(exc.code):
                return Transient(exc.retry_after)
            return None

        return call_with_retry(attempt, classify, policy=policy, deadline=self.deadline,
                               clock=self._clock, sleep=self._sleep, rand=self._rand)

    def call_budget(self) -> float:
        """Seconds one try may take, connect to last byte: the per-call cap, never past the
        running command's deadline (<= 0: the deadline has passed)."""
        if self.deadline is None:
            return self.timeout
        return min(self.timeout, self.deadline - self._clock())

    @contextlib.contextmanager
    def deadline_within(self, seconds: float, *, hint: str | None = None) -> Iterator[float]:
        """Every call inside this block, its retries and each try's last byte included, ends
        within SECONDS (or an enclosing block's deadline, if sooner); yields the start. HINT:
        what a call cut inside the block tells the user (a program without --timeout or
        --deadline names its own bound)."""
        start, outer, outer_hint = self._clock(), self.deadline, self.deadline_hint
        end = start + seconds
        self.deadline = end if outer is None else min(outer, end)
        self.deadline_hint = hint or outer_hint
        try:
            yield start
        finally:
            self.deadline, self.deadline_hint = outer, outer_hint

    def _cut(self, action: str, budget: float) -> ApiError:
        host = urlsplit(self.root).netloc
        what = (f"no complete answer from {host} within {budget:.1f} s" if budget > 0
                else f"the command's deadline passed before {host} was asked")
        return ApiError(0, "DEADLINE_EXCEEDED", what, action=action, service=self.service,
                        hint=self.deadline_hint)

    def _bounded_request(self, method: str, url: str, params: Mapping[str, Any] | None,
                         body: Any, budget: float, action: str) -> requests.Response:
        """One try, bounded as a whole: requests' `timeout` bounds each socket read, so a
        server trickling its headers or body holds it for ever; `within` ends it at BUDGET and
        shuts the connection of a body still coming in."""
        box: dict[str, requests.Response] = {}

        def call() -> requests.Response:
            # The socket's own timeout a little later: the whole-try bound reports the cut.
            resp = self.session.request(method, url, params=params, json=body,
                                        timeout=budget + 0.5, stream=True,
                                        allow_redirects=False)  # a redirect proves nothing
            box["resp"] = resp
            _ = resp.content  # the whole body, inside the bound
            return resp

        def cut() -> None:
            conn = getattr(getattr(box.get("resp"), "raw", None), "connection", None)
            sock = getattr(conn, "sock", None)
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)

        return within(budget, call, lambda: self._cut(action, budget), cut=cut)
