"""One `tpuserve tune` session: the search prepared from the config (candidates, constraints,
workload, state file), and its outputs written (overlay, report, chart)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuserve.contracts import CONFIG_ENV
from tpuserve.kinds import KINDS, words
from tpuserve.ops_error import EXIT_USAGE, OpsError
from tpuserve.settings import Deployment
from tpuserve.settings.loader import CONFIG_SEPARATOR
from tpuserve.tune import chart, halving, result
from tpuserve.tune import state as state_file
from tpuserve.tune.candidates import (
    NAMES,
    Candidate,
    Refused,
    Space,
    by_id,
    space,
    speculative_value,
)
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TuneState
from tpuserve.tune.workload import Workload


def refuse_fleet(d: Deployment) -> None:
    """Tuning patches one node in place; GKE rolls the fleet's replicas itself."""
    if d.kind.on_gke:
        vms = words(tuple(k.name for k in KINDS if not k.on_gke))
        raise OpsError(f"tune {d.name}: GKE rolls the fleet's replicas, so no node can be "
                       f"tuned in place; tune a {vms} node with the same model and chip",
                       exit_code=EXIT_USAGE)


def constraints(d: Deployment, **given: float | None) -> Constraints:
    """The command's options, each falling back to the [tune] key of its name."""
    return Constraints(**{k: v if v is not None else getattr(d.tune, k)
                          for k, v in given.items()})


def state_path(stack: str, environ: Mapping[str, str] | None = None) -> Path:
    """.tpuserve/tune-STACK.json beside the config: the last TPUSERVE_CONFIG file's
    directory (the user's own), else the working directory."""
    env = os.environ if environ is None else environ
    files = [p for p in env.get(CONFIG_ENV, "").split(CONFIG_SEPARATOR) if p]
    where = Path(files[-1]).resolve().parent if files else Path.cwd()
    return where / ".tpuserve" / f"tune-{stack}.json"


def price(d: Deployment) -> tuple[float, str]:
    """The $/hour every run's $/M is taken at, and where it comes from."""
    return d.usd_per_hour, f"[pricing] {d.price_key} x {d.tpu.chips} chip(s)"


def fingerprint(sp: Space, workload: Workload, limits: Constraints, base_reps: int,
                usd_per_hour: tuple[float, str]) -> str:
    """Of what makes two runs comparable: the candidates, the workload, the constraints, the
    schedule and the price their $/M is taken at (with its source)."""
    doc = {"candidates": [c.id for c in sp.candidates], "workload": workload.to_json(),
           "limits": limits.to_json(), "base_reps": base_reps, "eta": halving.ETA,
           "usd_per_hour": list(usd_per_hour)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass
class Prepared:
    space: Space
    candidates: dict[str, Candidate]
    state: TuneState
    path: Path
    resumed: bool


def prepare(d: Deployment, raw: Mapping[str, Any], workload: Workload, limits: Constraints,
            base_reps: int, path: Path, *, fresh: bool,
            render: Callable[[Deployment], str] | None = None) -> Prepared:
    """The search from the config, or the saved one to resume. RENDER (the boot script of a
    deployment, as the node driver renders it) says which script the end restores: a fresh
    search saves its sha256 (the CLI then checks the node holds exactly it), and a resume is
    refused when the config renders another one now (an edit since the search started): the
    end would put a script on the node that Terraform never deployed."""
    if render is None:
        from tpuserve.render.boot_script import render_startup as render
    try:
        sp = space(d, raw)
    except ValueError as exc:
        raise OpsError(f"tune {d.name}: {exc}", exit_code=EXIT_USAGE) from None
    sp = fit_workload(sp, workload)
    if not sp.candidates:
        raise OpsError(f"tune {d.name}: every candidate is refused by the settings, the "
                       f"planner or the workload ({_refusals(d, sp)})", exit_code=EXIT_USAGE)
    usd = price(d)
    fp = fingerprint(sp, workload, limits, base_reps, usd)
    try:
        old = None if fresh else state_file.load(path)
    except ValueError as exc:
        raise OpsError(f"{exc}; remove it or pass --fresh", exit_code=EXIT_USAGE) from None
    if old is not None and old.stack == d.name:
        _check_same_price(old, usd, path)
    if old is not None and (old.fingerprint != fp or old.stack != d.name):
        raise OpsError(f"{path}: the saved search had other candidates, workload or "
                       "constraints; rerun it with the same ones to resume, or pass --fresh "
                       "to start over", exit_code=EXIT_USAGE)
    now = hashlib.sha256(render(d).encode()).hexdigest()
    if old is not None:
        _check_same_script(old, now, path)
        _check_ids(old, by_id(sp.candidates), path)
        return Prepared(sp, by_id(sp.candidates), old, path, True)
    ids = [c.id for c in sp.candidates]
    st = TuneState(d.name, fp, at_rung=list(ids), pending=list(ids), terraform_sha256=now,
                   usd_per_hour=usd[0], price_source=usd[1])
    return Prepared(sp, by_id(sp.candidates), st, path, False)


def longest_request(workload: Workload) -> tuple[int, str]:
    """The most tokens one request of the workload holds (prompt + output), in words."""
    if workload.trace:
        p, o = max(workload.trace, key=sum)
        return p + o, f"the trace's longest request, {p} + {o} tokens"
    top = max(workload.contexts)
    return top + workload.output_tokens, (f"the longest context, {top} + "
                                          f"{workload.output_tokens} output tokens")


def fit_workload(sp: Space, workload: Workload) -> Space:
    """The space without the candidates whose max_model_len cannot hold the workload's longest
    request (the benchmark could not run it); each such length listed refused, once."""
    need, words_ = longest_request(workload)
    short = sorted({c.as_dict["max_model_len"] for c in sp.candidates
                    if c.as_dict["max_model_len"] < need})
    if not short:
        return sp
    refused = [Refused(f"max_model_len = {n}", f"holds {n} tokens, fewer than {words_} "
                       f"({need}): the benchmark could not run it") for n in short]
    kept = tuple(c for c in sp.candidates if c.as_dict["max_model_len"] >= need)
    return Space(kept, (*sp.refused, *refused), sp.baseline)


def _refusals(d: Deployment, sp: Space, most: int = 3) -> str:
    """Why: the refusals of the values the [tune] table gave first (up to MOST), else of the
    planner's values; a note on what was not tried (`... above N`) only when nothing else."""
    given = {f"{n} = {speculative_value(v) if n == 'speculative_config' else v}"
             for n in NAMES if (vs := getattr(d.tune, n)) is not None for v in vs}
    real = [r for r in sp.refused if not r.what.startswith("max_model_len above")]
    picked = [r for r in real if r.what in given] or real or list(sp.refused)
    if not picked:
        return "no values"
    more = len(sp.refused) - min(most, len(picked))
    return "; ".join(f"{r.what}: {r.reason}" for r in picked[:most]) + (
        f"; {more} more refused" if more else "")


def _check_same_price(old: TuneState, usd: tuple[float, str], path: Path) -> None:
    """Resume only at the price the saved runs' $/M were taken at: one search's $/M at two
    prices would rank its candidates on the price change, not on what was measured."""
    if old.usd_per_hour is None:
        raise OpsError(f"{path}: saved by an earlier tuner that did not record the price its "
                       "$/M were taken at, so a resume could mix two prices; pass --fresh to "
                       "start over", exit_code=EXIT_USAGE)
    if (old.usd_per_hour, old.price_source) != usd:
        was, now = f"{old.usd_per_hour:g}", f"{usd[0]:g}"
        if was == now and old.usd_per_hour != usd[0]:  # apart past %g's 6 digits
            was, now = repr(old.usd_per_hour), repr(usd[0])
        raise OpsError(f"{path}: the price changed from ${was}/hour "
                       f"({old.price_source}) to ${now}/hour ({usd[1]}) since this search "
                       "started, and its $/M would mix the two; restore the price to resume, "
                       "or pass --fresh to start over", exit_code=EXIT_USAGE)


def _check_ids(old: TuneState, candidates: Mapping[str, Candidate], path: Path) -> None:
    """Every id the saved state names is one of the search's candidates (or Terraform's)."""
    named = [("node_on", old.node_on), ("last_good", old.last_good),
             *(("at_rung", i) for i in old.at_rung), *(("pending", i) for i in old.pending),
             *(("runs", i) for i in old.runs)]
    for key, cid in named:
        if cid not in candidates and not (key in ("node_on", "last_good")
                                          and cid == state_file.TERRAFORM):
            raise OpsError(f"{path}: not a tune state file of this search ({key} names "
                           f"{cid[:80]!r}, not one of its candidates); remove it or pass "
                           "--fresh", exit_code=EXIT_USAGE)


def _check_same_script(old: TuneState, now: str, path: Path) -> None:
    """Resume only while the config renders the script the search started from (fail closed:
    a state that did not record it cannot prove it)."""
    if old.terraform_sha256 is None:
        raise OpsError(f"{path}: saved by an earlier tuner that did not record the "
                       "startup-script the node held when the search started, so its end "
                       "could not prove it restores that script; pass --fresh to start over",
                       exit_code=EXIT_USAGE)
    if old.terraform_sha256 != now:
        raise OpsError(f"{path}: the config now renders another startup-script (sha256 "
                       f"{now[:12]}) than the node held when this search started "
                       f"({old.terraform_sha256[:12]}): its end would put on the node a script "
                       "Terraform never deployed; undo the config change to resume, or deploy "
                       "it and pass --fresh", exit_code=EXIT_USAGE)


def check_outputs(stack: str, out_dir: Path, overlay_path: Path | None) -> None:
    """Before anything boots: --out is a directory or can be made one, --write is not a
    directory and its folder is writable or can be made (the search's outputs would otherwise
    be lost after the node time is paid)."""
    stem = f"tune-{stack}"
    if overlay_path is not None:
        if overlay_path.is_dir():
            _refuse("--write", overlay_path, "is a directory; give the overlay file's path")
        _creatable("--write", overlay_path, overlay_path.parent)
    if out_dir.exists() and not out_dir.is_dir():
        _refuse("--out", out_dir, "exists and is not a directory")
    _creatable("--out", out_dir, out_dir)
    names = ["report.md", "pareto.png"] + ([] if overlay_path else ["overlay.toml"])
    for name in names:
        if (out_dir / f"{stem}-{name}").is_dir():
            _refuse("--out", out_dir, f"{out_dir / f'{stem}-{name}'} is a directory")


def _creatable(flag: str, value: Path, folder: Path) -> None:
    p = folder.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        _refuse(flag, value, f"{p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        _refuse(flag, value, f"{p} is not writable")


def _refuse(flag: str, value: Path, why: str) -> None:
    raise OpsError(f"{flag} {value}: {why}; nothing was booted", exit_code=EXIT_USAGE)


@contextmanager
def locked(path: Path) -> Iterator[Path]:
    """An exclusive lock on STATE.lock beside the state file for the whole run: a second tune
    of the stack would drive the same node and write the same state."""
    lock = path.with_name(path.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fh = lock.open("a", encoding="utf-8")
    except OSError as exc:
        raise OpsError(f"{lock}: cannot open the tune lock file ({exc.strerror or exc})",
                       exit_code=EXIT_USAGE) from None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise OpsError(f"{lock}: another `tpuserve tune` holds this lock on the search "
                           f"in {path.name}; wait for it to end (or stop it) before starting "
                           "another, nothing was booted", exit_code=EXIT_USAGE) from None
        yield lock


def write_outputs(summary: result.Summary, prep: Prepared, out_dir: Path,
                  overlay_path: Path | None) -> dict[str, str]:
    """The report and chart in out_dir, the overlay at --write (or out_dir) when a config
    was chosen; each written whole (a temporary file renamed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    stem = f"tune-{summary.stack}"
    pts = result.points(prep.state)
    png = chart.write(out_dir / f"{stem}-pareto.png", {k: v[:2] for k, v in pts.items()},
                      set(result.pareto_set(prep.state)), summary.best)
    written["chart"] = str(png)
    if summary.best is not None:
        text = result.overlay_toml(summary, prep.candidates[summary.best], prep.state,
                                   prep.candidates)
        target = overlay_path or out_dir / f"{stem}-overlay.toml"
        _write(target, text)
        written["overlay"] = str(target)
    report = out_dir / f"{stem}-report.md"
    _write(report, result.report_md(summary, prep.state, prep.candidates, prep.space.refused,
                                    png.name))
    written["report"] = str(report)
    return written


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
