"""Credentials for Google's APIs: `CLOUDSDK_AUTH_ACCESS_TOKEN` as a bearer token, else
Application Default Credentials (google-auth) with the cloud-platform scope, found fast off
Google Cloud."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from tpuserve.facts import CLOUD_PLATFORM_SCOPE
from tpuserve.gcp.endpoints import TOKEN_ENV
from tpuserve.gcp.errors import ApiError, CredentialsError

# Off Google Cloud, a metadata-server probe gets this long (google-auth's own probe takes
# 3 x 3 s and hangs ~12 s where 169.254.169.254 is silently dropped).
METADATA_PROBE_TIMEOUT_S = 0.3
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"  # "Google Compute Engine" on a Google VM


def auth_error(exc: Exception, action: str, service: str) -> Exception:
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
