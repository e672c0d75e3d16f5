"""A tune run recorded as the user's own measured profile (settings/learned_profiles.py): the
chosen config with its figures, and every config that failed to boot with its error, in the
file of the stack's (model, accelerator, image) under `[capacity] profiles_dir`.

A refusal holds the settings the failed config changed from the stack's own (what the boot
that worked did not have); a later config holding all of them is refused in one line. The
file is merged with what it already holds (a refusal recorded once) and written whole.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuserve.settings import Deployment
from tpuserve.settings.learned_profiles import (
    VERSION,
    LearnedProfile,
    Measured,
    Refusal,
    key_of,
    one_line,
    parse,
)
from tpuserve.tune import halving
from tpuserve.tune.candidates import DIMENSIONS, Candidate
from tpuserve.tune.state import TuneState


def profile_path(directory: Path, model: str, accelerator: str, image: str) -> Path:
    """One file per key: readable names, the image by a hash (a tag or digest has ':' and '@')."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    image_id = hashlib.sha256(image.encode()).hexdigest()[:12]
    return directory / f"{slug}.{accelerator}.{image_id}.toml"


def _setting(dim: str) -> str:
    path = dict(DIMENSIONS)[dim]
    return "vllm." + ".".join(path)


def settings_of(c: Candidate) -> dict[str, Any]:
    return {_setting(k): v for k, v in c.values}


def changed(c: Candidate, baseline: Candidate) -> dict[str, Any]:
    base = baseline.as_dict
    return {_setting(k): v for k, v in c.values if v != base[k]}


def entries(d: Deployment, state: TuneState, candidates: Mapping[str, Candidate],
            baseline: Candidate, best: str | None, workload: str,
            today: str) -> tuple[list[Measured], list[Refusal]]:
    node = d.node_name
    measured: list[Measured] = []
    run = halving.latest(state, best) if best is not None else None
    if best is not None and run is not None and run.score is not None:
        measured.append(Measured(today, node, d.name, best, workload, run.score.usd_per_m,
                                 run.score.tok_s, run.boot.boot_s,
                                 settings_of(candidates[best])))
    refusals: list[Refusal] = []
    for cid, runs in state.runs.items():
        failed = next((r for r in runs if r.error is not None and not r.boot.ok), None)
        values = changed(candidates[cid], baseline) if cid in candidates else {}
        if failed is None or not values:  # the stack's own config failing refuses nothing
            continue
        refusals.append(Refusal(today, node, cid, one_line(failed.error or "failed to boot"),
                                values))
    return measured, refusals


def record(d: Deployment, state: TuneState, candidates: Mapping[str, Candidate],
           baseline: Candidate, best: str | None, workload: str,
           today: str | None = None) -> Path | None:
    """Write the run into the stack's profile file; None when it measured and refused nothing
    (or no profiles_dir is configured)."""
    directory = d.capacity.profiles_dir_path
    if directory is None:
        return None
    day = today or dt.datetime.now(dt.UTC).date().isoformat()
    measured, refusals = entries(d, state, candidates, baseline, best, workload, day)
    if not measured and not refusals:
        return None
    model, accelerator, image = key_of(d)
    path = profile_path(directory, model, accelerator, image)
    old = parse(path, path.read_text(encoding="utf-8")) if path.exists() else \
        LearnedProfile(path, model, accelerator, image)
    seen = {(r.candidate, json.dumps(dict(r.values), sort_keys=True)) for r in old.refusals}
    new_refusals = [r for r in refusals
                    if (r.candidate, json.dumps(dict(r.values), sort_keys=True)) not in seen]
    merged = LearnedProfile(path, model, accelerator, image, old.measured + tuple(measured),
                            old.refusals + tuple(new_refusals))
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


def to_toml(p: LearnedProfile) -> str:
    lines = [(f"# Measured by tpuserve tune on the user's own node: {p.model} on "
              f"{p.accelerator}, image below. Its refusals are validators; `tpuserve plan` "
              "cites its newest measurement."), f"version = {VERSION}", f"model = {_v(p.model)}",
             f"accelerator = {_v(p.accelerator)}", f"image = {_v(p.image)}"]
    for m in p.measured:
        lines += ["", "[[measured]]", f"date = {_v(m.date)}", f"node = {_v(m.node)}",
                  f"stack = {_v(m.stack)}", f"candidate = {_v(m.candidate)}",
                  f"workload = {_v(m.workload)}", f"usd_per_m = {_v(m.usd_per_m)}",
                  f"tok_s = {_v(m.tok_s)}", f"boot_s = {_v(m.boot_s)}",
                  f"values = {_table(m.values)}"]
    for r in p.refusals:
        lines += ["", "[[refusals]]", f"date = {_v(r.date)}", f"node = {_v(r.node)}",
                  f"candidate = {_v(r.candidate)}", f"error = {_v(r.error)}",
                  f"values = {_table(r.values)}"]
    return "\n".join(lines) + "\n"
