"""The user's own measured profiles: what `tpuserve tune` measured and refused on a node, per
(model, accelerator, image digest), read from the directory `[capacity] profiles_dir` names.

A profile file (`tune/record.py` writes them) is TOML:

    version = 2
    model = "google/gemma-4-E2B-it"
    accelerator = "v5litepod-1"
    image = "vllm/vllm-tpu:nightly"      # the reference the tuned config named
    image_digest = "sha256:<64 hex>"     # the build its boots ran (their `image` phase)
    [[measured]]      # a tune run's chosen config, with its figures
    date = "2026-12-02"; node = "tpuserve-spot"; stack = "spot"; candidate = "b8192 ..."
    workload = "..."; usd_per_m = 0.0121; tok_s = 2210.5; boot_s = 702.0; cache = "cold"
    trace = false     # true: a replayed trace, whose cells are no context x clients cell
    values = { "vllm.max_num_batched_tokens" = 8192, ... }
    [[measured.cells]]   # one per workload cell, as `bench` reports it
    context = 1024; clients = 16; output_tokens = 256; tok_s = 1210.5; ttft_p90_ms = 410.0
    tpot_p50_ms = 12.5; tok_s_cv = 0.012; reps = 4     # tpot and cv absent when unknown
    [[refusals]]      # a config that failed to boot there, with its error
    date = "..."; node = "..."; candidate = "..."; error = "..."
    values = { "vllm.gpu_memory_utilization" = 0.94, ... }  # its combination (no workers)

A tag is no identity (nightly moves), so a measurement counts only for a deployment whose
`vllm.image` pins the same digest (`repo[:tag]@sha256:...`); a tag-only image gets one line
saying a tuned profile exists and the pin that would use it. A refusal is a validator for its
digest, and for a tag-only image of the same repository and tag (it may still pull the build
that failed: fail closed). A file that is not this shape, version 1 (keyed on a tag) included,
is a problem of the config (a refusal that cannot be read is not taken as no refusal).
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

VERSION = 2
SOURCE = "tpuserve tune"
MAX_FILES = 256
MAX_BYTES = 1 << 20
MAX_CELLS = 64
_CTRL = re.compile(r"[\x00-\x1f\x7f]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SETTING = re.compile(r"vllm\.(env\.)?[A-Za-z_][A-Za-z0-9_]{0,63}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
CACHE_WORDS = ("cold", "warm", "unknown")
Scalar = int | float | str | bool


@dataclass(frozen=True)
class Cell:
    """One workload cell of a measurement, as `bench` reported it."""

    context: int
    clients: int
    output_tokens: int
    tok_s: float
    ttft_p90_ms: float
    tpot_p50_ms: float | None
    tok_s_cv: float | None
    reps: int

    @property
    def key(self) -> str:
        return f"{self.context}x{self.clients}"


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
    cache: str = "unknown"  # the boot's compile cache: cold, warm (or unknown)
    trace: bool = False  # a replayed trace: its cells are clients levels, not contexts
    cells: tuple[Cell, ...] = ()


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
    image: str  # the reference the tuned config named (what a pin keeps of it)
    image_digest: str  # the build the boots ran: the key
    measured: tuple[Measured, ...] = ()
    refusals: tuple[Refusal, ...] = ()


def one_line(text: str, limit: int = 300) -> str:
    """A server's or a file's text as one bounded line (hostile input)."""
    flat = _CTRL.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def pinned_digest(image: str) -> str | None:
    """The digest an image reference pins (`repo[:tag]@sha256:HEX`), None for a tag alone."""
    _name, at, digest = image.rpartition("@")
    return digest if at and DIGEST.fullmatch(digest) else None


def unpinned(image: str) -> str:
    """The reference without its digest: `repo[:tag]`."""
    return image.rpartition("@")[0] if pinned_digest(image) else image


def pin(image: str, digest: str) -> str:
    """The reference pinned to DIGEST, its tag kept (docker pulls the digest, the tag reads)."""
    return f"{unpinned(image)}@{digest}"


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v or len(v) > 2000:
        raise ValueError(f"{where}: {key} must be a non-empty string")
    return v


def _num(doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False,
         integer: bool = False) -> Any:
    v = doc.get(key)
    if v is None and optional:
        return None
    kinds = (int,) if integer else (int, float)
    if type(v) not in kinds or not 0 <= v < 1e12:
        raise ValueError(f"{where}: {key} must be a {'whole ' if integer else ''}number >= 0")
    return v if integer else float(v)


def _date(doc: Mapping[str, Any], where: str) -> str:
    v = _str(doc, "date", where)
    if not _DATE.fullmatch(v):
        raise ValueError(f"{where}: date = {one_line(v, 40)!r} must be YYYY-MM-DD")
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


def _cells(doc: Mapping[str, Any], where: str) -> tuple[Cell, ...]:
    raw = doc.get("cells", [])
    if not isinstance(raw, list) or len(raw) > MAX_CELLS:
        raise ValueError(f"{where}: cells must be a list of at most {MAX_CELLS} tables")
    out = []
    for i, c in enumerate(raw):
        w = f"{where}.cells[{i}]"
        if not isinstance(c, Mapping):
            raise ValueError(f"{w} must be a table")
        out.append(Cell(_num(c, "context", w, integer=True), _num(c, "clients", w, integer=True),
                        _num(c, "output_tokens", w, integer=True), _num(c, "tok_s", w),
                        _num(c, "ttft_p90_ms", w), _num(c, "tpot_p50_ms", w, optional=True),
                        _num(c, "tok_s_cv", w, optional=True), _num(c, "reps", w, integer=True)))
        if out[-1].clients < 1 or out[-1].reps < 1:
            raise ValueError(f"{w}: clients and reps must be at least 1")
    return tuple(out)


def _measured(m: Any, where: str) -> Measured:
    if not isinstance(m, Mapping):
        raise ValueError(f"{where} must be a table")
    cache = m.get("cache", "unknown")
    if cache not in CACHE_WORDS or type(m.get("trace", False)) is not bool:
        raise ValueError(f"{where}: cache must be one of {', '.join(CACHE_WORDS)} and trace "
                         "a boolean")
    return Measured(_date(m, where), _str(m, "node", where), _str(m, "stack", where),
                    _str(m, "candidate", where), _str(m, "workload", where),
                    _num(m, "usd_per_m", where), _num(m, "tok_s", where),
                    _num(m, "boot_s", where), _values(m, where, empty_ok=True), cache,
                    m.get("trace", False), _cells(m, where))


def parse(path: Path, text: str) -> LearnedProfile:
    """One profile file; ValueError (one line naming the file and the key) when not the shape."""
    where = str(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not TOML ({one_line(str(exc), 120)})") from None
    if doc.get("version") == 1:
        raise ValueError(f"{where}: version 1 keys its figures on the image tag, which names no "
                         "build (a tag moves): re-run `tpuserve tune` to record them per image "
                         f"digest (version {VERSION}), or remove the file")
    if doc.get("version") != VERSION:
        raise ValueError(f"{where}: version must be {VERSION}")
    extra = set(doc) - {"version", "model", "accelerator", "image", "image_digest", "measured",
                        "refusals"}
    if extra:
        raise ValueError(f"{where}: unknown key(s) {one_line(', '.join(sorted(extra)), 120)}")
    digest = _str(doc, "image_digest", where)
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"{where}: image_digest must be sha256:<64 hex>")
    for key in ("measured", "refusals"):
        if not isinstance(doc.get(key, []), list):
            raise ValueError(f"{where}: {key} must be a list of tables")
    measured = [_measured(m, f"{where}: measured[{i}]")
                for i, m in enumerate(doc.get("measured", []))]
    refusals = []
    for i, r in enumerate(doc.get("refusals", [])):
        w = f"{where}: refusals[{i}]"
        if not isinstance(r, Mapping):
            raise ValueError(f"{w} must be a table")
        refusals.append(Refusal(_date(r, w), _str(r, "node", w), _str(r, "candidate", w),
                                one_line(_str(r, "error", w)), _values(r, w, empty_ok=False)))
    return LearnedProfile(path, _str(doc, "model", where), _str(doc, "accelerator", where),
                          _str(doc, "image", where), digest, tuple(measured), tuple(refusals))


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
    """(model, accelerator, image reference) of a deployment; the digest is its boots'."""
    return d.vllm.model, d.tpu.accelerator_type, d.vllm.image


def _of_pair(d: Deployment) -> tuple[list[LearnedProfile], list[str]]:
    """The profiles of the deployment's (model, accelerator), any digest, and the problems."""
    directory = d.capacity.profiles_dir_path
    if directory is None:
        return [], []
    profiles, problems = read_dir(directory)
    return [p for p in profiles if (p.model, p.accelerator) == key_of(d)[:2]], problems


def for_deployment(d: Deployment) -> tuple[list[LearnedProfile], list[str]]:
    """The profiles whose figures count for the deployment: its image pins their digest."""
    profiles, problems = _of_pair(d)
    digest = pinned_digest(d.vllm.image)
    return [p for p in profiles if digest is not None and p.image_digest == digest], problems


def refusals_apply(p: LearnedProfile, d: Deployment) -> bool:
    """Its digest pinned, or a tag-only image of the profile's repository and tag (fail closed:
    that tag may still pull the build that failed)."""
    digest = pinned_digest(d.vllm.image)
    return p.image_digest == digest if digest else unpinned(p.image) == d.vllm.image


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
            f"{one_line(unpinned(p.image), 200)}@{p.image_digest}): {r.error}; a refusal "
            f"learned by {SOURCE} ({p.path}): choose another value, or remove the refusal from "
            "that file to try it again")


def learned_problems(d: Deployment) -> list[str]:
    """The unreadable profile files, and a line per learned refusal the deployment holds."""
    profiles, problems = _of_pair(d)
    for p in profiles:
        if refusals_apply(p, d):
            for r in p.refusals:
                if all(value_of(d, k) == v for k, v in r.values.items()):
                    problems.append(refusal_line(p, r))
    return problems


def newest(profiles: list[LearnedProfile]) -> tuple[Measured, LearnedProfile] | None:
    runs = sorted(((m, p) for p in profiles for m in p.measured), key=lambda mp: mp[0].date)
    return runs[-1] if runs else None


def learned_notes(d: Deployment) -> list[str]:
    """One line when a tuned profile of the deployment's (model, accelerator) exists for a
    digest its image does not pin: its figures are not this deployment's until pinned."""
    profiles, _problems = _of_pair(d)
    found = newest([p for p in profiles if p.image_digest != pinned_digest(d.vllm.image)])
    if found is None:
        return []
    m, p = found
    now = ("pins another digest" if pinned_digest(d.vllm.image) else
           "is a tag, which names no build")
    return [(f"vllm.image = {one_line(d.vllm.image, 200)!r} {now}: a tuned profile exists for "
             f"image digest {p.image_digest} ({m.date}, node {m.node}; {p.path}); pin "
             f"vllm.image = {pin(d.vllm.image, p.image_digest)!r} to use its measurements "
             "(deploying tune's overlay does)")]
