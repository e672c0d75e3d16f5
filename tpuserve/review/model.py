"""The review: per stack, the Terraform, argv, env, compile-cache and capacity changes, and what
each change does to the running server; and its JSON (`tpuserve review --json`).

`server_effect` (on every resource change, and per stack the strongest of them) is
`{"kind", "compile", "why"}`; `kind` is one of EFFECT_KINDS (tpuserve.review.effects says when
each applies), `compile` is "warm", "cold" or null (no vLLM start, or not known), `why` one
sentence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tpuserve.facts import COLD_START_S, WARM_START_S

from .config_facts import flag_rule
from .redact import redact

Action = Literal["added", "removed", "changed"]
_NON_RESOURCE = ("data", "output", "provider", "terraform", "locals", "variable", "module")
Status = Literal["added", "removed", "changed", "unchanged"]
Compile = Literal["warm", "cold"]

# What a change does to the RUNNING server, mildest first (a stack's summary is its strongest).
EFFECT_KINDS: tuple[str, ...] = (
    "none",                      # not touched
    "scaling_changed",           # the fleet's scaling bounds move (HPA); nothing restarts
    "reconverge_in_place",       # the node re-runs its boot script; vLLM keeps running
    "queued_resource_created",   # a new flex request queues; the server boots when granted
    "node_created",              # a new TPU node boots the server
    "restart_in_place",          # same node; vLLM restarts with new settings (warm or cold)
    "rolling_restart",           # the fleet's replicas restart one by one (a new pod template)
    "loses_dependency",          # something the server uses (secret, bucket, SA, network) goes
    "node_replaced",             # the TPU VM is deleted and created again (a ForceNew field)
    "queued_resource_replaced",  # the flex capacity is given up, a new request queues
    "server_removed",            # the node (or queued resource) is destroyed
)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


# An attribute absent on one side (None is a value Terraform can hold).
MISSING: Any = _Missing()


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
class ServerEffect:
    """What one change does to the running server (EFFECT_KINDS)."""

    kind: str
    compile: Compile | None
    why: str

    @property
    def rank(self) -> int:
        """Severity: EFFECT_KINDS' order, a cold start above a warm one."""
        return 2 * EFFECT_KINDS.index(self.kind) + (self.compile == "cold")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "compile": self.compile, "why": self.why}


@dataclass(frozen=True)
class ResourceChange:
    address: str
    action: Action
    attributes: tuple[AttributeChange, ...] = ()
    effect: ServerEffect | None = None  # filled by effects.with_effects

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
                "attributes": [a.to_json() for a in self.attributes],
                "server_effect": None if self.effect is None else self.effect.to_json()}


@dataclass(frozen=True)
class ObjectChange:
    """One Kubernetes object of the fleet's bundle (review.k8s_objects)."""

    kind: str
    namespace: str | None
    name: str
    action: Action
    paths: tuple[str, ...] = ()
    effect: ServerEffect | None = None

    @property
    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name,
                "action": self.action, "paths": list(self.paths),
                "server_effect": None if self.effect is None else self.effect.to_json()}


@dataclass(frozen=True)
class FlagChange:
    """One `vllm serve` option or container variable; None means absent on that side."""

    name: str
    old: str | None
    new: str | None
    # The rule as it applies to HEAD's deployment when that is not the measured pair: labelled
    # derived, with its margin (StackFacts.rule_labels); None: the measured rule as it is.
    labelled_rule: str | None = None

    @property
    def rule(self) -> str | None:
        if self.labelled_rule is not None:
            return self.labelled_rule
        r = flag_rule(self.name)
        return None if r is None else r.rule

    @property
    def setting(self) -> str | None:
        r = flag_rule(self.name)
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
        return {"key": self.key, "label": self.label, "old": json_safe(self.old),
                "new": json_safe(self.new), "change": self.change}


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
    # The fleet's Kubernetes objects (its bundle), and why they were not compared if so.
    kubernetes_objects: tuple[ObjectChange, ...] = ()
    kubernetes_notes: tuple[str, ...] = ()
    # Each side's derived figures and rules when it is not the measured pair (StackFacts.derived).
    derived_base: Mapping[str, str] = field(default_factory=dict)
    derived_head: Mapping[str, str] = field(default_factory=dict)

    @property
    def derived(self) -> bool:
        return bool(self.derived_base or self.derived_head)

    @property
    def server_effect(self) -> ServerEffect | None:
        """The strongest effect of the stack's changes; None when nothing was compared."""
        effects = [r.effect for r in (*self.resources, *self.kubernetes_objects)
                   if r.effect is not None]
        return max(effects, key=lambda e: e.rank) if effects else None

    def counts(self) -> dict[str, int]:
        """Managed resources only, as terraform plan counts them."""
        managed = [r for r in self.resources if r.kind == "resource"]
        return {a: sum(1 for r in managed if r.action == a)
                for a in ("added", "changed", "removed")}

    def to_json(self) -> dict[str, Any]:
        # `derived` only where a side is not the measured pair: the measured review is as it was.
        # A list of {name, source}: a name such as kv_bytes_per_token is no JSON key the
        # redactor takes for a secret's.
        derived = {"derived": {side: [{"name": k, "source": v} for k, v in figures.items()]
                               for side, figures in (("base", self.derived_base),
                                                     ("head", self.derived_head))}
                   } if self.derived else {}
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
            "kubernetes_objects": [o.to_json() for o in self.kubernetes_objects],
            "kubernetes_notes": list(self.kubernetes_notes),
            "server_effect": None if self.server_effect is None else self.server_effect.to_json(),
            **derived,
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


def render_json(r: Review) -> str:
    return redact(json.dumps(json_safe(r.to_json()), indent=2))


def json_safe(value: Any) -> Any:
    """JSON has no infinity (a break-even that never comes): null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
