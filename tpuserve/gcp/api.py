"""The shared edge for every Google REST call made by the CLI and the Terraform provisioners.

Endpoints and credentials follow gcloud's own environment variables, so one override points
both gcloud and this code at a fake (issue 3, "Conventions"):

- `CLOUDSDK_API_ENDPOINT_OVERRIDES_<SERVICE>` replaces a service's API root
  (`api_root("tpu", TPU_API)`, `api_root("secretmanager", ...)`, `api_root("storage", ...)`).
- `CLOUDSDK_AUTH_ACCESS_TOKEN` is used as a bearer token; otherwise Application Default
  Credentials (google-auth) with the cloud-platform scope.

Errors come back as `ApiError`, whose `str()` is ONE line: what failed, the API's status and
message, and what to do about it (an HTML error page from the front end becomes its HTTP status
and name). Nothing here logs a token or puts one in a URL.

Transient answers (TRANSIENT_CODES, a dropped connection, a timeout) are retried by ONE policy,
`RetryPolicy`, through ONE loop, `call_with_retry`: the REST calls here and the google-cloud-tpu
node calls (tpuserve.gcp.tpu.nodes) both go through it (issue 11).
"""

from __future__ import annotations

import email.utils
import http
import os
import random
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TPU_API = "https://tpu.googleapis.com/"
SECRETMANAGER_API = "https://secretmanager.googleapis.com/"
STORAGE_API = "https://storage.googleapis.com/"
TOKEN_ENV = "CLOUDSDK_AUTH_ACCESS_TOKEN"
DEFAULT_TIMEOUT_S = 30.0
TIME_SCALE_ENV = "TPUSERVE_TIME_SCALE"  # tests: multiplies every retry pause (as in the boot)
# The one list of transient answers (issue 11): throttling and Google-side errors. Both the
# REST path (GoogleApi) and the google-cloud-tpu node path (tpuserve.gcp.tpu.nodes) use it.
TRANSIENT_CODES = frozenset({429, 500, 502, 503, 504})
# A TPU create answered 429 means quota, not load: retrying it only delays the real error.
CREATE_TRANSIENT_CODES = TRANSIENT_CODES - {429}
# Off Google Cloud, a metadata-server probe gets this long (google-auth's own probe takes
# 3 x 3 s and hangs ~12 s where 169.254.169.254 is silently dropped).
METADATA_PROBE_TIMEOUT_S = 0.3
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"  # "Google Compute Engine" on a Google VM

# google.rpc.Code numbers (as found in Operation.error) -> their names.
GRPC_STATUS = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
# ... and the HTTP code each maps to (google.rpc.Code's documented mapping).
GRPC_HTTP = {
    1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401,
}


def api_root(service: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """gcloud's endpoint override for `service` (e.g. "tpu"), else `default`; ends with '/'."""
    env = os.environ if environ is None else environ
    root = env.get(f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()}") or default
    if not re.match(r"https?://[^/\s]+", root):
        raise ValueError(
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()} = {root!r}: must be an API root "
            "URL like https://tpu.googleapis.com/ or http://127.0.0.1:8123/"
        )
    return root if root.endswith("/") else root + "/"


T = TypeVar("T")


# ----------------------------------------------------------------------------- retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """Which answers are retried, how often, how long: capped exponential backoff with full
    jitter, honouring Retry-After (capped), inside a per-call and a per-command deadline."""

    tries: int = 6  # the first call and up to 5 retries
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_delay_s: float = 30.0  # one pause's cap (without Retry-After)
    max_retry_after_s: float = 60.0  # a server's Retry-After is honoured up to this
    deadline_s: float = 120.0  # one logical call, its retries included
    transient_codes: frozenset[int] = TRANSIENT_CODES
    time_scale: float = 1.0  # tests: TPUSERVE_TIME_SCALE

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """The pause before retry number `retry` (1-based): full jitter over the capped step."""
        step = min(self.max_delay_s, self.initial_s * self.multiplier ** (retry - 1))
        return step * rand()

    def pause(self, retry: int, retry_after: float | None,
              rand: Callable[[], float] = random.random) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_retry_after_s) * self.time_scale
        return self.backoff(retry, rand) * self.time_scale

    def is_transient(self, code: int) -> bool:
        """An HTTP status worth a retry; 0 = no complete answer (reset, refused, timeout)."""
        return code == 0 or code in self.transient_codes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetryPolicy:
        env = os.environ if environ is None else environ
        raw = env.get(TIME_SCALE_ENV, "")
        if not raw:
            return cls()
        try:
            scale = float(raw)
        except ValueError:
            scale = -1.0
        if not 0 <= scale <= 1:
            raise ValueError(f"{TIME_SCALE_ENV} = {raw!r}: a factor for retry pauses, 0-1 "
                             "(tests shorten waits with it)")
        return replace(cls(), time_scale=scale)

    def describe(self) -> str:
        """The policy in one line (for reports and --help)."""
        codes = ", ".join(str(c) for c in sorted(self.transient_codes))
        return (f"HTTP {codes}, resets and timeouts: up to {self.tries} tries, full-jitter "
                f"backoff {self.initial_s:g} s doubling to {self.max_delay_s:g} s, Retry-After "
                f"honoured up to {self.max_retry_after_s:g} s, {self.deadline_s:g} s per call")


DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True)
class Transient:
    """call_with_retry's classifier answer: retry this failure (after Retry-After, if given)."""

    retry_after: float | None = None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (delta-seconds or an HTTP-date) as seconds, or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def call_with_retry(
    attempt: Callable[[], T], classify: Callable[[Exception], Transient | None], *,
    policy: RetryPolicy = DEFAULT_POLICY, deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """`attempt()` until it returns, or raises something `classify` calls permanent, or the
    tries, the policy's per-call deadline or `deadline` (an absolute `clock()` time: the
    command's own timeout) are spent; then the last failure is raised."""
    start = clock()
    stop = start + policy.deadline_s
    if deadline is not None:
        stop = min(stop, deadline)
    retry = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            verdict = classify(exc)
            retry += 1
            if verdict is None or retry >= policy.tries:
                raise
            pause = policy.pause(retry, verdict.retry_after, rand)
            if clock() + pause > stop:
                raise
            sleep(pause)


# ----------------------------------------------------------------------------- errors


class ApiError(Exception):
    """A failed Google API call. `str()` is one line: what, status, message, what to do."""

    def __init__(
        self, code: int, status: str, message: str, *, action: str = "", service: str = "",
        hint: str | None = None, token_in_env: bool = False, retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.status = status
        self.message = " ".join(message.split())
        self.action = action
        self.service = service
        self.retry_after = retry_after  # the answer's Retry-After, in seconds
        self.hint = (hint_for(code, status, self.message, service, token_in_env=token_in_env)
                     if hint is None else hint)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.action}: " if self.action else ""
        hint = f" -> {self.hint}" if self.hint else ""
        return f"{where}{self.code} {self.status}: {self.message}{hint}"

    @classmethod
    def from_response(cls, resp: requests.Response, *, action: str, service: str,
                      token_in_env: bool = False) -> ApiError:
        code, status, message = resp.status_code, "", ""
        try:
            err = resp.json().get("error", {})
            if isinstance(err, dict):
                status, message = str(err.get("status", "")), str(err.get("message", ""))
        except (ValueError, AttributeError):
            pass
        return cls.from_parts(
            code, status, message, body=resp.text, reason=resp.reason or "",
            content_type=resp.headers.get("Content-Type", ""), action=action,
            service=service, token_in_env=token_in_env,
            retry_after=retry_after_seconds(resp.headers.get("Retry-After")),
        )

    @classmethod
    def from_parts(
        cls, code: int, status: str, message: str, *, body: str = "", reason: str = "",
        content_type: str = "", action: str, service: str, token_in_env: bool = False,
        retry_after: float | None = None,
    ) -> ApiError:
        """From an answer's pieces: the API's JSON status/message when it sent them, else the
        HTTP status and its name (an HTML page from the front end is never shown raw)."""
        status = status or _http_status_name(code)
        if not message:
            text = " ".join(body.split())
            if text and "html" not in content_type.lower() and "<" not in text:
                message = _strip_urls(text)[:200]
            else:
                message = _http_phrase(code, reason)
                if text:
                    message += " (an error page from Google's front end, not an API answer)"
        return cls(code, status, _strip_urls(message) or "no message", action=action,
                   service=service, token_in_env=token_in_env, retry_after=retry_after)

    @classmethod
    def from_status(cls, status: Mapping[str, Any], *, action: str, service: str) -> ApiError:
        """From a google.rpc.Status (an Operation's `error`, a failed QR's `failedData.error`)."""
        grpc = int(status.get("code", 2))
        return cls(
            GRPC_HTTP.get(grpc, 500), GRPC_STATUS.get(grpc, "UNKNOWN"),
            str(status.get("message", "no message")), action=action, service=service,
        )


def _strip_urls(text: str) -> str:
    """Request URLs say nothing the action does not, and may carry query parameters."""
    return re.sub(r"\b[a-z]+://\S+", "<url>", text)


def _http_phrase(code: int, reason: str = "") -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return reason or "HTTP error"


def _http_status_name(code: int) -> str:
    """The google.rpc status an HTTP code stands for; else the HTTP name (BAD_GATEWAY)."""
    known = {
        400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
        404: "NOT_FOUND", 409: "ALREADY_EXISTS", 412: "FAILED_PRECONDITION",
        429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
    }
    if code in known:
        return known[code]
    try:
        return http.HTTPStatus(code).name
    except ValueError:
        return "UNKNOWN"


def hint_for(code: int, status: str, message: str, service: str = "", *,
             token_in_env: bool = False) -> str:
    """What to do about an API error, in one clause."""
    api = f"{service}.googleapis.com" if service else "the API"
    if "FLEX_START" in message and "not supported" in message:
        # SPEC 1: europe-west4-a/-b rejected flex-start for v5litepod-1; us-west4-a accepted it.
        return ("flex-start is not offered for this accelerator in this zone; us-west4-a "
                "accepted v5litepod-1 (SPEC 1): set TPUSERVE_ZONE")
    if code == 0:
        return f"could not reach {api}: check the network or the endpoint override"
    if (code == 401 or status == "UNAUTHENTICATED") and token_in_env:
        return (f"the access token in {TOKEN_ENV} was refused or has expired (they last about "
                f"an hour): set a new one with `export {TOKEN_ENV}=$(gcloud auth "
                "print-access-token)`, or unset it to use Application Default Credentials")
    if code == 401 or status == "UNAUTHENTICATED":
        return (f"credentials missing or expired: run `gcloud auth application-default login` "
                f"or refresh {TOKEN_ENV}")
    if code == 403 or status == "PERMISSION_DENIED":
        return (f"check IAM (your account needs the permission named above in this project) and "
                f"that {api} is enabled: gcloud services enable {api}")
    if code == 404 or status == "NOT_FOUND":
        return "it does not exist (any more): check gcp.project, gcp.zone and the name"
    if code == 409 or status in ("ALREADY_EXISTS", "ABORTED"):
        return "a resource with this name exists or is changing: wait, or delete it first"
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        return ("quota or rate limit exhausted: flex-start and spot draw on the preemptible TPU "
                "quota of the zone (SPEC 2); check IAM & Admin > Quotas, or retry later")
    if status == "FAILED_PRECONDITION":
        return "the resource is in a state that forbids this right now: wait and retry"
    if status == "INVALID_ARGUMENT" or code == 400:
        return "the request was rejected: fix the setting the message names"
    if code >= 500:
        return "a Google-side error (retried; it persisted): retry in a minute"
    return ""


class CredentialsError(ApiError):
    """No usable credentials: neither a token variable nor Application Default Credentials."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            401, "UNAUTHENTICATED", detail, action="credentials",
            hint=f"run `gcloud auth application-default login`, or set {TOKEN_ENV}",
        )


def _auth_error(exc: Exception, action: str, service: str) -> Exception:
    """google.auth's errors from a token refresh as ApiErrors; anything else unchanged."""
    if not type(exc).__module__.startswith("google.auth"):
        return exc
    from google.auth import exceptions as auth_exceptions

    if isinstance(exc, auth_exceptions.RefreshError):
        detail = " ".join(str(exc).split())[:200]
        return CredentialsError(f"the credentials could not be refreshed ({detail})")
    return ApiError(0, "UNAVAILABLE", f"{type(exc).__name__} refreshing the access token",
                    action=action, service=service)


def authorized_session(environ: Mapping[str, str] | None = None) -> requests.Session:
    """A requests session that authenticates every call (token variable, else ADC)."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        return session
    # lazy: the token path (provisioners, tests) never pays for google.auth
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(default_credentials(env))


def default_credentials(environ: Mapping[str, str] | None = None) -> Any:
    """Application Default Credentials for the cloud-platform scope, or CredentialsError.

    Fast off Google Cloud: google-auth's last resort is a metadata-server probe (3 tries of
    3 s), which hangs ~12 s on networks that silently drop 169.254.169.254. So the environment
    and the ADC file are checked first, and the metadata server is asked only on a Google VM,
    or else once with a short timeout.
    """
    env = os.environ if environ is None else environ
    if not (env.get("GOOGLE_APPLICATION_CREDENTIALS") or _adc_file(env).is_file()
            or on_google_vm() or metadata_server_answers(env)):
        raise CredentialsError(
            f"no credentials: {TOKEN_ENV} and GOOGLE_APPLICATION_CREDENTIALS are unset, there is "
            f"no ADC file ({_adc_file(env)}) and this is not a Google Cloud VM (no metadata "
            f"server answered within {METADATA_PROBE_TIMEOUT_S:g} s)"
        )
    import google.auth
    import google.auth.exceptions

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise CredentialsError(f"no Application Default Credentials ({exc})") from None
    return credentials


def _adc_file(environ: Mapping[str, str]) -> Path:
    """Where `gcloud auth application-default login` writes (CLOUDSDK_CONFIG moves it)."""
    config = environ.get("CLOUDSDK_CONFIG") or str(Path.home() / ".config" / "gcloud")
    return Path(config) / "application_default_credentials.json"


def on_google_vm(product_name: str | None = None) -> bool:
    """True on a Compute Engine / TPU VM (the DMI product name says Google)."""
    path = Path(product_name or DMI_PRODUCT_NAME)
    try:
        return "Google" in path.read_text(errors="replace")
    except OSError:
        return False


def metadata_server_answers(environ: Mapping[str, str] | None = None,
                            timeout: float = METADATA_PROBE_TIMEOUT_S) -> bool:
    """One short probe of the metadata server (GCE_METADATA_IP, else GCE_METADATA_HOST, else
    169.254.169.254): does it answer with `Metadata-Flavor: Google`?"""
    env = os.environ if environ is None else environ
    host = env.get("GCE_METADATA_IP") or env.get("GCE_METADATA_HOST") or "169.254.169.254"
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    try:
        with socket.create_connection((name, int(port or 80)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\nMetadata-Flavor: Google\r\n\r\n"
                         .encode())
            head = b""
            deadline = time.monotonic() + timeout
            while b"\r\n\r\n" not in head and time.monotonic() < deadline:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError):
        return False
    return b"metadata-flavor: google" in head.lower()


def credentials(environ: Mapping[str, str] | None = None) -> Any:
    """google-auth credentials: CLOUDSDK_AUTH_ACCESS_TOKEN as a bearer token, else ADC."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        from google.oauth2.credentials import Credentials

        return Credentials(token=token)
    return default_credentials(env)


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
        transient_codes: frozenset[int] | None = None,
    ) -> dict[str, Any]:
        """Call ROOT + path; return the JSON object, or raise ApiError (one line).

        Reads and idempotent writes (GET, DELETE, PATCH, PUT by default; `idempotent=True` for
        a POST that is one) are retried on transient failures by the policy; other POSTs once.
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
            try:
                timeout = self.timeout
                if self.deadline is not None:  # one try never outlives the command's timeout
                    timeout = min(timeout, max(1.0, self.deadline - self._clock()))
                resp = self.session.request(
                    method, url, params=params, json=body, timeout=timeout
                )
            except requests.RequestException as exc:
                raise ApiError(
                    0, "UNAVAILABLE", f"{type(exc).__name__} reaching {urlsplit(self.root).netloc}",
                    action=action, service=self.service,
                ) from None
            except Exception as exc:
                # ADC sessions refresh their token inside request(): google.auth's own errors
                # (a transport fault: transient; a refused refresh: one line) are ours too.
                raise _auth_error(exc, action, self.service) from None
            if resp.status_code >= 400:
                raise ApiError.from_response(resp, action=action, service=self.service,
                                             token_in_env=self._token_in_env)
            if not resp.content:
                return {}
            try:
                data = resp.json()
            except ValueError:
                raise ApiError.from_parts(
                    resp.status_code, "UNKNOWN", "the response is not JSON",
                    action=action, service=self.service,
                ) from None
            return data if isinstance(data, dict) else {"value": data}

        def classify(exc: Exception) -> Transient | None:
            if isinstance(exc, ApiError) and policy.is_transient(exc.code):
                return Transient(exc.retry_after)
            return None

        return call_with_retry(attempt, classify, policy=policy, deadline=self.deadline,
                               clock=self._clock, sleep=self._sleep, rand=self._rand)
