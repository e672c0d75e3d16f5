"""The user's own measured profiles: what `tpuserve tune` measured and refused on a node, per
(model, accelerator, image), read from the directory `[capacity] profiles_dir` names.

A profile file (`tune/record.py` writes them) is TOML:

    version = 1
    model = "google/gemma-4-E2B-it"
    accelerator = "v5litepod-1"
    image = "vllm/vllm-tpu:nightly"
    [[measured]]      # a tune run's chosen config, with its figures
    date = "2026-12-02"; node = "tpuserve-spot"; stack = "spot"; candidate = "b8192 ..."
    workload = "..."; usd_per_m = 0.0121; tok_s = 2210.5; boot_s = 702.0
    values = { "vllm.max_num_batched_tokens" = 8192, ... }
    [[refusals]]      # a config that failed to boot there, with its error
    date = "..."; node = "..."; candidate = "..."; error = "..."
    values = { "vllm.gpu_memory_utilization" = 0.94 }   # what it changed from the stack's

A later `plan` cites the newest measurement for the deployment's own (model, accelerator,
image) as `sources.tuned`; every refusal for that key is a validator: a deployment holding all
of a refusal's values is refused in one line naming them, the failed boot and its date. A file
that is not this shape is a problem of the config (fail closed: a refusal that cannot be read
is not taken as no refusal).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuserve.settings.deployment import Deployment

VERSION = 1
SOURCE = "tpuserve tune"
MAX_FILES = 256
MAX_BYTES = 1 << 20
_CTRL = re.compile(r"[\x00-\x1f\x7f]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SETTING = re.compile(r"vllm\.(env\.)?[A-Za-z_][A-Za-z0-9_]{0,63}")
Scalar = int | float | str | bool


@dataclass(frozen=True)
class Measured:
    date: str
    node: str
    stack: str
    candidate: str
    workload: str
    usd_per_m: float
    tok_s: float
    boot_s: float
    values: Mapping[str, Scalar]


@dataclass(frozen=True)
class Refusal:
    date: str
    node: str
    candidate: str
    error: str
    values: Mapping[str, Scalar]  # the settings the failed config changed, and their values


@dataclass(frozen=True)
class LearnedProfile:
    path: Path
    model: str
    accelerator: str
    image: str
    measured: tuple[Measured, ...] = ()
    refusals: tuple[Refusal, ...] = ()


def one_line(text: str, limit: int = 300) -> str:
    """A server's or a file's text as one bounded line (hostile input)."""
    flat = _CTRL.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v or len(v) > 2000:
        raise ValueError(f"{where}: {key} must be a non-empty string")
    return v


def _num(doc: Mapping[str, Any], key: str, where: str) -> float:
    v = doc.get(key)
    if type(v) not in (int, float):
        raise ValueError(f"{where}: {key} must be a number")
    return float(v)


def _date(doc: Mapping[str, Any], where: str) -> str:
    v = _str(doc, "date", where)
    if not _DATE.fullmatch(v):
        raise ValueError(f"{where}: date = {v!r} must be YYYY-MM-DD")
    return v


def _values(doc: Mapping[str, Any], where: str, *, empty_ok: bool) -> dict[str, Scalar]:
    v = doc.get("values")
    if not isinstance(v, Mapping) or (not v and not empty_ok):
        raise ValueError(f"{where}: values must be a non-empty table of settings")
    out: dict[str, Scalar] = {}
    for k, x in v.items():
        if not _SETTING.fullmatch(k) or type(x) not in (int, float, str, bool):
            raise ValueError(f"{where}: values.{one_line(str(k), 80)} must name a [vllm] "
                             "setting with a number, string or boolean")
        out[k] = x
    return out


def parse(path: Path, text: str) -> LearnedProfile:
    """One profile file; ValueError (one line naming the file and the key) when not the shape."""
    where = str(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not TOML ({one_line(str(exc), 120)})") from None
    if doc.get("version") != VERSION:
        raise ValueError(f"{where}: version must be {VERSION}")
    extra = set(doc) - {"version", "model", "accelerator", "image", "measured", "refusals"}
    if extra:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
    measured, refusals = [], []
    for i, m in enumerate(doc.get("measured", [])):
        w = f"{where}: measured[{i}]"
        if not isinstance(m, Mapping):
            raise ValueError(f"{w} must be a table")
        measured.append(Measured(_date(m, w), _str(m, "node", w), _str(m, "stack", w),
                                 _str(m, "candidate", w), _str(m, "workload", w),
                                 _num(m, "usd_per_m", w), _num(m, "tok_s", w),
                                 _num(m, "boot_s", w), _values(m, w, empty_ok=True)))
    for i, r in enumerate(doc.get("refusals", [])):
        w = f"{where}: refusals[{i}]"
        if not isinstance(r, Mapping):
            raise ValueError(f"{w} must be a table")
        refusals.append(Refusal(_date(r, w), _str(r, "node", w), _str(r, "candidate", w),
                                one_line(_str(r, "error", w)), _values(r, w, empty_ok=False)))
    return LearnedProfile(path, _str(doc, "model", where), _str(doc, "accelerator", where),
                          _str(doc, "image", where), tuple(measured), tuple(refusals))


def read_dir(directory: Path) -> tuple[list[LearnedProfile], list[str]]:
    """Every profile in the directory (*.toml), and one problem per file that is not one."""
    if not directory.exists():  # nothing recorded yet: tune creates it when it records
        return [], []
    if not directory.is_dir():
        return [], [f"capacity.profiles_dir = {str(directory)!r}: not a directory"]
    files = sorted(directory.glob("*.toml"))
    if len(files) > MAX_FILES:
        return [], [f"capacity.profiles_dir = {str(directory)!r}: more than {MAX_FILES} files"]
    out, problems = [], []
    for f in files:
        try:
            if f.stat().st_size > MAX_BYTES:
                raise ValueError(f"{f}: larger than {MAX_BYTES} bytes")
            out.append(parse(f, f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"capacity.profiles_dir: {f} cannot be read ({one_line(str(exc))})")
        except ValueError as exc:
            problems.append(f"capacity.profiles_dir: {exc}")
    return out, problems


def key_of(d: Deployment) -> tuple[str, str, str]:
    return d.vllm.model, d.tpu.accelerator_type, d.vllm.image


def for_deployment(d: Deployment) -> tuple[list[LearnedProfile], list[str]]:
    """The profiles of the deployment's own (model, accelerator, image), and the problems."""
    directory = d.capacity.profiles_dir_path
    if directory is None:
        return [], []
    profiles, problems = read_dir(directory)
    return [p for p in profiles if (p.model, p.accelerator, p.image) == key_of(d)], problems


def value_of(d: Deployment, setting: str) -> Scalar | None:
    """A [vllm] setting's value as a profile stores it: an unset cap "unset", a speculative
    config its sorted JSON ("off" for none)."""
    path = setting.split(".")[1:]
    obj: Any = d.vllm
    for name in path:
        obj = getattr(obj, name, None)
    if path == ["max_num_seqs"] and obj is None:
        return "unset"
    if path == ["speculative_config"]:
        return "off" if not obj else json.dumps(obj, sort_keys=True)
    return obj


def _shown(value: Scalar) -> str:
    return json.dumps(value) if isinstance(value, str | bool) else f"{value:g}" \
        if isinstance(value, float) else str(value)


def refusal_line(p: LearnedProfile, r: Refusal) -> str:
    held = " with ".join(f"{k} = {_shown(v)}" for k, v in r.values.items())
    return (f"{held}: failed to boot on node {r.node} on {r.date} ({p.model}, {p.accelerator}, "
            f"{p.image}): {r.error}; a refusal learned by {SOURCE} ({p.path}): choose another "
            "value, or remove the refusal from that file to try it again")


def learned_problems(d: Deployment) -> list[str]:
    """The unreadable profile files, and a line per learned refusal the deployment holds."""
    profiles, problems = for_deployment(d)
    for p in profiles:
        for r in p.refusals:
            if all(value_of(d, k) == v for k, v in r.values.items()):
                problems.append(refusal_line(p, r))
    return problems


def learned_sources(d: Deployment) -> dict[str, str]:
    """`plan`'s `tuned` source: the newest measurement of the deployment's own key, if any."""
    profiles, _problems = for_deployment(d)
    runs = sorted(((m, p) for p in profiles for m in p.measured), key=lambda mp: mp[0].date)
    if not runs:
        return {}
    m, p = runs[-1]
    return {"tuned": (f"measured by {SOURCE} on {m.date}, node {m.node}: candidate "
                      f"{m.candidate!r}, {m.tok_s:,.1f} tok/s, ${m.usd_per_m:.4f}/M output "
                      f"tokens, boot {m.boot_s:.0f} s ({m.workload}; {p.path})")}
