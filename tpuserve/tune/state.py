"""The tuner's state file, `.tpuserve/tune-STACK.json` beside the config: every candidate's
runs, the rung and what is left of it, which config the node is on and whether that config was
fully tried, and the node time spent. Written atomically after every step, so an interruption
(Ctrl-C, a lost connection, a flex node's run ending) loses at most the candidate in flight."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuserve.tune.node import BootRecord
from tpuserve.tune.score import Score

VERSION = 2
# Version 1 had no terraform_sha256: still read (status and review show its drift), but a
# search it saved is not resumed (tune/session.py: the end's target could not be proven).
READABLE = frozenset({1, VERSION})
TERRAFORM = "terraform"  # the node runs the script Terraform's state holds


@dataclass
class Run:
    """One candidate booted and measured once, at one rung."""

    rung: int
    reps: int
    boot: BootRecord
    score: Score | None = None
    error: str | None = None  # boot failed or the server crashed
    measure_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "reps": self.reps, "boot": self.boot.to_json(),
                "score": None if self.score is None else self.score.to_json(),
                "error": self.error, "measure_s": self.measure_s}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Run:
        return cls(doc["rung"], doc["reps"], BootRecord.from_json(doc["boot"]),
                   None if doc["score"] is None else Score.from_json(doc["score"]),
                   doc["error"], doc["measure_s"])


@dataclass
class TuneState:
    stack: str
    fingerprint: str  # of the candidates, the workload, the constraints and the schedule
    rung: int = 0
    at_rung: list[str] = field(default_factory=list)  # ids entering this rung
    pending: list[str] = field(default_factory=list)  # ids of this rung still to run
    runs: dict[str, list[Run]] = field(default_factory=dict)
    node_on: str = TERRAFORM
    settled: bool = True  # node_on was fully tried (booted and measured)
    last_good: str = TERRAFORM
    spent_s: float = 0.0
    done: bool = False
    # Where the run left a node that is not on Terraform's script (tune/drift.py).
    node_on_sha256: str | None = None
    overlay: str | None = None
    # The sha256 of the startup-script the node held when the search started (what the
    # config rendered, checked against the node): the end restores "terraform" only while
    # the config still renders exactly it. The script itself is not kept: the config
    # reproduces it, and a resume whose config no longer does is refused.
    terraform_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "stack": self.stack, "fingerprint": self.fingerprint,
                "rung": self.rung, "at_rung": self.at_rung, "pending": self.pending,
                "runs": {k: [r.to_json() for r in v] for k, v in self.runs.items()},
                "node_on": self.node_on, "settled": self.settled, "last_good": self.last_good,
                "spent_s": self.spent_s, "done": self.done,
                "node_on_sha256": self.node_on_sha256, "overlay": self.overlay,
                "terraform_sha256": self.terraform_sha256}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TuneState:
        if doc.get("version") not in READABLE:
            raise ValueError(f"version {doc.get('version')!r}, this tuner reads "
                             f"{', '.join(map(str, sorted(READABLE)))}")
        sha = doc.get("terraform_sha256")
        if sha is not None and not (isinstance(sha, str) and len(sha) == 64
                                    and all(ch in "0123456789abcdef" for ch in sha)):
            raise ValueError(f"terraform_sha256 {str(sha)[:80]!r} is not a sha256")
        return cls(doc["stack"], doc["fingerprint"], doc["rung"], list(doc["at_rung"]),
                   list(doc["pending"]),
                   {k: [Run.from_json(r) for r in v] for k, v in doc["runs"].items()},
                   doc["node_on"], doc["settled"], doc["last_good"], doc["spent_s"],
                   doc["done"], doc.get("node_on_sha256"), doc.get("overlay"), sha)


def save(state: TuneState, path: Path) -> None:
    """Write the state atomically: a temporary file beside it, fsync'd, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state.to_json(), fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path: Path) -> TuneState | None:
    """The saved state, None when there is none; ValueError (one line) for a broken file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return TuneState.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a tune state file ({type(exc).__name__}: {exc})"
                         ) from None
