"""The node the tuner drives, as a Protocol: apply a [vllm] overlay and wait for its boot,
measure it with the project's benchmark, restore Terraform's script.

The TPU-API implementation (patch the startup-script metadata with nodes.patch, let the
watcher re-run it, read the boot phases and the watcher's `reconverge` word from guest
attributes: ops/boot_phases.py, ops/reconverge.py) plugs in here; the tests drive a fake.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpuserve.ops.bench_stats import CellStats
from tpuserve.ops.boot_phases import BootReport
from tpuserve.ops_error import OpsError
from tpuserve.tune.workload import Workload


@dataclass(frozen=True)
class BootRecord:
    """One boot of the node on one config, from its guest attributes."""

    ok: bool
    boot_s: float  # boot start to /health OK (or to the failure)
    compile_s: float | None = None  # XLA compilation, when the phases tell it
    cache_hit: bool | None = None  # the compile cache restored warm
    error: str | None = None  # why it did not reach readiness
    phases: tuple[tuple[str, str], ...] = ()  # (key, UTC time) in boot order
    digest: str | None = None  # the `image` phase's digest=sha256:HEX: the build that ran

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "boot_s": self.boot_s, "compile_s": self.compile_s,
                "cache_hit": self.cache_hit, "error": self.error,
                "phases": [list(p) for p in self.phases], "digest": self.digest}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> BootRecord:
        return cls(bool(doc["ok"]), float(doc["boot_s"]), doc.get("compile_s"),
                   doc.get("cache_hit"), doc.get("error"),
                   tuple(tuple(p) for p in doc.get("phases", ())),  # type: ignore[misc]
                   image_digest(f"digest={doc.get('digest')}"))


def image_digest(words: str) -> str | None:
    """The one manifest digest in the boot script's `image` words (IMAGE_WORDS), else None:
    an image id (no repo digest), two digests or none name no one pullable build."""
    found = set(re.findall(r"(?:^|\s)digest=(sha256:[0-9a-f]{64})(?=\s|$)", words))
    return found.pop() if len(found) == 1 else None


def boot_record(report: BootReport) -> BootRecord:
    """A BootReport (ops/boot_phases.py) as the tuner records it: compile time is what lies
    between the KV cache's initialisation and startup's end (the programs compile there); the
    cache phase's first word says hit or miss."""
    at = {p.key: p.at for p in report.phases if p.at is not None}
    cache = next((p.detail.split(" ", 1)[0] for p in report.phases if p.key == "cache"), "")
    cache_hit = {"hit": True, "miss": False}.get(cache)
    start, end = at.get("boot"), at.get("health") or (report.last.at if report.last else None)
    boot_s = (end - start).total_seconds() if start and end else 0.0
    c0, c1 = at.get("kv_cache"), at.get("startup_complete")
    compile_s = (c1 - c0).total_seconds() if c0 and c1 else None
    ok = report.state == "ready"
    return BootRecord(ok, boot_s, compile_s, cache_hit,
                      None if ok else (report.reason or report.state),
                      tuple((p.key, p.at.isoformat() if p.at else "") for p in report.phases),
                      next((image_digest(p.detail) for p in report.phases if p.key == "image"),
                           None))


@dataclass(frozen=True)
class Measurement:
    """What `tpuserve bench` reports for the workload: one CellStats per cell, with its
    repetitions (their cv), and how long the node was measured."""

    cells: tuple[CellStats, ...]
    duration_s: float
    errors: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


class CandidateFailed(Exception):
    """The candidate did not boot, or the server crashed while it was measured."""

    def __init__(self, reason: str, boot: BootRecord | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.boot = boot


class NodeGone(Exception):
    """The node itself went away (a flex node's run ended, a spot node was preempted): raised
    only on proof (the TPU API's NOT_FOUND for it, or a state in which no boot will end)."""


class NodeUnproven(OpsError):
    """A boot or benchmark failed and the TPU API's answer about the node proved neither that
    it is there nor that it is gone: the candidate is not recorded as failed (that would become
    a learned refusal) and the node is not taken as gone; the tuner stops, the state saved."""


class TuneNode(Protocol):
    """What the tuner needs of the node."""

    def apply(self, overlay: Mapping[str, Any]) -> BootRecord:
        """Run the stack's script with OVERLAY over its [vllm] and wait for the boot to end;
        a BootRecord with ok False (or CandidateFailed) when it did not reach readiness."""
        ...

    def measure(self, workload: Workload, repetitions: int) -> Measurement:
        """The benchmark of the running config; CandidateFailed when the server crashed."""
        ...

    def restore(self) -> BootRecord:
        """Put back the script Terraform's state holds and wait for its boot."""
        ...


def describe_cells(cells: Sequence[CellStats]) -> str:
    return ", ".join(f"{c.context}x{c.clients}" for c in cells)
