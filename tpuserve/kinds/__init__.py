"""The serving kinds: one object per kind of serving stack, in ONE ordered list (KINDS).

A kind owns what the code used to decide by comparing `stack.provisioning_model` with a string:
its stack's name and class, its capacity (spot, flex-start, GKE), whether it has a billing guard,
its price key, the stack-table keys that apply to it, and its synth summary line. Every list of
kinds (the stack names, the settings' Literals, the CLI's help and errors, the planner's price
keys, the fleet's node-pool models) is derived from KINDS; tests/test_kinds.py fails on a kind
string compared anywhere else.

This package is the bottom layer: it imports nothing of the project but tpuserve.contracts (the
resource type names its summary lines read; standard library only), so the settings, the
planner, the renderers, ops and the CLI's start-up read it for free. Behaviour that needs a
layer above (the stack class under stacks/, recovery and waiting under ops/) is named here and
dispatched there: `stack_class` is a "module:Class" string that main.py imports, and ops
branches on the kind's capacity flags (`queued_resource`, `billing_guard`), never on its name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuserve.kinds import synth_lines

# The shapes of capacity a kind runs on (Kind.capacity).
TPU_VM, QUEUED_RESOURCE, GKE = "tpu-vm", "queued-resource", "gke"

SummaryLine = Callable[["Kind", str, Mapping[str, Any], Mapping[str, Any]], "str | None"]


@dataclass(frozen=True, eq=False)  # one object per kind: compared by identity (`is`)
class Kind:
    """One kind of serving stack."""

    # [stacks.NAME]: the stack's default name, and `stack.provisioning_model`'s value.
    name: str
    provisioning_model: str
    title: str  # how messages and the synth summary call its capacity
    # "module:Class" under stacks/ (above this package: main.py imports it, never tpuserve).
    stack_class: str
    # The stack-table keys that apply (settings/stack.py); the others warn and are ignored.
    stack_keys: tuple[str, ...]
    # Its synth summary line from the synthesized JSON, or None when the JSON is not its.
    summary: SummaryLine = field(repr=False)
    spot: bool = False          # preemptible capacity (TPU VM scheduling_config.spot, GKE spot)
    flex_start: bool = False    # flex-start capacity (a queued resource, a flex-start node pool)
    on_gke: bool = False        # replicas on GKE behind a Gateway, not one TPU VM
    # A Cloud Tasks task deletes the node stack.max_run_hours after its createTime.
    billing_guard: bool = False
    # [pricing] key of one server's $/chip-hour; None: its first node pool's model's.
    price_key: str | None = None
    # Its position in [fleet] provisioning's list of node-pool models; None: no GKE pool.
    pool_rank: int | None = None

    @property
    def queued_resource(self) -> bool:
        """A flex-start TPU VM: the node comes from a queued resource (waited for, recovered)."""
        return self.flex_start and not self.on_gke

    @property
    def capacity(self) -> str:
        """The shape of its capacity, which ops keys its behaviour by (how its status is read,
        what is dead and how it recovers, what `wait` waits for): each ops table maps every
        shape in CAPACITIES, so a new kind of a known shape needs no ops change."""
        return GKE if self.on_gke else QUEUED_RESOURCE if self.flex_start else TPU_VM

    @property
    def name_bound(self) -> bool:
        """Only the stack of its name may be of this kind, and it of no other (the fleet)."""
        return self.on_gke


SPOT = Kind("spot", "spot", "spot", "stacks.tpu_vm:TpuVmStack", ("max_run_hours",),
            synth_lines.tpu_vm, spot=True, billing_guard=True, price_key="spot", pool_rank=1)
ONDEMAND = Kind("ondemand", "ondemand", "on-demand", "stacks.tpu_vm:TpuVmStack",
                ("max_run_hours",), synth_lines.tpu_vm, billing_guard=True,
                price_key="ondemand", pool_rank=2)
FLEX = Kind("flex", "flex", "flex-start", "stacks.flex:FlexStack",
            ("max_run_duration", "valid_until_duration"), synth_lines.queued_resource,
            flex_start=True, price_key="flex", pool_rank=0)
FLEET = Kind("fleet", "fleet", "GKE fleet", "stacks.fleet:FleetStack", (), synth_lines.gke_fleet,
             on_gke=True)

# THE list, in the order every message and table shows the kinds.
KINDS: tuple[Kind, ...] = (SPOT, ONDEMAND, FLEX, FLEET)

STACK_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
PROVISIONING_MODELS: tuple[str, ...] = tuple(k.provisioning_model for k in KINDS)
# The models a fleet node pool may have ([fleet] provisioning), in their rank's order.
POOL_MODELS: tuple[str, ...] = tuple(
    k.provisioning_model for k in sorted((k for k in KINDS if k.pool_rank is not None),
                                         key=lambda k: k.pool_rank or 0))
CAPACITIES: tuple[str, ...] = tuple(dict.fromkeys(k.capacity for k in KINDS))
PRICE_KEYS: tuple[str, ...] = tuple(k.price_key for k in KINDS if k.price_key)

_BY_MODEL: dict[str, Kind] = {k.provisioning_model: k for k in KINDS}


def by_model(provisioning_model: str) -> Kind:
    """The kind of a (validated) provisioning model; KeyError for one the registry lacks."""
    return _BY_MODEL[provisioning_model]


def words(names: tuple[str, ...], last: str = "or") -> str:
    """'a, b, c or d': a list of kinds in a sentence."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)
