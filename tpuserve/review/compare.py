"""Comparing two revisions' facts: Terraform documents by address and attribute, `vllm serve`
options and container variables, planner quantities; `build_review` puts them together. Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve.facts import GiB

from .config_facts import MODEL_ARG
from .effects import label_times, with_effects
from .k8s_objects import diff_bundles
from .model import (
    MISSING,
    AttributeChange,
    Delta,
    FlagChange,
    ResourceChange,
    Review,
    StackReview,
    Status,
)
from .revision_facts import RevisionFacts, StackFacts

# SPEC 7 quotes $/M output tokens at these (context, clients) cells.
SPEC7_CELLS = ((128, 64), (1024, 64), (1024, 16), (8192, 16), (128, 1))

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
        ("weights_bytes", f.weights_label, "gib", b.weights_bytes),
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
        if key in before and key in after and before[key][0] != after[key][0]:
            label = f"{before[key][0]} → {after[key][0]}"  # each side's own label (its source)
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


def _labelled(changes: tuple[FlagChange, ...], labels: Mapping[str, str]
              ) -> tuple[FlagChange, ...]:
    """Each change with its rule as it applies to HEAD's deployment (derived, where it is)."""
    return tuple(dataclasses.replace(f, labelled_rule=labels[f.name]) if f.name in labels else f
                 for f in changes)


def _config_changes(old_f: StackFacts | None, new_f: StackFacts | None) -> dict[str, Any]:
    """The StackReview fields that come from one stack's config facts on either side."""
    derived = {"derived_base": old_f.derived if old_f is not None else {},
               "derived_head": new_f.derived if new_f is not None else {}}
    return {**derived, **_changes(old_f, new_f)}


def _changes(old_f: StackFacts | None, new_f: StackFacts | None) -> dict[str, Any]:
    if old_f is not None and new_f is not None:
        capacity: tuple[Delta, ...] = ()
        if old_f.plan is not None and new_f.plan is not None:
            capacity = capacity_deltas(old_f, new_f)
        changed_key = old_f.cache_key != new_f.cache_key and new_f.cache_enabled
        return {
            "argv": _labelled(diff_options({"image": old_f.image, **argv_options(old_f.argv)},
                                           {"image": new_f.image, **argv_options(new_f.argv)}),
                              new_f.rule_labels),
            "env": _labelled(diff_options(old_f.env, new_f.env), new_f.rule_labels),
            "cache_key": (old_f.cache_key, new_f.cache_key) if changed_key else None,
            "capacity": capacity,
            "capacity_note": None if capacity else capacity_summary(new_f),
            "new_warnings": tuple(w for w in new_f.warnings if w not in old_f.warnings),
            "resolved_warnings": tuple(w for w in old_f.warnings if w not in new_f.warnings),
        }
    if new_f is not None:
        return {"capacity_note": capacity_summary(new_f), "new_warnings": new_f.warnings,
                "head_argv": new_f.argv}
    return {}


def _has_changes(s: StackReview) -> bool:
    return bool(s.resources or s.argv or s.env or s.cache_key or s.capacity
                or s.new_warnings or s.resolved_warnings or s.kubernetes_objects
                or s.kubernetes_notes)


def _stack_review(name: str, base: RevisionFacts, head: RevisionFacts) -> StackReview:
    bs, hs = base.synthesis, head.synthesis
    # Synthesis says which stacks exist; the config says so when a synth failed.
    in_base = name in bs.stacks if bs.error is None else name in base.config.stacks
    in_head = name in hs.stacks if hs.error is None else name in head.config.stacks
    status: Status = "added" if not in_base else "removed" if not in_head else "changed"
    resources_known = (bs.error is None or not in_base) and (hs.error is None or not in_head)
    old_doc, new_doc = bs.stacks.get(name), hs.stacks.get(name)
    old_f, new_f = base.config.stacks.get(name), head.config.stacks.get(name)
    resources = with_effects(diff_documents(old_doc, new_doc), old_doc, new_doc, old_f, new_f,
                             status) if resources_known else ()
    objects, notes = diff_bundles(old_doc, new_doc) if resources_known else ((), ())
    derived = (new_f or old_f).derived if (new_f or old_f) else {}
    objects = tuple(dataclasses.replace(o, effect=label_times(o.effect, derived))
                    if o.effect else o for o in objects)
    s = StackReview(name=name, status=status, resources=resources,
                    resources_known=resources_known, kubernetes_objects=objects,
                    kubernetes_notes=notes, **_config_changes(old_f, new_f))
    if s.status == "changed" and s.resources_known and not _has_changes(s):
        s = dataclasses.replace(s, status="unchanged")
    return s


def build_review(
    base: RevisionFacts,
    head: RevisionFacts,
    attachments: Sequence[tuple[str, str]] = (),
) -> Review:
    """Compare two revisions' facts. Pure."""
    bs, hs = base.synthesis, head.synthesis
    bc, hc = base.config, head.config
    names = list(dict.fromkeys([*hs.stacks, *hc.stacks, *bs.stacks, *bc.stacks]))
    return Review(
        base=base.title, head=head.title,
        stacks=tuple(_stack_review(name, base, head) for name in names),
        base_problems=bc.problems, head_problems=hc.problems,
        base_synth_error=bs.error, head_synth_error=hs.error,
        attachments=tuple(attachments),
    )
