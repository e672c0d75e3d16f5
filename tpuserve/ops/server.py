"""The model server as an HTTP peer: where it is, its key, and the small non-chat calls.

vLLM serves the OpenAI API under /v1 and its own routes (/health, /tokenize, /metrics) at the
root, so a target is the root URL; the OpenAI client gets `<root>/v1`.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from .bounded_http import BoundedTransport, Deadline, bounded_client
from .errors import EXIT_USAGE, OpsError, one_line


@dataclass(frozen=True)
class Pin:
    """One certificate clients trust: its SHA-256 (lowercase hex, of the DER) and the DER."""

    fingerprint: str
    cert_der: bytes
    source: str  # where the pin came from, for messages

    @property
    def pem(self) -> str:
        return ssl.DER_cert_to_PEM_cert(self.cert_der)


@dataclass(frozen=True)
class ServerTarget:
    base_url: str  # scheme://host:port, no trailing slash, no /v1
    api_key: str | None = field(default=None, repr=False)  # never printed
    # https: the context every client of this server uses (tpuserve/ops/tls.py pins it);
    # None: the system's CAs (or plain http).
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    pin: Pin | None = field(default=None, repr=False, compare=False)

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def normalize_base_url(url: str) -> str:
    """'http://1.2.3.4:8000/v1/' -> 'http://1.2.3.4:8000'. Rejects what is not an http(s) URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OpsError(
            f"--endpoint = {url!r}: not an http(s) URL",
            hint="give the server's root, e.g. https://34.1.2.3:8000",
            exit_code=EXIT_USAGE,
        )
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def http_client(timeout_s: float = 30.0, verify: ssl.SSLContext | None = None,
                deadline: Deadline | None = None) -> httpx.Client:
    """Every request bounded by `deadline` and every answer by a byte cap (bounded_http).
    VERIFY: the target's pinned context (ServerTarget.ssl_context); None: the system's CAs."""
    if verify is None:
        return bounded_client(timeout_s, deadline)
    return bounded_client(timeout_s, deadline, verify=verify)


@contextmanager
def client_for(http: httpx.Client, target: ServerTarget) -> Iterator[httpx.Client]:
    """HTTP, or a client of the same timeouts, deadline and byte cap that trusts only TARGET's
    pinned certificate (status and wait share one client across stacks, each with its own
    certificate)."""
    if target.ssl_context is None:
        yield http
        return
    transport = http._transport  # the BoundedTransport http_client made: keep its deadline
    deadline = transport.deadline if isinstance(transport, BoundedTransport) else None
    timeout = http.timeout.read if http.timeout.read is not None else 30.0
    with bounded_client(timeout, deadline, verify=target.ssl_context) as c:
        yield c


def health(http: httpx.Client, target: ServerTarget) -> tuple[bool, str]:
    """GET /health (never guarded): (ok, one-line detail). Never raises for network faults."""
    try:
        with client_for(http, target) as client:
            resp = client.get(target.base_url + "/health")
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {one_line(exc, 120) or 'no answer'}"
    return resp.status_code == 200, f"HTTP {resp.status_code}"


def _get_json(http: httpx.Client, url: str, headers: Mapping[str, str], what: str) -> Any:
    try:
        resp = http.get(url, headers=dict(headers))
    except httpx.HTTPError as exc:
        raise OpsError(
            f"{what}: cannot reach {url} ({type(exc).__name__}: {one_line(exc, 120)})",
            hint="check the endpoint, the firewall (access.api_source_ranges) and `tpuserve wait`",
        ) from None
    if resp.status_code in (401, 403):
        raise OpsError(
            f"{what}: HTTP {resp.status_code} from {url}: the server wants an API key",
            hint="pass --api-key or set OPENAI_API_KEY (`tpuserve endpoint STACK` shows how)",
        )
    if resp.status_code != 200:
        raise OpsError(f"{what}: HTTP {resp.status_code} from {url}: {one_line(resp.text, 200)}")
    try:
        return resp.json()
    except ValueError:
        raise OpsError(f"{what}: {url} answered non-JSON: {one_line(resp.text, 120)}") from None


def served_model(http: httpx.Client, target: ServerTarget) -> tuple[str, int | None]:
    """The first model of GET /v1/models and its max_model_len (vLLM adds it to the card)."""
    data = _get_json(http, target.v1 + "/models", target.headers(), "list models")
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards or not isinstance(cards[0], dict) or not cards[0].get("id"):
        raise OpsError(f"list models: malformed answer from {target.v1}/models: "
                       f"{one_line(data, 120)}")
    mml = cards[0].get("max_model_len")
    return str(cards[0]["id"]), int(mml) if isinstance(mml, int) else None


def tokenize_count(
    http: httpx.Client, target: ServerTarget, model: str, messages: list[dict[str, Any]]
) -> int | None:
    """Prompt tokens of a chat, template included, by vLLM's POST /tokenize; None when the
    server has no such route (not vLLM)."""
    body = {"model": model, "messages": messages, "add_generation_prompt": True}
    try:
        resp = http.post(target.base_url + "/tokenize", json=body, headers=target.headers())
    except httpx.HTTPError:
        return None
    if resp.status_code in (404, 405, 501):
        return None
    if resp.status_code != 200:
        raise OpsError(f"tokenize: HTTP {resp.status_code}: {one_line(resp.text, 200)}")
    try:
        count = resp.json()["count"]
    except (ValueError, KeyError, TypeError):
        raise OpsError(f"tokenize: malformed answer: {one_line(resp.text, 120)}") from None
    if isinstance(count, list):  # some servers answer one count per prompt
        count = count[0] if count else None
    if not isinstance(count, int):
        raise OpsError(f"tokenize: malformed count: {one_line(resp.text, 120)}")
    return count
