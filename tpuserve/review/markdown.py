"""The pull-request comment: a summary table, then one section per changed stack, then the
attachments cut to fit GitHub's comment limit. Redacted.

Every resource change carries a `running server: ...` line (its ServerEffect), and the summary
table a `running server` column (the stack's strongest effect)."""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve.facts import COLD_START_S, WARM_START_S

from .effects import times_source
from .model import MISSING, AttributeChange, FlagChange, Review, ServerEffect, StackReview
from .redact import redact

# The first line of every review: the workflow finds its one comment by it.
MARKER = "<!-- tpuserve-plan-review -->"
# GitHub rejects comments over 65,536 characters; attachments are cut to stay under.
COMMENT_LIMIT = 65_000


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
    if a.path == "input.bundle" and (_is_script(a.old) or _is_script(a.new)):
        return f"{_code(a.path)}: the Kubernetes bundle changed; its objects are listed below"
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
# How the comment names each ServerEffect kind (model.EFFECT_KINDS).
EFFECT_LABELS = {
    "none": "not touched",
    "reconverge_in_place": "re-converges in place, vLLM kept",
    "queued_resource_created": "new queued resource",
    "node_created": "new node",
    "restart_in_place": "restarts in place",
    "rolling_restart": "rolling restart of the replicas",
    "scaling_changed": "autoscaler changed",
    "loses_dependency": "loses what it uses",
    "node_replaced": "node replaced",
    "queued_resource_replaced": "queued resource replaced",
    "server_removed": "server removed",
}


def effect_label(e: ServerEffect) -> str:
    """`restarts in place, cold compile`: the kind, and the compile when vLLM starts."""
    label = EFFECT_LABELS.get(e.kind, e.kind)
    return f"{label}, {e.compile} compile" if e.compile else label


def _effect_line(e: ServerEffect) -> str:
    if e.kind == "none":
        return f"running server: {effect_label(e)} ({_cell(e.why)})"
    return f"running server: **{effect_label(e)}**: {_cell(e.why)}"


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
        replaced = r.replaces or (r.effect is not None and r.effect.kind == "node_replaced")
        action = "changed, replaced" if replaced else r.action
        out.append(f"- {_SYMBOL[r.action]} {_code(r.address)} ({action})")
        if r.effect is not None and r.kind == "resource" and not (
                whole_stack and r.effect.kind == "none"):  # a whole stack: what matters only
            out.append(f"  - {_effect_line(r.effect)}")
        out += [f"  - {_attribute_line(a)}" for a in r.attributes]
    out.append("")
    return out


def _objects_md(s: StackReview) -> list[str]:
    """The fleet's Kubernetes objects (its bundle), each with its effect and changed paths."""
    if not (s.kubernetes_objects or s.kubernetes_notes):
        return []
    counts = {a: sum(1 for o in s.kubernetes_objects if o.action == a)
              for a in ("added", "changed", "removed")}
    out = [(f"**Kubernetes objects** (the bundle): {counts['added']} to add, "
            f"{counts['changed']} to change, {counts['removed']} to delete"), ""]
    out += [f"- note: {_cell(n)}" for n in s.kubernetes_notes]
    for o in s.kubernetes_objects:
        out.append(f"- {_SYMBOL[o.action]} {_code(o.label)} ({o.action})")
        if o.effect is not None and not (s.status == "added" and o.effect.kind == "none"):
            out.append(f"  - {_effect_line(o.effect)}")
        out += [f"  - {_code(p)}" for p in o.paths]
    return [*out, ""]


def _options_md(title: str, changes: Sequence[FlagChange], *, derived: bool = False
                ) -> list[str]:
    if not changes:
        return []
    # HEAD not the measured pair: its rules are derived (each says so), not measured.
    column = "rule (derived where it says so)" if derived else "measured rule"
    out = [f"**{title}**", "", f"| option | base | head | {column} |", "|---|---|---|---|"]
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
    out += _objects_md(s)
    if s.status == "added" and s.head_argv:
        out += ["**`vllm serve`**", "", f"    {shlex.join(s.head_argv)}", ""]
        out += [(f"**cold compile**: a new stack's first boot compiles cold, ~{COLD_START_S:.0f} s "
                f"({times_source(s.derived_head)})"), ""]
    out += _derived_md(s)
    out += _options_md("`vllm serve` argv and image", s.argv, derived=bool(s.derived_head))
    out += _options_md("Container env", s.env, derived=bool(s.derived_head))
    if s.cache_key is not None:
        out += [(f"> **cold compile**: the compile-cache key changes ({_code(s.cache_key[0])} → "
                f"{_code(s.cache_key[1])}): ~{COLD_START_S:.0f} s instead of "
                f"~{WARM_START_S:.0f} s on the next boot, {times_source(s.derived_head)}"), ""]
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


def _derived_md(s: StackReview) -> list[str]:
    """Each side that is not the measured pair: which figures and rules are derived, from
    what, with what margin (settings/derived_labels.py); nothing on the measured pair."""
    sides = [(w, d) for w, d in (("base", s.derived_base), ("head", s.derived_head)) if d]
    if sides and len(sides) == 2 and sides[0][1] == sides[1][1]:
        sides = [("base and head", sides[1][1])]
    out: list[str] = []
    for which, derived in sides:
        out += [f"**Derived, not measured** ({which}):", ""]
        out += [f"- {_code(name)}: {_cell(text)}" for name, text in derived.items()]
        out.append("")
    return out


def _summary_md(r: Review) -> list[str]:
    out = [("| stack | status | Terraform | argv / env | compile cache | capacity | "
            "running server |"),
           "|---|---|---|---|---|---|---|"]
    for s in r.stacks:
        c = s.counts()
        tf = "?" if not s.resources_known else (
            f"+{c['added']} ~{c['changed']} -{c['removed']}" if s.resources else "no change")
        opts = f"{len(s.argv)} flag(s), {len(s.env)} var(s)" if s.argv or s.env else "-"
        cold = "cold next boot" if s.cache_key or s.status == "added" else "-"
        cap = "changed" if s.capacity else "-"
        effect = s.server_effect
        server = "?" if not s.resources_known else (
            "-" if effect is None or effect.kind == "none" else effect_label(effect))
        out.append(f"| `{s.name}` | {s.status} | {tf} | {opts} | {cold} | {cap} | {server} |")
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


def render_markdown(r: Review, *, limit: int = COMMENT_LIMIT,
                    drift: Sequence[tuple[str, str]] = ()) -> str:
    """The PR comment: a summary table, then one section per stack. Redacted. DRIFT: (stack,
    note) of a node `tpuserve tune` left off Terraform's script, said under the table."""
    out = [MARKER, "## tpuserve plan review", "",
           (f"{_code(r.base)} → {_code(r.head)}. Each revision is synthesized offline with its "
           "own code; argv, env, capacity and cost come from each revision's `config/` read by "
           "the current code (config is data)."), ""]
    out += _summary_md(r)
    if drift:
        out += ["**The running server is not Terraform's** (`tpuserve tune --keep-best`):", ""]
        out += [f"- {_code(stack)}: {note}" for stack, note in drift] + [""]
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
