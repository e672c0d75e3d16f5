"""Which settings the running server actually uses.

The boot script records guest attribute `config` = `<UTC time> argv_sha256=<16 hex>` when it
starts vLLM: tpuserve.render.vllm_args.served_config_sha256 of the image, argv and env it
started it with (the script's CONFIG_SHA256). `tpuserve status` sets it beside the same hash of
the config this CLI reads ("deployed": what a deploy puts on the node), so a change that has
not reached the server shows. The node's metadata watcher records `reconverge` = `<UTC time>
watching etag=... | changed sha256=... | applied | failed <why>` while it re-runs the boot
script in place after a metadata change.

States: `current` (running == deployed), `stale` (they differ), `unknown` (a server booted by a
script that did not record it), `booting` (not recorded yet on this boot), `none` (no node, or
its guest attributes not read).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuserve.contracts import GA_CONFIG, GA_RECONVERGE

from .boot_phases import parse_time

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

CONFIG_KEY = GA_CONFIG
RECONVERGE_KEY = GA_RECONVERGE
_SHA = re.compile(r"\b(?:argv_|config_)?sha256=([0-9a-f]{8,64})\b")


def deployed_sha256(d: Deployment) -> str:
    """The served-config hash of the config this CLI reads, as the boot script computes it."""
    from tpuserve.render.boot_script import vllm_command
    from tpuserve.render.vllm_args import served_config_sha256

    return served_config_sha256(d, vllm_command(d))


def _split(value: str) -> tuple[dt.datetime | None, str]:
    head, _, rest = value.strip().partition(" ")
    at = parse_time(head)
    return (at, rest.strip()) if at else (None, value.strip())


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


@dataclass(frozen=True)
class ServedConfig:
    deployed: str
    state: str = "none"  # current | stale | unknown | booting | none
    running: str | None = None
    recorded_at: dt.datetime | None = None
    reconverge: str = ""  # the watcher's words, "" when it recorded nothing
    reconverge_at: dt.datetime | None = None

    @property
    def current(self) -> bool | None:
        return None if self.running is None else self.running == self.deployed

    @property
    def reconverge_failed(self) -> bool:
        return self.reconverge.startswith("failed")

    def describe(self) -> str:
        """The `config` row of `tpuserve status`."""
        if self.state == "current":
            return f"serving the deployed config (argv sha256 {self.running})"
        if self.state == "stale":
            return (f"serving another config: running {self.running}, deployed {self.deployed} "
                    "(once deployed, the node re-converges in place: watch this)")
        if self.state == "unknown":
            return f"unknown (booted before tpuserve recorded it); deployed {self.deployed}"
        if self.state == "booting":
            return f"not recorded yet (the server is booting); deployed {self.deployed}"
        return f"-; deployed {self.deployed}"

    def describe_reconverge(self) -> str | None:
        """The `reconverge` row, when the node's watcher recorded anything."""
        if not self.reconverge:
            return None
        at = f" (at {self.reconverge_at:%m-%d %H:%M:%S} UTC)" if self.reconverge_at else ""
        return self.reconverge + at

    def to_json(self) -> dict[str, Any]:
        reconverge = None
        if self.reconverge:
            word, _, detail = self.reconverge.partition(" ")
            reconverge = {"state": word, "detail": detail, "at": _iso(self.reconverge_at)}
        return {"running": self.running, "deployed": self.deployed, "current": self.current,
                "state": self.state, "recorded_at": _iso(self.recorded_at),
                "reconverge": reconverge}


def parse_served(attrs: Mapping[str, str], deployed: str, *, booting: bool) -> ServedConfig:
    """The node's guest attributes (tpuserve namespace) against the deployed hash; `booting`:
    the current boot has not reached ready or failed (no `config` yet is no surprise)."""
    reconverge, reconverge_at = "", None
    if RECONVERGE_KEY in attrs:
        reconverge_at, reconverge = _split(attrs[RECONVERGE_KEY])
    if not attrs:
        return ServedConfig(deployed)
    running, at = None, None
    if CONFIG_KEY in attrs:
        at, words = _split(attrs[CONFIG_KEY])
        m = _SHA.search(words)
        running = m.group(1) if m else None
    if running is not None:
        state = "current" if running == deployed else "stale"
    else:
        state = "booting" if booting else "unknown"
    return ServedConfig(deployed, state, running, at, reconverge, reconverge_at)
