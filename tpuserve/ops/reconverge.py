"""The node watcher's `reconverge` guest attribute, read as one definite state.

The watcher (templates/boot/boot_helper/watcher.py) writes `<UTC time> WORDS`, WORDS one of:

  watching etag=E                             started, nothing applied yet
  changed sha256=HEX etag=E                   a new script in metadata, about to run
  retrying sha256=HEX attempt=N/M in=Ss WHY   it did not reach readiness; runs again
  applied sha256=HEX                          final: its boot reached readiness
  failed sha256=HEX WHY                       final until the next metadata change: not ready
                                              after its retries, or not run (HEX "none")

`state` is the first word; `script_sha256` the script's hex (None when the words name none);
`why` the rest (None for watching, changed and applied). A value in no such shape is state
"unknown" (never taken as applied: applied is only ever `applied sha256=HEX`, exactly): an
older watcher's `failed WHY` reads failed, without a sha256. A later command that tunes the
node waits for applied or failed, nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve.contracts import GA_RECONVERGE

from .boot_phases import parse_time

KEY = GA_RECONVERGE
STATES = ("watching", "changed", "retrying", "applied", "failed")
FINAL_STATES = frozenset({"applied", "failed"})
_SHA = re.compile(r"sha256=([0-9a-f]{64}|none)")


@dataclass(frozen=True)
class Reconverge:
    state: str  # one of STATES, or "unknown"
    script_sha256: str | None
    why: str | None
    at: str | None  # the recorded UTC time, ISO 8601

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "script_sha256": self.script_sha256, "why": self.why,
                "at": self.at}


def parse_reconverge(attrs: Mapping[str, str]) -> Reconverge | None:
    """The watcher's last word from the node's guest attributes; None when it wrote none."""
    value = attrs.get(KEY)
    if value is None:
        return None
    head, _, words = value.strip().partition(" ")
    at = parse_time(head)
    if at is None:
        return Reconverge("unknown", None, value.strip()[:300] or None, None)
    at_iso = at.isoformat().replace("+00:00", "Z")
    word, _, rest = words.strip().partition(" ")
    if word not in STATES:
        return Reconverge("unknown", None, words.strip()[:300] or None, at_iso)
    first, _, tail = rest.partition(" ")
    m = _SHA.fullmatch(first)
    sha = m.group(1) if m and m.group(1) != "none" else None
    if word in ("watching",):
        return Reconverge(word, None, None, at_iso)
    if m is None:
        if word == "failed":  # an older watcher: `failed WHY`
            return Reconverge(word, None, rest.strip()[:300] or None, at_iso)
        return Reconverge("unknown", None, words.strip()[:300] or None, at_iso)
    if word == "applied":
        # Final and trusted by what waits for it: only the exact form proves it.
        if sha is None or tail.strip():
            return Reconverge("unknown", None, words.strip()[:300] or None, at_iso)
        return Reconverge(word, sha, None, at_iso)
    if word == "changed":
        return Reconverge(word, sha, None, at_iso)
    return Reconverge(word, sha, tail.strip()[:300] or None, at_iso)
