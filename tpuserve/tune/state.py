"""The tuner's state file, `.tpuserve/tune-STACK.json` beside the config: every candidate's
runs, the rung and what is left of it, which config the node is on and whether that config was
fully tried, and the node time spent. Written atomically after every step, so an interruption
(Ctrl-C, a lost connection, a flex node's run ending) loses at most the candidate in flight."""

from __future__ import annotations

import json
import math
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
# The price the runs' $/M were taken at (named apart from the Terraform output usd_per_hour).
PRICE_KEY = "price_usd_per_hour"
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
        _check_run(doc)
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
    # The price every run's $/M was taken at, and where it came from (a resume at another
    # price is refused: tune/session.py). None in a state saved before it was recorded.
    usd_per_hour: float | None = None
    price_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "stack": self.stack, "fingerprint": self.fingerprint,
                "rung": self.rung, "at_rung": self.at_rung, "pending": self.pending,
                "runs": {k: [r.to_json() for r in v] for k, v in self.runs.items()},
                "node_on": self.node_on, "settled": self.settled, "last_good": self.last_good,
                "spent_s": self.spent_s, "done": self.done,
                "node_on_sha256": self.node_on_sha256, "overlay": self.overlay,
                "terraform_sha256": self.terraform_sha256,
                PRICE_KEY: self.usd_per_hour, "price_source": self.price_source}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TuneState:
        if type(doc.get("version")) is not int or doc["version"] not in READABLE:
            raise ValueError(f"version {doc.get('version')!r}, this tuner reads "
                             f"{', '.join(map(str, sorted(READABLE)))}")
        _check_state(doc)
        return cls(doc["stack"], doc["fingerprint"], doc["rung"], list(doc["at_rung"]),
                   list(doc["pending"]),
                   {k: [Run.from_json(r) for r in v] for k, v in doc["runs"].items()},
                   doc["node_on"], doc["settled"], doc["last_good"], float(doc["spent_s"]),
                   doc["done"], doc.get("node_on_sha256"), doc.get("overlay"),
                   doc.get("terraform_sha256"), doc.get(PRICE_KEY),
                   doc.get("price_source"))


# -- every field checked on load (fail closed: a hand-edited or damaged file is refused, not
# resumed; a NaN spent_s would pass every budget check, a string "no" would read as true)
def _is_num(v: Any, *, finite: bool = True) -> bool:
    return (type(v) in (int, float) and not math.isnan(v) and v >= 0
            and (math.isfinite(v) or not finite))


def _need(ok: bool, where: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{where} = {json.dumps(value)[:80]}: {rule}")


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _check_state(doc: dict[str, Any]) -> None:
    for key in ("stack", "fingerprint", "node_on", "last_good"):
        _need(isinstance(doc.get(key), str) and doc[key] != "", key, doc.get(key),
              "not a non-empty string")
    _need(type(doc.get("rung")) is int and doc["rung"] >= 0, "rung", doc.get("rung"),
          "not an integer >= 0")
    for key in ("at_rung", "pending"):
        _need(_strs(doc.get(key)), key, doc.get(key), "not a list of candidate ids")
    for key in ("settled", "done"):
        _need(type(doc.get(key)) is bool, key, doc.get(key), "not true or false")
    _need(_is_num(doc.get("spent_s")), "spent_s", doc.get("spent_s"),
          "not a finite number of seconds >= 0")
    for key in ("node_on_sha256", "overlay", "price_source"):
        _need(doc.get(key) is None or isinstance(doc[key], str), key, doc.get(key),
              "not a string or null")
    sha = doc.get("terraform_sha256")
    _need(sha is None or (isinstance(sha, str) and len(sha) == 64
                          and all(ch in "0123456789abcdef" for ch in sha)),
          "terraform_sha256", sha, "is not a sha256")
    price = doc.get(PRICE_KEY)
    _need(price is None or (_is_num(price) and price > 0), PRICE_KEY, price,
          "not a finite price > 0")
    runs = doc.get("runs")
    _need(isinstance(runs, dict) and all(isinstance(v, list) for v in runs.values()), "runs",
          runs, "not a table of candidate ids to lists of runs")


_BOOT = {"ok": "bool", "boot_s": "seconds", "compile_s": "number?", "cache_hit": "bool?",
         "error": "str?", "phases": "phases", "digest": "str?"}
_SCORE = {"usd_per_m": "figure?", "tok_s": "figure", "tok_s_cv": "figure?",
          "ttft_p90_ms": "figure", "tpot_p50_ms": "figure?", "stream_tok_s": "figure?",
          "violations": "strs", "cells": "cells"}
_CELL = {"context": "int", "clients": "int", "tok_s": "figure", "tok_s_cv": "figure?",
         "ttft_p90_ms": "figure", "tpot_p50_ms": "figure?", "stream_tok_s": "figure?",
         "reps": "int"}


def _fits(v: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return v is None or _fits(v, kind[:-1])
    checks: dict[str, Any] = {
        "bool": lambda: type(v) is bool, "str": lambda: isinstance(v, str),
        "seconds": lambda: _is_num(v), "figure": lambda: _is_num(v, finite=False),
        "number": lambda: type(v) in (int, float) and math.isfinite(v),
        "count": lambda: type(v) is int and v >= 1, "int": lambda: type(v) is int and v >= 0,
        "strs": lambda: _strs(v),
        "phases": lambda: isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 and _strs(p) for p in v),
        "cells": lambda: isinstance(v, list) and all(_table(c, _CELL) for c in v)}
    return bool(checks[kind]())


def _table(doc: Any, kinds: dict[str, str], where: str = "", *,
           needed: tuple[str, ...] | None = None) -> bool:
    """True when DOC holds KINDS' keys (all of them, or at least NEEDED), each of its kind;
    with WHERE, ValueError naming the first bad field instead of False."""
    need = set(kinds) if needed is None else set(needed)
    if not isinstance(doc, dict) or not need <= set(doc) <= set(kinds):
        if where:
            _need(False, where, doc, f"not a table of {', '.join(kinds)}")
        return False
    for key, kind in kinds.items():
        if key in doc and not _fits(doc[key], kind):
            if where:
                _need(False, f"{where}.{key}", doc[key], "not a valid value")
            return False
    return True


def _check_run(doc: Any) -> None:
    keys = ("rung", "reps", "boot", "score", "error", "measure_s")
    _need(isinstance(doc, dict) and set(doc) == set(keys), "runs[]", doc,
          f"not a table of exactly {', '.join(keys)}")
    _need(type(doc["rung"]) is int and doc["rung"] >= 0, "runs[].rung", doc["rung"],
          "not an integer >= 0")
    _need(_fits(doc["reps"], "count"), "runs[].reps", doc["reps"], "not an integer >= 1")
    _need(_fits(doc["error"], "str?"), "runs[].error", doc["error"], "not a string or null")
    _need(_is_num(doc["measure_s"]), "runs[].measure_s", doc["measure_s"],
          "not a finite number of seconds >= 0")
    _table(doc["boot"], _BOOT, "runs[].boot", needed=("ok", "boot_s"))
    if doc["score"] is not None:
        _table(doc["score"], _SCORE, "runs[].score")


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
    """The saved state, None when there is none; ValueError (one line naming the file and the
    bad field) for a file that cannot be read or is not a well-formed state."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{path}: not a readable tune state file ({why})") from None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not a table")
        return TuneState.from_json(doc)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a tune state file ({type(exc).__name__}: {exc})"
                         ) from None
