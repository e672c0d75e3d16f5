"""Two request bodies compared field by field (leaf paths), with every difference explained.

A leaf is a scalar, a list or an empty object, at its dotted path. proto3 JSON has no
"unset" distinct from the zero value (false, 0, "", [], {}): a field one side sends at its
zero value and the other leaves out is the same request, and is reported as such.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ZERO = (False, 0, "", [], {})


def leaves(body: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(body, Mapping) and body:
        out: dict[str, Any] = {}
        for key, value in body.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(body, list) and body and all(isinstance(v, Mapping) for v in body):
        out = {}
        for i, value in enumerate(body):
            out.update(leaves(value, f"{prefix}.{i}"))
        return out
    return {prefix: body}


def short(value: Any) -> str:
    """A value for a report: long ones (a boot script) by size and digest."""
    text = json.dumps(value, sort_keys=True)
    if len(text) > 80:
        return f"<{len(text)} chars, sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}>"
    return text


def _covered(path: str, listed: Mapping[str, str]) -> str | None:
    """The reason listed for `path` or for an enclosing object of it."""
    for key, reason in listed.items():
        if path == key or path.startswith(key + "."):
            return reason
    return None


@dataclass
class Comparison:
    equal: list[str] = field(default_factory=list)
    zero_default: list[str] = field(default_factory=list)   # zero on one side, absent on other
    explained: dict[str, str] = field(default_factory=dict)  # path -> reason
    unexplained: list[str] = field(default_factory=list)     # the failures
    stale: list[str] = field(default_factory=list)           # listed, but no longer differs

    def report(self) -> str:
        lines = [f"equal: {', '.join(sorted(self.equal))}"]
        if self.zero_default:
            lines.append(f"zero value vs absent (proto3): {', '.join(sorted(self.zero_default))}")
        lines += [f"differs, explained: {k}: {v}" for k, v in sorted(self.explained.items())]
        lines += [f"UNEXPLAINED: {u}" for u in self.unexplained]
        lines += [f"STALE explanation (no difference any more): {s}" for s in self.stale]
        return "\n".join(lines)


def compare(gcloud: Any, ours: Any, *, differs: Mapping[str, str],
            ours_only: Mapping[str, str]) -> Comparison:
    """`differs`: gcloud's fields we send differently or not at all, with the reason;
    `ours_only`: fields only we send, with the reason. Both must still apply (else stale)."""
    g, o = leaves(gcloud), leaves(ours)
    out = Comparison()
    used: set[str] = set()
    for path in sorted(set(g) | set(o)):
        in_g, in_o = path in g, path in o
        if in_g and in_o and g[path] == o[path]:
            out.equal.append(path)
            continue
        if (in_g and not in_o and g[path] in ZERO) or (in_o and not in_g and o[path] in ZERO):
            out.zero_default.append(path)
            continue
        listed = differs if in_g else ours_only
        reason = _covered(path, listed)
        if reason is None:
            got = f"gcloud {short(g[path])}" if in_g else "gcloud: absent"
            mine = f"ours {short(o[path])}" if in_o else "ours: absent"
            out.unexplained.append(f"{path}: {got}, {mine}")
            continue
        values = (f"gcloud {short(g[path]) if in_g else 'absent'}, "
                  f"ours {short(o[path]) if in_o else 'absent'}")
        out.explained[path] = f"{values}: {reason}"
        used |= {k for k in listed if path == k or path.startswith(k + ".")}
    out.stale = sorted((set(differs) | set(ours_only)) - used)
    return out
