"""Plan reviews: what a change does to each stack, as Markdown for a pull-request comment.

`review BASE [HEAD]` compares two revisions of the repository (HEAD defaults to the working
tree) three ways:

1. Terraform. Each revision is synthesized offline with ITS OWN main.py, stacks and templates:
   a git worktree for a commit, then a subprocess of the current venv's python with PYTHONPATH
   and cwd set to that tree, writing into a temporary outdir. Resources are compared by
   Terraform address (type.name), attribute by attribute.
2. The `vllm serve` argv, the container env and the compile-cache key, and
3. capacity and cost (the planner, SPEC 5-7). These come from each revision's config/ TOML
   files loaded with the CURRENT code: config is data, so today's validators and planner
   judge both revisions alike and a delta is the effect of the config change. When an old
   config fails today's validation, its problems are reported in the Markdown instead.

Both revisions' code RUNS here (main.py and everything it imports). The synth subprocess gets
a throwaway HOME and TMPDIR, an allow-listed environment (locale, the two config variables,
the jsii knobs, a PATH of the directories that hold sh, node and terraform) and stdin closed:
no token, no GOOGLE_APPLICATION_CREDENTIALS or CLOUDSDK_CONFIG, no agent socket, and no
~/.config/gcloud reachable through HOME. It still runs as the calling user, so a file named by
its absolute path stays readable: review an untrusted revision where no credential lives
(the pull-request workflow, a container). `redact` masks anything token-shaped in everything
this module writes.

The pure core is `build_review` (facts in, Review out) and `render_markdown`; the I/O lives
in `checkout`, `synthesize`, `config_facts` and `review`.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tpuserve.paths import REPO_ROOT
from tpuserve.plan_gate import unique_keys
from tpuserve.planner.arithmetic import COLD_START_S, WARM_START_S, GiB, Plan
from tpuserve.render.boot_script import vllm_command
from tpuserve.render.vllm_args import compile_cache_key, container_env
from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.flag_rules import MODEL_ARG, rule_for
from tpuserve.settings.loader import all_warnings
from tpuserve.settings.sections import CapacitySettings

# The first line of every review: the workflow finds its one comment by it.
MARKER = "<!-- tpuserve-plan-review -->"
WORKING_TREE = "working tree"
# What a synthesis reads; the digest of these names a synthesis in the memo.
SYNTH_INPUTS = ("main.py", "cdktf.json", "stacks", "tpuserve", "templates", "config")
SYNTH_TIMEOUT_S = 600.0
# SPEC 7 quotes $/M output tokens at these (context, clients) cells.
SPEC7_CELLS = ((128, 64), (1024, 64), (1024, 16), (8192, 16), (128, 1))
# GitHub rejects comments over 65,536 characters; attachments are cut to stay under.
COMMENT_LIMIT = 65_000
# Variables the synth subprocess may see; nothing else (no tokens, no cloud credentials, no
# HOME, USER or agent sockets): an allow-list, so a new credential variable is dropped too.
_PASS_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TPUSERVE_PROJECT", "TPUSERVE_ZONE",
             "TPUSERVE_CDK_IMPORT", "JSII_RUNTIME", "JSII_RUNTIME_PACKAGE_CACHE")
# What synth runs by name: node (jsii) and terraform (cdktf's `terraform version` check); sh
# and the coreutils live in the system directories.
_SYNTH_PROGRAMS = ("node", "terraform")
_SYSTEM_PATH = ("/usr/bin", "/bin")

Action = Literal["added", "removed", "changed"]
_NON_RESOURCE = ("data", "output", "provider", "terraform", "locals", "variable", "module")
Status = Literal["added", "removed", "changed", "unchanged"]


class ReviewError(Exception):
    """A review that cannot start (bad revision, not a git repository): one line."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

# --------------------------------------------------------------------------- redaction

_TOKEN_SHAPES = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
               re.DOTALL),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),  # OpenAI-style API keys
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API key
    re.compile(r"\bya29\.[0-9A-Za-z_.-]{10,}"),  # Google OAuth access token
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bxox[abprs]-[0-9A-Za-z-]{10,}"),  # Slack
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
)
# NAME=value / NAME: value where NAME says it holds a secret (HF_TOKEN=..., "password": ...).
_ASSIGNED = re.compile(
    r"""(?P<name>\b[A-Z][A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)\b"""
    r"""|"[a-z_]*(?:token|secret|password|api_key|private_key)")"""
    r"""(?P<sep>\s*[=:]\s*)(?P<q>["']?)(?P<value>(?![/$<{])[^\s"']{8,})"""
)
REDACTED = "[REDACTED]"


def redact(text: str) -> str:
    """Mask anything token-shaped. Defensive: the stacks and configs hold no secret."""
    for shape in _TOKEN_SHAPES:
        text = shape.sub(REDACTED, text)
    return _ASSIGNED.sub(lambda m: f"{m['name']}{m['sep']}{m['q']}{REDACTED}", text)


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class StackFacts:
    """What the current code derives from one revision's config for one stack."""

    name: str
    provisioning_model: str
    image: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cache_key: str
    cache_enabled: bool
    plan: Plan | None
    plan_error: str | None
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class ConfigFacts:
    stacks: Mapping[str, StackFacts]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Synthesis:
    """One revision synthesized by its own code: {stack: cdk.tf.json}, or why it failed."""

    stacks: Mapping[str, Mapping[str, Any]]
    error: str | None = None


@dataclass(frozen=True)
class RevisionFacts:
    label: str  # as the user named it, or "working tree"
    commit: str | None  # full SHA; None for the working tree
    synthesis: Synthesis
    config: ConfigFacts

    @property
    def title(self) -> str:
        if self.commit is None:
            return self.label
        if self.commit.startswith(self.label):  # a SHA: shorten it
            return self.commit[:12]
        return f"{self.label} ({self.commit[:12]})"


# --------------------------------------------------------------------------- review model


@dataclass(frozen=True)
class AttributeChange:
    path: str
    old: Any = MISSING
    new: Any = MISSING

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.old is not MISSING:
            out["old"] = self.old
        if self.new is not MISSING:
            out["new"] = self.new
        return out


@dataclass(frozen=True)
class ResourceChange:
    address: str
    action: Action
    attributes: tuple[AttributeChange, ...] = ()

    @property
    def kind(self) -> str:
        """resource, data, output, provider, terraform, ...: only resources are counted."""
        head = self.address.split(".", 1)[0]
        return head if head in _NON_RESOURCE else "resource"

    @property
    def replaces(self) -> bool:
        # terraform_data is replaced whenever triggers_replace changes.
        return self.action == "changed" and any(
            a.path.split(".")[0].startswith("triggers_replace") for a in self.attributes)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "kind": self.kind, "action": self.action,
                "replace": self.replaces,
                "attributes": [a.to_json() for a in self.attributes]}


@dataclass(frozen=True)
class FlagChange:
    """One `vllm serve` option or container variable; None means absent on that side."""

    name: str
    old: str | None
    new: str | None

    @property
    def rule(self) -> str | None:
        r = rule_for(self.name)
        return None if r is None else r.rule

    @property
    def setting(self) -> str | None:
        r = rule_for(self.name)
        return None if r is None else r.setting

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "old": self.old, "new": self.new, "setting": self.setting,
                "rule": self.rule}


@dataclass(frozen=True)
class Delta:
    """One planner quantity that differs between the revisions, formatted for a table."""

    key: str
    label: str
    old: Any
    new: Any
    old_text: str
    new_text: str
    change: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "old": _json_safe(self.old),
                "new": _json_safe(self.new), "change": self.change}


@dataclass(frozen=True)
class StackReview:
    name: str
    status: Status
    resources: tuple[ResourceChange, ...] = ()
    resources_known: bool = True  # False when a synth failed and resources were not compared
    argv: tuple[FlagChange, ...] = ()
    env: tuple[FlagChange, ...] = ()
    cache_key: tuple[str, str] | None = None  # (old, new) when it changed
    capacity: tuple[Delta, ...] = ()
    capacity_note: str | None = None  # a summary line when capacity is unchanged or one-sided
    new_warnings: tuple[str, ...] = ()
    resolved_warnings: tuple[str, ...] = ()
    head_argv: tuple[str, ...] = ()  # the whole argv of a stack new in HEAD

    def counts(self) -> dict[str, int]:
        """Managed resources only, as terraform plan counts them."""
        managed = [r for r in self.resources if r.kind == "resource"]
        return {a: sum(1 for r in managed if r.action == a)
                for a in ("added", "changed", "removed")}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "resources_compared": self.resources_known,
            "resources": [r.to_json() for r in self.resources],
            "argv": [f.to_json() for f in self.argv],
            "env": [f.to_json() for f in self.env],
            "compile_cache_key": None if self.cache_key is None else {
                "old": self.cache_key[0], "new": self.cache_key[1],
                "cold_start_s": COLD_START_S, "warm_start_s": WARM_START_S,
            },
            "capacity": [d.to_json() for d in self.capacity],
            "capacity_note": self.capacity_note,
            "new_warnings": list(self.new_warnings),
            "resolved_warnings": list(self.resolved_warnings),
            "new_stack_argv": list(self.head_argv),
        }


@dataclass(frozen=True)
class Review:
    base: str
    head: str
    stacks: tuple[StackReview, ...]
    base_problems: tuple[str, ...] = ()
    head_problems: tuple[str, ...] = ()
    base_synth_error: str | None = None
    head_synth_error: str | None = None
    attachments: tuple[tuple[str, str], ...] = ()

    def stack(self, name: str) -> StackReview:
        return next(s for s in self.stacks if s.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "head": self.head,
            "stacks": [s.to_json() for s in self.stacks],
            "base_config_problems": list(self.base_problems),
            "head_config_problems": list(self.head_problems),
            "base_synth_error": self.base_synth_error,
            "head_synth_error": self.head_synth_error,
            "attachments": [{"title": t, "text": text} for t, text in self.attachments],
        }


# --------------------------------------------------------------------------- terraform diff


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Attribute paths of a resource body: dicts by `.key`, lists of blocks by `[i]`.

    Lists of scalars stay whole (source_ranges is one value); cdktf's "//" metadata is dropped.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "//":
                continue
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out or ({prefix: {}} if prefix else {})
    if isinstance(value, list) and any(isinstance(v, Mapping) for v in value):
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def addresses(doc: Mapping[str, Any]) -> dict[str, Any]:
    """{Terraform address: body} of a synthesized cdk.tf.json."""
    out: dict[str, Any] = {}
    for kind, section in doc.items():
        if kind == "//" or not isinstance(section, Mapping):
            continue
        if kind in ("resource", "data"):
            for rtype, named in section.items():
                for name, body in named.items():
                    prefix = "data." if kind == "data" else ""
                    out[f"{prefix}{rtype}.{name}"] = body
        elif kind == "provider":
            for pname, configs in section.items():
                configs = configs if isinstance(configs, list) else [configs]
                for i, body in enumerate(configs):
                    out[f"provider.{pname}" + (f"[{i}]" if i else "")] = body
        elif kind == "terraform":
            out["terraform"] = section
        else:  # output, locals, variable, module
            for name, body in section.items():
                out[f"{kind}.{name}"] = body
    return out


def diff_documents(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> tuple[ResourceChange, ...]:
    """Added, removed and changed addresses (with changed attribute paths) of two stacks."""
    before, after = addresses(old or {}), addresses(new or {})
    changes = [ResourceChange(a, "added") for a in sorted(after.keys() - before.keys())]
    changes += [ResourceChange(a, "removed") for a in sorted(before.keys() - after.keys())]
    for address in sorted(before.keys() & after.keys()):
        a, b = flatten(before[address]), flatten(after[address])
        attrs = tuple(
            AttributeChange(path, a.get(path, MISSING), b.get(path, MISSING))
            for path in sorted(a.keys() | b.keys())
            if a.get(path, MISSING) != b.get(path, MISSING)
        )
        if attrs:
            changes.append(ResourceChange(address, "changed", attrs))
    return tuple(changes)


# --------------------------------------------------------------------------- argv / env diff


def argv_options(argv: Sequence[str]) -> dict[str, str]:
    """`vllm serve MODEL --flag value --switch` -> {"model": MODEL, "--flag": "value", ...}."""
    out: dict[str, str] = {}
    args = list(argv)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    name: str | None = None
    for token in args:
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            name = flag
            out[name] = value if eq else "on"  # a switch until a value follows
        elif name is None:
            out[MODEL_ARG] = token
        else:
            out[name] = token if out[name] == "on" else f"{out[name]} {token}"
    return out


def diff_options(old: Mapping[str, str], new: Mapping[str, str]) -> tuple[FlagChange, ...]:
    """Changed, added and removed options, in the order HEAD (then BASE) lists them."""
    names = list(new) + [n for n in old if n not in new]
    return tuple(
        FlagChange(n, old.get(n), new.get(n)) for n in names if old.get(n) != new.get(n)
    )


# --------------------------------------------------------------------------- capacity diff


def _fmt(kind: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if kind == "int":
        return f"{value:,}"
    if kind == "gib":
        return f"{value / GiB:.2f} GiB"
    if kind == "ms":
        return f"{value:.2f} ms"
    if kind == "usd4":
        return f"${value:.4f}"
    if kind == "usd3":
        return f"${value:.3f}"
    if kind == "usd0":
        return f"${value:,.0f}"
    if kind == "hours":
        return "never" if math.isinf(value) else f"{value:.1f} h"
    if kind == "bool":
        return "yes" if value else "NO"
    return str(value)


def _change(kind: str, old: Any, new: Any) -> str:
    numeric = isinstance(old, int | float) and isinstance(new, int | float)
    if not numeric or isinstance(old, bool) or kind in ("bool", "text"):
        return ""
    if any(math.isinf(x) for x in (old, new)):
        return ""
    diff = new - old
    if kind == "gib":
        text = f"{diff / GiB:+.2f} GiB"
    elif kind == "int":
        text = f"{diff:+,}"
    else:
        text = ("+" if diff >= 0 else "-") + _fmt(kind, abs(diff))
    return f"{text} ({diff / old:+.1%})" if old else text


def plan_metrics(f: StackFacts) -> list[tuple[str, str, str, Any]]:
    """(key, label, kind, value) of the quantities a reviewer compares, in table order."""
    p = f.plan
    if p is None:
        return []
    b = p.budget
    rows: list[tuple[str, str, str, Any]] = [
        ("kv_bytes_per_token", "KV bytes per token", "int", p.kv_bytes_per_token),
        ("hbm_cap_bytes", "HBM cap (gpu_memory_utilization)", "gib", b.cap_bytes),
        ("weights_bytes", "weights (measured)", "gib", b.weights_bytes),
        ("kv_pool_bytes", "KV pool", "gib", b.kv_pool_bytes),
        ("ungoverned_bytes", "outside the cap (XLA programs)", "gib", b.ungoverned_bytes),
        ("kv_tokens", "KV tokens in the pool", "int", p.kv_tokens),
        ("max_model_len", "max-model-len", "int", p.max_model_len),
        ("block_size", "block size", "int", p.block_size),
        ("num_blocks", "blocks", "int", p.num_blocks),
        ("kv_block_tokens", "tokens in blocks", "int", p.kv_block_tokens),
        ("max_model_len_fits", "one max-model-len request fits", "bool", p.max_model_len_fits),
    ]
    rows += [(f"kv_wall.{c}", f"KV wall at {c:,} tokens (clients)", "int", n)
             for c, n in p.kv_wall]
    if p.expected is not None:
        e = p.expected
        verdict = "fits" if e.fits else f"past the KV wall (max {e.max_clients} clients)"
        rows.append(("expected", f"expected load {e.clients} x {e.context:,}", "text", verdict))
    rows.append(("decode_floor_ms", "decode bandwidth floor", "ms", p.decode_floor_s * 1e3))
    cost = p.cost(f.provisioning_model)
    if cost is not None:
        rows.append(("usd_per_hour", f"$/hour ({cost.model})", "usd4", cost.usd_per_hour))
        rows.append(("usd_per_month", f"$/month ({cost.model}, {p.hours_per_month:g} h)",
                     "usd0", cost.usd_per_month))
        per_cell = {(c.context, c.clients): usd for c, usd in cost.usd_per_million_output_tokens}
        for ctx, clients in SPEC7_CELLS:
            if (ctx, clients) in per_cell:
                rows.append((f"usd_per_million.{ctx}x{clients}",
                             f"$/M output tokens, {ctx:,} ctx x {clients} clients",
                             "usd3", per_cell[(ctx, clients)]))
    if p.rebuild is not None:
        rows.append(("break_even_cold_h", "spot beats flex if preempted less than every (cold)",
                     "hours", p.rebuild.break_even_cold_hours))
        rows.append(("break_even_warm_h", "... (warm, compile cache)", "hours",
                     p.rebuild.break_even_warm_hours))
    return rows


def capacity_deltas(old: StackFacts, new: StackFacts) -> tuple[Delta, ...]:
    before = {k: (label, kind, v) for k, label, kind, v in plan_metrics(old)}
    after = {k: (label, kind, v) for k, label, kind, v in plan_metrics(new)}
    out: list[Delta] = []
    for key in [*after, *(k for k in before if k not in after)]:
        label, kind, value = after.get(key) or before[key]
        prev = before[key][2] if key in before else None
        value = after[key][2] if key in after else None
        if prev != value:
            out.append(Delta(key, label, prev, value, _fmt(kind, prev), _fmt(kind, value),
                             _change(kind, prev, value)))
    return tuple(out)


def capacity_summary(f: StackFacts) -> str:
    p = f.plan
    if p is None:
        return f"no plan: {f.plan_error}"
    text = (f"{p.kv_block_tokens:,} KV tokens ({p.num_blocks:,} blocks of {p.block_size}) at "
            f"max-model-len {p.max_model_len:,}")
    cost = p.cost(f.provisioning_model)
    cell = None if cost is None else next(
        (usd for c, usd in cost.usd_per_million_output_tokens if (c.context, c.clients) ==
         SPEC7_CELLS[0]), None)
    if cost is not None:
        text += f"; ${cost.usd_per_hour:.4f}/h ({cost.model})"
    if cell is not None:
        text += f", ${cell:.3f}/M output tokens at {SPEC7_CELLS[0][0]} x {SPEC7_CELLS[0][1]}"
    return text


# --------------------------------------------------------------------------- the review


def build_review(
    base: RevisionFacts,
    head: RevisionFacts,
    attachments: Sequence[tuple[str, str]] = (),
) -> Review:
    """Compare two revisions' facts. Pure."""
    bs, hs = base.synthesis, head.synthesis
    bc, hc = base.config, head.config
    names = list(dict.fromkeys([*hs.stacks, *hc.stacks, *bs.stacks, *bc.stacks]))
    stacks = []
    for name in names:
        # Synthesis says which stacks exist; the config says so when a synth failed.
        in_base = name in bs.stacks if bs.error is None else name in bc.stacks
        in_head = name in hs.stacks if hs.error is None else name in hc.stacks
        status: Status = "added" if not in_base else "removed" if not in_head else "changed"
        resources_known = (bs.error is None or not in_base) and (hs.error is None or not in_head)
        resources = diff_documents(bs.stacks.get(name), hs.stacks.get(name)) if (
            resources_known) else ()
        old_f, new_f = bc.stacks.get(name), hc.stacks.get(name)
        argv: tuple[FlagChange, ...] = ()
        env: tuple[FlagChange, ...] = ()
        cache_key = None
        capacity: tuple[Delta, ...] = ()
        note = None
        new_warnings: tuple[str, ...] = ()
        resolved: tuple[str, ...] = ()
        head_argv: tuple[str, ...] = ()
        if old_f is not None and new_f is not None:
            argv = diff_options({"image": old_f.image, **argv_options(old_f.argv)},
                                {"image": new_f.image, **argv_options(new_f.argv)})
            env = diff_options(old_f.env, new_f.env)
            if old_f.cache_key != new_f.cache_key and new_f.cache_enabled:
                cache_key = (old_f.cache_key, new_f.cache_key)
            if old_f.plan is not None and new_f.plan is not None:
                capacity = capacity_deltas(old_f, new_f)
            if not capacity:
                note = capacity_summary(new_f)
            new_warnings = tuple(w for w in new_f.warnings if w not in old_f.warnings)
            resolved = tuple(w for w in old_f.warnings if w not in new_f.warnings)
        elif new_f is not None:
            note = capacity_summary(new_f)
            new_warnings = new_f.warnings
            head_argv = new_f.argv
        if status == "changed" and resources_known and not (
            resources or argv or env or cache_key or capacity or new_warnings or resolved
        ):
            status = "unchanged"
        stacks.append(StackReview(
            name=name, status=status, resources=resources, resources_known=resources_known,
            argv=argv, env=env, cache_key=cache_key, capacity=capacity, capacity_note=note,
            new_warnings=new_warnings, resolved_warnings=resolved, head_argv=head_argv,
        ))
    return Review(
        base=base.title, head=head.title, stacks=tuple(stacks),
        base_problems=bc.problems, head_problems=hc.problems,
        base_synth_error=bs.error, head_synth_error=hs.error,
        attachments=tuple(attachments),
    )


# --------------------------------------------------------------------------- markdown


def _code(value: str) -> str:
    """An inline code span that survives backticks (table cells escape pipes: _row)."""
    value = value.replace("\n", " ")
    fence = "``" if "`" in value else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(*cells: str) -> str:
    """A table row; GitHub wants pipes escaped even inside code spans."""
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _is_script(value: Any) -> bool:
    return isinstance(value, str) and "\n" in value


def _short(value: Any, limit: int = 80) -> str | None:
    """A scalar or a short list as JSON, or None when too long to show inline."""
    if value is MISSING:
        return "(absent)"
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, list) and any(isinstance(v, Mapping | list) for v in value):
        return None
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= limit else None


def _attribute_line(a: AttributeChange) -> str:
    if _is_script(a.old) or _is_script(a.new):
        old_lines = a.old.splitlines() if isinstance(a.old, str) else []
        new_lines = a.new.splitlines() if isinstance(a.new, str) else []
        diff = [line for line in difflib.unified_diff(old_lines, new_lines, n=0, lineterm="")
                if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        added = sum(1 for line in diff if line.startswith("+"))
        removed = len(diff) - added
        return (f"{_code(a.path)}: the boot script changed (+{added} -{removed} lines); its "
                "`vllm serve` argv and container env diff is below")
    old, new = _short(a.old), _short(a.new)
    if old is None or new is None:
        return f"{_code(a.path)}: changed"
    return f"{_code(a.path)}: {_code(old)} → {_code(new)}"


_SYMBOL = {"added": "➕", "removed": "➖", "changed": "✏️"}  # noqa: RUF001 - Markdown badges


def _resources_md(s: StackReview) -> list[str]:
    if not s.resources_known:
        return ["**Terraform**: not compared (a synth failed; see above)", ""]
    c = s.counts()
    if not s.resources:
        return ["**Terraform**: no change", ""]
    out = [(f"**Terraform**: {c['added']} to add, {c['changed']} to change, "
           f"{c['removed']} to destroy"), ""]
    whole_stack = s.status in ("added", "removed")
    for r in s.resources:
        if whole_stack and r.kind not in ("resource", "data"):
            continue  # outputs and provider blocks come and go with the stack
        action = "changed, replaced" if r.replaces else r.action
        out.append(f"- {_SYMBOL[r.action]} {_code(r.address)} ({action})")
        out += [f"  - {_attribute_line(a)}" for a in r.attributes]
    out.append("")
    return out


def _options_md(title: str, changes: Sequence[FlagChange]) -> list[str]:
    if not changes:
        return []
    out = [f"**{title}**", "", "| option | base | head | measured rule |", "|---|---|---|---|"]
    for f in changes:
        name = _code(f.name) + (f" ({_code(f.setting)})" if f.setting else "")
        old = "(absent)" if f.old is None else _code(f.old)
        new = "(absent)" if f.new is None else _code(f.new)
        out.append(_row(name, old, new, f.rule or "no measured rule"))
    return [*out, ""]


def _stack_md(s: StackReview) -> list[str]:
    heading = {"added": "new stack", "removed": "stack removed", "changed": "changed",
               "unchanged": "unchanged"}[s.status]
    out = [f"### `{s.name}`: {heading}", ""]
    if s.status == "removed":
        out.append(f"The stack `{s.name}` is gone from HEAD: `cdktf destroy {s.name}` before "
                   "merging, or its resources stay deployed and billed.")
        out.append("")
    out += _resources_md(s)
    if s.status == "added" and s.head_argv:
        out += ["**`vllm serve`**", "", f"    {shlex.join(s.head_argv)}", ""]
        out += [(f"**cold compile**: a new stack's first boot compiles cold, ~{COLD_START_S:.0f} s "
                "(SPEC 4)"), ""]
    out += _options_md("`vllm serve` argv and image", s.argv)
    out += _options_md("Container env", s.env)
    if s.cache_key is not None:
        out += [(f"> **cold compile**: the compile-cache key changes ({_code(s.cache_key[0])} → "
                f"{_code(s.cache_key[1])}): ~{COLD_START_S:.0f} s instead of "
                f"~{WARM_START_S:.0f} s on the next boot, SPEC 4"), ""]
    if s.capacity:
        out += ["**Capacity and cost** (planner, SPEC 5-7)", "",
                "| quantity | base | head | change |", "|---|---|---|---|"]
        out += [_row(d.label, d.old_text, d.new_text, d.change) for d in s.capacity]
        out.append("")
    elif s.capacity_note and s.status != "removed":
        prefix = "Capacity and cost" + (" unchanged" if s.status != "added" else "")
        out += [f"**{prefix}**: {s.capacity_note}", ""]
    if s.new_warnings:
        out += ["**New warnings**", "", *[f"- {_cell(w)}" for w in s.new_warnings], ""]
    if s.resolved_warnings:
        out += ["**Resolved warnings**", "", *[f"- {_cell(w)}" for w in s.resolved_warnings], ""]
    return out


def _summary_md(r: Review) -> list[str]:
    out = ["| stack | status | Terraform | argv / env | compile cache | capacity |",
           "|---|---|---|---|---|---|"]
    for s in r.stacks:
        c = s.counts()
        tf = "?" if not s.resources_known else (
            f"+{c['added']} ~{c['changed']} -{c['removed']}" if s.resources else "no change")
        opts = f"{len(s.argv)} flag(s), {len(s.env)} var(s)" if s.argv or s.env else "-"
        cold = "cold next boot" if s.cache_key or s.status == "added" else "-"
        cap = "changed" if s.capacity else "-"
        out.append(f"| `{s.name}` | {s.status} | {tf} | {opts} | {cold} | {cap} |")
    return [*out, ""]


def _problems_md(which: str, problems: Sequence[str]) -> list[str]:
    if not problems:
        return []
    return [(f"**The {which} config fails today's validation** (argv, env and capacity are not "
            f"compared for it):"), "", *[f"- {_cell(p)}" for p in problems], ""]


def _synth_error_md(which: str, error: str | None) -> list[str]:
    if error is None:
        return []
    return [f"**Synth of {which} failed** (its own code):", "", "```", error, "```", ""]


def render_markdown(r: Review, *, limit: int = COMMENT_LIMIT) -> str:
    """The PR comment: a summary table, then one section per stack. Redacted."""
    out = [MARKER, "## tpuserve plan review", "",
           (f"{_code(r.base)} → {_code(r.head)}. Each revision is synthesized offline with its "
           "own code; argv, env, capacity and cost come from each revision's `config/` read by "
           "the current code (config is data)."), ""]
    out += _summary_md(r)
    out += _problems_md("base", r.base_problems) + _problems_md("head", r.head_problems)
    out += _synth_error_md("base", r.base_synth_error)
    out += _synth_error_md("head", r.head_synth_error)
    for s in r.stacks:
        if s.status != "unchanged":
            out += _stack_md(s)
    body = redact("\n".join(out))
    footer = "\n_Generated by `tpuserve review`; this comment is updated on every push._\n"
    room = limit - len(body) - len(footer)
    for i, (title, text) in enumerate(r.attachments):
        share = room // (len(r.attachments) - i)  # the rest is split among those left
        block = _details(title, redact(text), max(share - 200, 0))
        if len(block) > share:
            break
        body += "\n" + block
        room -= len(block) + 1
    return body + footer


def _details(title: str, text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[: max(limit, 0)] + "\n... (cut to fit a GitHub comment)"
    fence = "~~~~" if "```" in text else "```"
    return f"<details><summary>{_cell(title)}</summary>\n\n{fence}\n{text}\n{fence}\n</details>\n"


def render_json(r: Review) -> str:
    return redact(json.dumps(_json_safe(r.to_json()), indent=2))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


# --------------------------------------------------------------------------- I/O: git


def _git(cwd: Path, *args: str) -> str:
    # Hooks off: a review must not run code from the repository's hooks.
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise ReviewError(f"git {' '.join(args)}: {detail}")
    return proc.stdout.strip()


def project_location(project_dir: Path) -> tuple[Path, str]:
    """(repository top level, the project's path inside it, '' at the top)."""
    if not (project_dir / "main.py").is_file():
        raise ReviewError(f"{project_dir}: no main.py here; run review in the project directory "
                          "or pass --repo")
    top = Path(_git(project_dir, "rev-parse", "--show-toplevel"))
    prefix = _git(project_dir, "rev-parse", "--show-prefix")
    return top, prefix


def resolve_commit(top: Path, rev: str) -> str:
    try:
        return _git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ReviewError:
        raise ReviewError(f"{rev!r} is not a commit in {top} (fetch it first: "
                          f"git fetch origin {rev})") from None


@contextlib.contextmanager
def checkout(top: Path, commit: str, workdir: Path, name: str) -> Iterator[Path]:
    """A detached git worktree of `commit` at workdir/name, removed afterwards."""
    path = workdir / name
    _git(top, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        with contextlib.suppress(ReviewError):
            _git(top, "worktree", "remove", "--force", str(path))
        with contextlib.suppress(ReviewError):
            _git(top, "worktree", "prune")


# --------------------------------------------------------------------------- I/O: synth

_SYNTH_MEMO: dict[str, Synthesis] = {}


def tree_digest(project: Path, config: Path | None = None) -> str:
    """What a synthesis depends on: the files it reads, the user config and the interpreter."""
    h = hashlib.sha256(sys.executable.encode())
    for name in SYNTH_INPUTS:
        root = project / name
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ) if root.is_dir() else []
        for path in files:
            h.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes())
    if config is not None:
        h.update(b"config\0" + config.read_bytes())
    for var in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        h.update(f"{var}={os.environ.get(var, '')}".encode())
    return h.hexdigest()


def synth_path(environ: Mapping[str, str], node: str | None) -> str:
    """PATH for synth: the directories of node and terraform, then the system's, nothing else."""
    found = [node, *(shutil.which(p, path=environ.get("PATH", "")) for p in _SYNTH_PROGRAMS)]
    dirs = [str(Path(program).resolve().parent) for program in found if program]
    return os.pathsep.join(dict.fromkeys([*dirs, *_SYSTEM_PATH]))


def jsii_cache_root(environ: Mapping[str, str]) -> str | None:
    """The user's jsii package cache (where jsii itself puts it on Linux), or None.

    Shared with the sandbox on purpose: a fresh one costs 10.6 s and 349 MB per synth instead
    of 1.9 s (measured, issue 10 §5). It holds extracted npm packages, no credential.
    """
    if environ.get("JSII_RUNTIME_PACKAGE_CACHE_ROOT"):
        return environ["JSII_RUNTIME_PACKAGE_CACHE_ROOT"]
    base = environ.get("XDG_CACHE_HOME") or (
        str(Path(environ["HOME"]) / ".cache") if environ.get("HOME") else None)
    return None if base is None else str(Path(base) / "aws" / "jsii" / "package-cache")


def synth_env(project: Path, outdir: Path, config: Path | None,
              environ: Mapping[str, str] | None = None, *, home: Path | None = None
              ) -> dict[str, str]:
    """A minimal environment with a throwaway HOME: no credentials, nothing that leads to one.

    TPUSERVE_CONFIG only when the user gives --config. `home` defaults to a directory beside
    outdir (created by `synthesize`).
    """
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in _PASS_ENV if k in src}
    node = src.get("JSII_NODE")
    ours = REPO_ROOT / "node_modules" / ".bin" / "node"
    if not node and ours.exists():
        node = str(ours)  # a worktree has no node_modules: use ours (Node 22)
    if node:
        env["JSII_NODE"] = node
    home = home or outdir.with_name(outdir.name + "-home")
    cache = jsii_cache_root(src)
    if cache is not None:
        env["JSII_RUNTIME_PACKAGE_CACHE_ROOT"] = cache
    env.update({
        "PATH": synth_path(src, node),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PYTHONPATH": str(project),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "CDKTF_OUTDIR": str(outdir),
        "CHECKPOINT_DISABLE": "1",
    })
    if config is not None:
        env["TPUSERVE_CONFIG"] = str(config.resolve())
    return env


def synthesize(project: Path, outdir: Path, *, config: Path | None = None,
               python: str = sys.executable, timeout_s: float = SYNTH_TIMEOUT_S) -> Synthesis:
    """Run the revision's own main.py (as cdktf would) and read every stack it wrote."""
    key = tree_digest(project, config)
    if key in _SYNTH_MEMO:
        return _SYNTH_MEMO[key]
    home = outdir.with_name(outdir.name + "-home")
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([python, "main.py"], cwd=project,
                              env=synth_env(project, outdir, config, home=home),
                              stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Synthesis({}, f"synth timed out after {timeout_s:.0f} s")
    if proc.returncode != 0 or not (outdir / "stacks").is_dir():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or f"exit {proc.returncode}"
        return Synthesis({}, redact(tail))
    result = read_synthesis(outdir)
    _SYNTH_MEMO[key] = result
    return result


# A synthesized stack is ~60 KB; a directory handed in (`--head-synth`) is untrusted data.
MAX_STACK_BYTES = 50 << 20


def read_synthesis(outdir: Path) -> Synthesis:
    """Every outdir/stacks/NAME/cdk.tf.json (links not followed), or why they cannot be read."""
    stacks_dir = outdir / "stacks"
    if not stacks_dir.is_dir():
        return Synthesis({}, f"{stacks_dir}: no synthesized stacks")
    out: dict[str, Mapping[str, Any]] = {}
    for p in sorted(stacks_dir.iterdir()):
        doc = p / "cdk.tf.json"
        if p.is_symlink() or doc.is_symlink() or not doc.is_file():
            continue
        try:
            if doc.stat().st_size > MAX_STACK_BYTES:
                raise ValueError(f"over {MAX_STACK_BYTES:,} bytes")
            value = json.loads(doc.read_text(), object_pairs_hook=unique_keys)
        except (OSError, ValueError, RecursionError) as exc:
            return Synthesis({}, f"{doc}: {' '.join(str(exc).split())[:200]}")
        if not isinstance(value, dict):
            return Synthesis({}, f"{doc}: not a JSON object")
        out[p.name] = value
    return Synthesis(out)


# --------------------------------------------------------------------------- I/O: config


def config_facts(project: Path, environ: Mapping[str, str] | None = None) -> ConfigFacts:
    """Load a revision's config/ with the CURRENT code; problems instead of exceptions."""
    path = project / "config" / "default.toml"
    try:
        raw = _revision_geometry(load_raw(path, environ=environ or {}), project / "config")
        deployments = from_raw(raw).deployments
    except ConfigError as exc:
        return ConfigFacts({}, tuple(exc.problems))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        return ConfigFacts({}, (f"{path.relative_to(project)}: {exc}",))
    stacks: dict[str, StackFacts] = {}
    for name, d in deployments.items():
        argv = vllm_command(d)
        plan: Plan | None = None
        error: str | None = None
        try:
            plan = plan_for(d)
        except (OSError, ValueError) as exc:
            error = str(exc)
        stacks[name] = StackFacts(
            name=name,
            provisioning_model=d.stack.provisioning_model,
            image=d.vllm.image,
            argv=tuple(argv),
            env=container_env(d.vllm),
            cache_key=compile_cache_key(d, argv),
            cache_enabled=d.cache.enabled,
            plan=plan,
            plan_error=error,
            warnings=tuple(all_warnings(d)),
        )
    return ConfigFacts(stacks)


def _revision_geometry(raw: dict[str, Any], config_dir: Path) -> dict[str, Any]:
    """Point capacity.model_geometry at the revision's own file (relative names are relative
    to config/, which the current code would otherwise read from the current checkout)."""
    default = CapacitySettings.model_fields["model_geometry"].default
    sections = [raw, *(s for s in raw.get("stacks", {}).values() if isinstance(s, dict))]
    for i, section in enumerate(sections):
        capacity = section.get("capacity")
        if capacity is not None and not isinstance(capacity, dict):
            continue  # malformed: the validators will say so
        name = (capacity or {}).get("model_geometry")
        if name is None and i == 0:
            name = default
        if isinstance(name, str) and (config_dir / name).is_file():
            section["capacity"] = {**(capacity or {}), "model_geometry": str(config_dir / name)}
    return raw


def config_environ(config: Path | None, environ: Mapping[str, str] | None = None
                   ) -> dict[str, str]:
    """What load_raw sees: project and zone from the environment, never an ambient
    TPUSERVE_CONFIG (a review compares the repository's configs), only the user's --config."""
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in ("TPUSERVE_PROJECT", "TPUSERVE_ZONE") if k in src}
    if config is not None:
        env["TPUSERVE_CONFIG"] = str(config.resolve())
    return env


# --------------------------------------------------------------------------- entry point


def review(
    base: str,
    head: str | None = None,
    *,
    project_dir: Path | None = None,
    config: Path | None = None,
    attachments: Sequence[tuple[str, str]] = (),
    head_synthesis: Path | None = None,
) -> Review:
    """Review BASE against HEAD (a commit, or None for the working tree) of the project.

    `head_synthesis`: a cdktf output directory to use as HEAD's Terraform instead of running
    HEAD's main.py here (the PR workflow synthesizes the PR in a job of its own, so the job
    that writes the review runs no PR code).
    """
    project = (project_dir or Path.cwd()).resolve()
    top, prefix = project_location(project)
    revisions = [(base, resolve_commit(top, base))]
    revisions.append((WORKING_TREE, None) if head is None else (head, resolve_commit(top, head)))
    workdir = Path(tempfile.mkdtemp(prefix="tpuserve-review-"))
    try:
        with contextlib.ExitStack() as stack:
            trees = []
            for i, (_, commit) in enumerate(revisions):
                if commit is None:
                    trees.append(project)
                else:
                    tree = stack.enter_context(checkout(top, commit, workdir, f"tree{i}"))
                    trees.append(tree / prefix)
            with ThreadPoolExecutor(max_workers=2) as pool:  # the two synths run side by side
                futures = [pool.submit(synthesize, tree, workdir / f"out{i}", config=config)
                           for i, tree in enumerate(trees)
                           if i == 0 or head_synthesis is None]
                syntheses = [f.result() for f in futures]
            if head_synthesis is not None:
                syntheses.append(read_synthesis(head_synthesis))
            env = config_environ(config)
            facts = [
                RevisionFacts(label, commit, synthesis, config_facts(tree, env))
                for (label, commit), tree, synthesis in zip(revisions, trees, syntheses,
                                                            strict=True)
            ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return build_review(facts[0], facts[1], attachments)
