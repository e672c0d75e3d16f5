"""Boot progress as the boot script records it in guest attributes (templates/boot/).

Namespace contracts.GUEST_ATTRIBUTE_NAMESPACE; the keys the script writes are
contracts.GUEST_ATTRIBUTE_KEYS. Every value is "<UTC ISO-8601 time> <words>". `boot`
is written first on every boot, so a key older than it belongs to an earlier boot and is ignored.
`state` is `booting | waiting <why> | ready | failed <reason>`; `guard` carries the billing
guard's `deadline=<UTC time>`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tpuserve.contracts import GA_GUARD, GUEST_ATTRIBUTE_KEYS, GUEST_ATTRIBUTE_NAMESPACE

NAMESPACE = GUEST_ATTRIBUTE_NAMESPACE
# How the CLI names each phase. Not phases: `state` (read apart) and `tls` (the certificate).
# `guard` is the billing guard's, written off the node; it is shown right after the boot began.
# Not phases: `state` and `tls` (read apart), `config` and `reconverge` (ops/served_config.py).
_LABELS = {
    "boot": "boot started",
    GA_GUARD: "billing guard",
    "secret": "secrets fetched",
    "image": "image pulled",
    "cache": "compile cache restored",
    "container": "container started",
    "metrics": "metrics collector",
    "memory": "memory statistics",
    "kv_cache": "KV cache initialised",
    "startup_complete": "startup complete",
    "health": "/health OK",
    "bypass_check": "proxy refuses bypasses",
    "cache_publish": "compile cache published",
}
# The phases in the order a boot passes them: the script's keys, the guard's after `boot`.
PHASES: tuple[tuple[str, str], ...] = tuple(
    (key, _LABELS[key])
    for key in (GUEST_ATTRIBUTE_KEYS[0], GA_GUARD, *GUEST_ATTRIBUTE_KEYS[1:])
    if key in _LABELS
)
_DEADLINE_RE = re.compile(r"deadline=(\S+)")


@dataclass(frozen=True)
class BootPhase:
    key: str
    label: str
    at: dt.datetime | None
    detail: str


@dataclass(frozen=True)
class BootReport:
    state: str  # "unknown" (no attributes), "booting", "waiting", "ready", "failed"
    reason: str  # the words after failed/waiting
    phases: tuple[BootPhase, ...]  # recorded phases of the current boot, in boot order
    guard_deadline: dt.datetime | None = None
    guard: str = ""  # the guard's words: "deadline=... from=...", "deleting", "failed <why>"

    @property
    def started_at(self) -> dt.datetime | None:
        return next((p.at for p in self.phases if p.key == "boot"), None)

    @property
    def last(self) -> BootPhase | None:
        return self.phases[-1] if self.phases else None

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "reason": self.reason,
            "guard_deadline": _iso(self.guard_deadline),
            "guard": self.guard,
            "phases": [
                {"key": p.key, "label": p.label, "at": _iso(p.at), "detail": p.detail}
                for p in self.phases
            ],
        }


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


def parse_time(text: str) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _split(value: str) -> tuple[dt.datetime | None, str]:
    head, _, rest = value.strip().partition(" ")
    at = parse_time(head)
    return (at, rest.strip()) if at else (None, value.strip())


def parse_boot(attrs: Mapping[str, str]) -> BootReport:
    """{key: value} of the tpuserve namespace -> the current boot's report."""
    if not attrs:
        return BootReport("unknown", "", ())
    parsed = {k: _split(v) for k, v in attrs.items()}
    boot_at = parsed.get("boot", (None, ""))[0]

    def current(key: str) -> bool:
        at = parsed[key][0]
        return boot_at is None or at is None or at >= boot_at

    phases = tuple(
        BootPhase(key, label, *parsed[key])
        for key, label in PHASES
        if key in parsed and current(key)
    )
    state, reason = "booting", ""
    if "state" in parsed and current("state"):
        word, _, reason = parsed["state"][1].partition(" ")
        state = word if word in ("booting", "waiting", "ready", "failed") else "booting"
    deadline = None
    if GA_GUARD in parsed and current(GA_GUARD):
        m = _DEADLINE_RE.search(parsed[GA_GUARD][1])
        deadline = parse_time(m.group(1)) if m else None
    guard = parsed[GA_GUARD][1] if GA_GUARD in parsed and current(GA_GUARD) else ""
    return BootReport(state, reason.strip(), phases, deadline, guard)
