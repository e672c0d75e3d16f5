"""`rotate-key`: a new API key as the secret's latest version, then the node's word that its
proxy uses it. The node's watcher re-reads the secret at most every 300 s (its key refresher,
templates/boot/secrets.sh.j2 refresh_key) and reports guest attribute `secret` =
`<time> fetched|reloaded api_key_sha256=<first 12 hex of the key's SHA-256>`; this waits for
that prefix. Clock and sleep are injectable; nothing here prints.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuserve.contracts import GA_SECRET
from tpuserve.settings import Deployment

from .boot_phases import NAMESPACE
from .errors import EXIT_FAILED, EXIT_TIMEOUT, EXIT_USAGE, OpsError
from .stack_status import LOST_NODE_STATES, TpuSource

# What the node's proxy accepts as a key (KEY_RE of templates/boot/boot_helper/commands.py: nothing
# nginx would read as syntax); a key outside it would fail the node's next boot.
KEY_RE = r"[A-Za-z0-9._~+/=-]{16,512}"
PREFIX_HEX = 12  # what the node reports (key_sha in templates/boot/secrets.sh.j2)
# The watcher re-reads every 300 s; its long poll and one reload come on top.
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_POLL_S = 10.0
_REPORTED = re.compile(r"\bapi_key_sha256=([0-9a-f]{12})\b")


def key_prefix(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:PREFIX_HEX]


def generate_key() -> bytes:
    """A new key: 32 random bytes, URL-safe base64 (43 characters, within KEY_RE)."""
    return ("tpk-" + secrets.token_urlsafe(32)).encode()


def read_key_file(path: Path) -> bytes:
    """The key in PATH, stripped as the node strips it; OpsError (exit 2) when unusable. The
    message names the rule, never the value."""
    try:
        data = path.read_bytes().strip()
    except OSError as exc:
        raise OpsError(f"--key-file {path}: cannot read it ({exc.strerror})",
                       exit_code=EXIT_USAGE) from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if not re.fullmatch(KEY_RE, text):
        raise OpsError(f"--key-file {path}: the API key must be 16-512 characters of "
                       "A-Z a-z 0-9 . _ ~ + / = - (the node's proxy rule, "
                       "templates/boot/boot_helper/commands.py KEY_RE; e.g. "
                       "openssl rand -base64 32)",
                       exit_code=EXIT_USAGE)
    return data


def reported_prefix(value: str | None) -> str | None:
    """The api_key_sha256 prefix in a `secret` guest attribute, if any."""
    m = _REPORTED.search(value or "")
    return m.group(1) if m else None


@dataclass
class RotationResult:
    stack: str
    version: str
    key_sha256_prefix: str
    elapsed_s: float
    reported: str  # the node's `secret` value that named the new key
    disabled: list[str] = field(default_factory=list)
    key: str | None = None  # only a generated key, for the one time it is shown

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "stack": self.stack, "ok": True, "version": self.version,
            "key_sha256_prefix": self.key_sha256_prefix, "elapsed_s": round(self.elapsed_s, 1),
            "reported": self.reported, "disabled": self.disabled}
        if self.key is not None:
            out["key"] = self.key
        return out


def wait_for_prefix(
    d: Deployment, *, tpu: TpuSource, prefix: str, timeout_s: float, poll_s: float,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    started: float | None = None,
) -> tuple[float, str]:
    """Poll the node's guest attributes until `secret` names PREFIX: (seconds waited, that
    value). Exit 3 after TIMEOUT_S (from STARTED), exit 1 when there is no node to ask."""
    start = clock() if started is None else started
    last = ""
    while True:
        node = tpu.get_node(d)
        if node is None or node.state in LOST_NODE_STATES:
            state = "no node" if node is None else f"node {node.state}"
            raise OpsError(f"{d.name}: {state}: no server to take the new key (it is the "
                           "secret's latest version: the next boot uses it)",
                           exit_code=EXIT_FAILED)
        attrs = tpu.guest_attributes(d, NAMESPACE) if node.state == "READY" else {}
        value = attrs.get(GA_SECRET, "")
        last = value or last
        if reported_prefix(value) == prefix:
            return clock() - start, value.partition(" ")[2]
        elapsed = clock() - start
        if elapsed >= timeout_s:
            seen = last.partition(" ")[2] or "nothing"
            raise OpsError(f"{d.name}: the node did not report the new key (api_key_sha256="
                           f"{prefix}) within {timeout_s:g} s; its secret attribute says: "
                           f"{seen[:200]}. The new version is the latest: the node's watcher "
                           "reads it at most every 300 s", exit_code=EXIT_TIMEOUT)
        sleep(max(0.0, min(poll_s, timeout_s - elapsed)))
