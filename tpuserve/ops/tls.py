"""Pinning the proxy's certificate: every command that talks to a node trusts exactly the
certificate that node made for itself at boot (templates/boot/proxy.sh.j2 `tls_cert`).

The boot publishes it in guest attribute `tpuserve/tls` as
`<time> sha256=<hex SHA-256 of the DER> cert=<base64 DER>` (or `<time> off`). The TPU API is
the trusted channel (it needs the user's Google credentials); the network to port 8000 is not.
A context built here trusts that one certificate as its only anchor, so a peer passes only
with the node's private key; `verify_peer` also compares the served certificate's SHA-256
with the pin, for a clear one-line refusal. Users without API access give `--fingerprint`
(checked against what the server presents, then pinned the same way) or `--cacert`.

Contexts are plain `ssl.SSLContext`s: httpx takes one as `verify=`, aiohttp as `ssl=`, the
OpenAI SDK through `http_client=httpx.Client(verify=ctx)`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tpuserve.bounded_call import within
from tpuserve.contracts import GA_TLS
from tpuserve.contracts import GUEST_ATTRIBUTE_NAMESPACE as NAMESPACE

from .boot_phases import parse_time
from .errors import EXIT_USAGE, OpsError, one_line
from .server import Pin, ServerTarget

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

TLS_ATTRIBUTE = GA_TLS  # the key in the boot's guest-attribute namespace
CONNECT_TIMEOUT_S = 10.0
_HEX64 = re.compile(r"[0-9a-f]{64}")


def fingerprint_of(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def colons(fingerprint: str) -> str:
    """'ab12...' -> 'AB:12:...' (how openssl and browsers print it)."""
    return ":".join(fingerprint[i:i + 2] for i in range(0, len(fingerprint), 2)).upper()


def parse_fingerprint(text: str, *, what: str = "--fingerprint") -> str:
    """A SHA-256 fingerprint as users copy it: hex with or without colons, optionally after
    `sha256=` or openssl's `SHA256 Fingerprint=`."""
    value = text.strip()
    value = re.sub(r"^(sha256\s*fingerprint\s*=|sha256[=:])", "", value, flags=re.IGNORECASE)
    value = value.replace(":", "").strip().lower()
    if not _HEX64.fullmatch(value):
        raise OpsError(
            f"{what} = {text!r}: not a SHA-256 fingerprint (64 hex digits, colons allowed)",
            hint="`tpuserve endpoint STACK` prints it; or: openssl x509 -in cert.pem -noout "
            "-fingerprint -sha256",
            exit_code=EXIT_USAGE,
        )
    return value


def published_tls(attrs: Mapping[str, str], *, where: str) -> Pin | str | None:
    """The node's guest attribute: a Pin, "off" (the boot serves plain HTTP), or None (not
    published yet: an older boot script, or a boot that has not reached its TLS step; a value
    older than the current boot's `boot` attribute is an earlier boot's certificate)."""
    value = attrs.get(TLS_ATTRIBUTE)
    if value is None:
        return None
    words = value.split()
    at = parse_time(words[0]) if words else None
    boot_at = parse_time(attrs.get("boot", "").split(" ", 1)[0])
    if at is not None and boot_at is not None and at < boot_at:
        return None
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if words[1:] == ["off"]:
        return "off"
    fingerprint, cert = fields.get("sha256", ""), fields.get("cert", "")
    try:
        der = base64.b64decode(cert, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    if not _HEX64.fullmatch(fingerprint) or not der or fingerprint_of(der) != fingerprint:
        raise OpsError(
            f"{where}: guest attribute {NAMESPACE}/{TLS_ATTRIBUTE} is not a certificate and its "
            f"SHA-256 ({one_line(value, 80)})",
            hint="the node's boot script writes it; redeploy the stack if it was changed",
        )
    return Pin(fingerprint, der, f"published by {where} in guest attribute "
               f"{NAMESPACE}/{TLS_ATTRIBUTE}")


def pinned_context(pin: Pin) -> ssl.SSLContext:
    """A client context whose only trust anchor is PIN's certificate. No hostname check: the
    anchor is one self-signed certificate, so only the node's key can pass, whatever name
    or IP it is reached by (its IP SANs still serve clients that verify names)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=pin.cert_der)
    return ctx


def cacert_context(path: Path) -> ssl.SSLContext:
    """--cacert FILE: standard verification (names included) against that CA or certificate."""
    try:
        ctx = ssl.create_default_context(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise OpsError(f"--cacert = {str(path)!r}: not a readable PEM certificate "
                       f"({one_line(exc, 120)})", exit_code=EXIT_USAGE) from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def served_certificate(base_url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bytes:
    """The DER certificate the server at BASE_URL presents (fetched without trusting it: it
    is only compared, never believed)."""
    host, port = _host_port(base_url)
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    opened: list[socket.socket] = []

    def fetch() -> bytes | None:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            opened.append(raw)
            with probe.wrap_socket(raw, server_hostname=host) as conn:
                return conn.getpeercert(binary_form=True)

    def expired() -> Exception:
        return TimeoutError(f"no TLS handshake within {timeout_s:g} s")

    def cut() -> None:
        for sock in opened:
            sock.shutdown(socket.SHUT_RDWR)

    try:
        # The socket timeout bounds each read; a handshake trickled byte by byte is bounded
        # as a whole, its socket shut when the time is up.
        der = within(timeout_s, fetch, expired, cut=cut)
    except (OSError, ssl.SSLError) as exc:
        raise OpsError(
            f"TLS to {base_url}: {type(exc).__name__}: {one_line(exc, 120) or 'no answer'}",
            hint="check the endpoint, the firewall (access.api_source_ranges) and `tpuserve "
            "wait`; a node with access.tls = 'off' serves http://",
        ) from None
    if not der:
        raise OpsError(f"TLS to {base_url}: the server presented no certificate")
    return der


def verify_peer(base_url: str, pin: Pin, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse (one line) a server whose certificate is not the pinned one, before any key or
    prompt is sent to it."""
    _compare(base_url, served_certificate(base_url, timeout_s), pin)


def fingerprint_context(base_url: str, fingerprint: str,
                        timeout_s: float = CONNECT_TIMEOUT_S) -> ssl.SSLContext:
    """--fingerprint without API access: the served certificate must match it; it is then the
    context's only trust anchor, so every later connection needs the same key."""
    der = served_certificate(base_url, timeout_s)
    pin = Pin(fingerprint, der, "given with --fingerprint")
    _compare(base_url, der, pin)
    return pinned_context(pin)


def _compare(base_url: str, der: bytes, pin: Pin) -> None:
    got = fingerprint_of(der)
    if got != pin.fingerprint:
        raise OpsError(
            f"{base_url} presents a certificate with SHA-256 {colons(got)}, not the pinned "
            f"{colons(pin.fingerprint)} ({pin.source}): refusing to send the key or any prompt",
            hint="a recreated node makes a new certificate (`tpuserve endpoint STACK` shows the "
            "current one); otherwise something between you and the node is intercepting TLS",
        )


def stack_target(d: Deployment, external_ip: str, attrs: Mapping[str, str],
                 api_key: str | None = None) -> ServerTarget:
    """The stack's server at EXTERNAL_IP: https:// pinned to the certificate its node published
    (ATTRS: its tpuserve guest attributes) when access.tls is on. OpsError while it has not
    published one, or when it serves plain HTTP against the config."""
    where = f"node {d.node_name}"
    if not d.access.tls_on:
        return ServerTarget(f"http://{external_ip}:{d.vllm.port}", api_key)
    published = published_tls(attrs, where=where)
    if published is None:
        raise OpsError(
            f"{d.name}: {where} has not published its TLS certificate yet (guest attribute "
            f"{NAMESPACE}/{TLS_ATTRIBUTE})",
            hint=f"`tpuserve wait {d.name}` blocks until it serves",
        )
    if published == "off":
        raise OpsError(
            f"{d.name}: {where} serves plain HTTP (its boot ran with access.tls = 'off') but "
            "the config says access.tls = 'self-signed': refusing to send the key in clear text",
            hint=f"redeploy it (npx cdktf deploy {d.name}) or set access.tls = 'off'",
        )
    assert isinstance(published, Pin)
    return ServerTarget(f"https://{external_ip}:{d.vllm.port}", api_key,
                        ssl_context=pinned_context(published), pin=published)
