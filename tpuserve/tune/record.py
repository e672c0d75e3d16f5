"""A tune run recorded as the user's own measured profile (settings/learned_profiles.py): the
chosen config with its figures (per cell), and every config that failed to boot with its
error, in the file of the stack's (model, accelerator, image digest) under `[capacity]
profiles_dir`.

The digest is the one the boot's `image` phase reported (the build that ran): the chosen
config's own boot; a refusal's failed boot, else (a boot that failed before the image phase)
the last good boot before it. An entry whose build is not known is not recorded, and the run
says so: a tag names no build. A refusal holds the settings the failed config changed from
the stack's own; a later config holding all of them is refused in one line. Each file is
merged with what it already holds (a refusal recorded once) and written whole.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpuserve.settings import Deployment
from tpuserve.settings.learned_profiles import (
    VERSION,
    Cell,
    LearnedProfile,
    Measured,
    Refusal,
    key_of,
    one_line,
    parse,
    pinned_digest,
)
from tpuserve.tune import halving
from tpuserve.tune.candidates import DIMENSIONS, Candidate
from tpuserve.tune.node import BootRecord
from tpuserve.tune.state import Run, TuneState
from tpuserve.tune.tpu_node import NO_WORD
from tpuserve.tune.workload import Workload

Entries = dict[str, tuple[list[Measured], list[Refusal]]]  # per image digest


def profile_path(directory: Path, model: str, accelerator: str, digest: str) -> Path:
    """One file per key: readable names, the digest by its first 12 hex."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return directory / f"{slug}.{accelerator}.{digest.removeprefix('sha256:')[:12]}.toml"


def _setting(dim: str) -> str:
    path = dict(DIMENSIONS)[dim]
    return "vllm." + ".".join(path)


def settings_of(c: Candidate) -> dict[str, Any]:
    return {_setting(k): v for k, v in c.values}


def refused_values(c: Candidate) -> dict[str, Any]:
    """What a refusal holds: the candidate's whole combination, so it refuses that config and
    not every config sharing one of its values (a memory step that did not fit one program set
    may fit another); the precompile workers left out, since they change how the programs
    compile, not what they hold."""
    return {_setting(k): v for k, v in c.values if k != "NUM_PRECOMPILE_WORKERS"}


def changed(c: Candidate, baseline: Candidate) -> dict[str, Any]:
    base = baseline.as_dict
    return {_setting(k): v for k, v in c.values if v != base[k]}


def _boot_at(b: BootRecord) -> str:
    return next((t for k, t in b.phases if k == "boot" and t), "")


def refusal_digest(failed: BootRecord, state: TuneState) -> str | None:
    """The build a failed boot ran: its own `image` phase's, else the last good boot's before
    it (by boot time; without times, the one build every good boot ran), else None."""
    if failed.digest:
        return failed.digest
    good = [r.boot for rs in state.runs.values() for r in rs if r.boot.ok and r.boot.digest]
    at = _boot_at(failed)
    earlier = [b for b in good if at and _boot_at(b) and _boot_at(b) <= at]
    if earlier:
        return max(earlier, key=_boot_at).digest
    builds = {b.digest for b in good}
    return builds.pop() if len(builds) == 1 and not at else None


def _cells(run: Run, workload: Workload) -> tuple[Cell, ...]:
    assert run.score is not None
    out = round(statistics.fmean(t[1] for t in workload.trace)) if workload.trace else \
        workload.output_tokens
    return tuple(Cell(c.context, c.clients, out, c.tok_s, c.ttft_p90_ms, c.tpot_p50_ms,
                      c.tok_s_cv, c.reps) for c in run.score.cells)


def entries(d: Deployment, state: TuneState, candidates: Mapping[str, Candidate],
            baseline: Candidate, best: str | None, workload: Workload,
            today: str) -> tuple[Entries, list[str]]:
    """The run's measurement and refusals by image digest, and a line per one left out."""
    node = d.node_name
    out: Entries = {}
    notes: list[str] = []
    pinned = pinned_digest(d.vllm.image)

    def add(digest: str | None, what: str, item: Measured | Refusal) -> None:
        if digest is None or (pinned is not None and digest != pinned):
            why = "reported no image digest" if digest is None else \
                f"ran {digest}, not the pinned {pinned}"
            notes.append(f"profile: {what} not recorded: its boot {why} (a tag names no build)")
            return
        measured, refusals = out.setdefault(digest, ([], []))
        (measured if isinstance(item, Measured) else refusals).append(item)  # type: ignore

    run = halving.latest(state, best) if best is not None else None
    if best is not None and run is not None and run.score is not None:
        cache = {True: "warm", False: "cold", None: "unknown"}[run.boot.cache_hit]
        add(run.boot.digest, f"the chosen config {best!r}",
            Measured(today, node, d.name, best, workload.describe(), run.score.usd_per_m,
                     run.score.tok_s, run.boot.boot_s, settings_of(candidates[best]), cache,
                     bool(workload.trace), _cells(run, workload)))
    for cid, runs in state.runs.items():
        # A boot the node said failed; the tuner's own giving up waiting proves nothing.
        failed = next((r for r in runs if r.error is not None and not r.boot.ok
                       and not r.error.startswith(NO_WORD)), None)
        c = candidates.get(cid)
        if failed is None or c is None or not changed(c, baseline):
            continue  # the stack's own config failing refuses nothing
        add(refusal_digest(failed.boot, state), f"the refusal of {cid!r}",
            Refusal(today, node, cid, one_line(failed.error or "failed to boot"),
                    refused_values(c)))
    return out, notes


def record(d: Deployment, state: TuneState, candidates: Mapping[str, Candidate],
           baseline: Candidate, best: str | None, workload: Workload,
           today: str | None = None, log: Callable[[str], None] | None = None) -> Path | None:
    """Write the run into the profile file of each image digest it ran; the chosen config's
    file (else the first written), None when nothing was recorded (or no profiles_dir)."""
    directory = d.capacity.profiles_dir_path
    if directory is None:
        return None
    day = today or dt.datetime.now(dt.UTC).date().isoformat()
    by_digest, notes = entries(d, state, candidates, baseline, best, workload, day)
    for note in notes:
        (log or (lambda _line: None))(note)
    written: list[Path] = []
    for digest, (measured, refusals) in by_digest.items():
        path = _merge(directory, d, digest, measured, refusals)
        written.insert(0 if measured else len(written), path)
    return written[0] if written else None


def _merge(directory: Path, d: Deployment, digest: str, measured: list[Measured],
           refusals: list[Refusal]) -> Path:
    model, accelerator, image = key_of(d)
    path = profile_path(directory, model, accelerator, digest)
    old = parse(path, path.read_text(encoding="utf-8")) if path.exists() else \
        LearnedProfile(path, model, accelerator, image, digest)
    seen = {(r.candidate, json.dumps(dict(r.values), sort_keys=True)) for r in old.refusals}
    new_refusals = [r for r in refusals
                    if (r.candidate, json.dumps(dict(r.values), sort_keys=True)) not in seen]
    merged = LearnedProfile(path, model, accelerator, old.image, digest,
                            old.measured + tuple(measured), old.refusals + tuple(new_refusals))
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(to_toml(merged), encoding="utf-8")
    tmp.replace(path)
    return path


def _v(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int | float):
        return repr(x)
    return json.dumps(str(x))  # JSON's escapes are TOML basic-string escapes


def _table(values: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{_v(k)} = {_v(x)}" for k, x in values.items()) + " }"


def _cell_lines(c: Cell) -> list[str]:
    fields = {"context": c.context, "clients": c.clients, "output_tokens": c.output_tokens,
              "tok_s": c.tok_s, "ttft_p90_ms": c.ttft_p90_ms, "tpot_p50_ms": c.tpot_p50_ms,
              "tok_s_cv": c.tok_s_cv, "reps": c.reps}
    return ["", "[[measured.cells]]",
            *(f"{k} = {_v(x)}" for k, x in fields.items() if x is not None)]


def to_toml(p: LearnedProfile) -> str:
    lines = [(f"# Measured by tpuserve tune on the user's own node: {p.model} on "
              f"{p.accelerator}, the image build below. Its refusals are validators; `tpuserve "
              "plan` uses a measurement where the config pins that digest and its flags."),
             f"version = {VERSION}", f"model = {_v(p.model)}",
             f"accelerator = {_v(p.accelerator)}", f"image = {_v(p.image)}",
             f"image_digest = {_v(p.image_digest)}"]
    for m in p.measured:
        lines += ["", "[[measured]]", f"date = {_v(m.date)}", f"node = {_v(m.node)}",
                  f"stack = {_v(m.stack)}", f"candidate = {_v(m.candidate)}",
                  f"workload = {_v(m.workload)}", f"usd_per_m = {_v(m.usd_per_m)}",
                  f"tok_s = {_v(m.tok_s)}", f"boot_s = {_v(m.boot_s)}",
                  f"cache = {_v(m.cache)}", f"trace = {_v(m.trace)}",
                  f"values = {_table(m.values)}"]
        for c in m.cells:
            lines += _cell_lines(c)
    for r in p.refusals:
        lines += ["", "[[refusals]]", f"date = {_v(r.date)}", f"node = {_v(r.node)}",
                  f"candidate = {_v(r.candidate)}", f"error = {_v(r.error)}",
                  f"values = {_table(r.values)}"]
    return "\n".join(lines) + "\n"
