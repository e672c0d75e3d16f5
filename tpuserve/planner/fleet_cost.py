"""What the fleet costs and serves: N replicas of the measured one-chip server on GKE (SPEC 2,
6, 7). Pure.

Assumptions, stated once (the JSON carries them as `assumptions`):

- Replicas fill the TPU node pools in `fleet.provisioning` order: each replica lands in the
  first-choice pool while it has capacity, and only then in the next. The headline cost is
  "all in the first-choice pool"; "all in the last-choice pool" is the other bound (any mix
  costs between the two when the list has two pools).
- Replicas are independent servers (one chip each, no tensor parallelism: SPEC 4), so N
  replicas serve N x the single-chip figure of the same (context, clients-per-replica) cell of
  the measured table. That holds only if the Gateway spreads the load evenly.
- Fixed costs, at Google's list prices (tpuserve/facts.py, not measured): the GKE cluster
  management fee per cluster-hour, computed WITHOUT the free tier (its monthly credit covers
  one zonal cluster per billing account, so the first fleet may not pay it), and the system
  node pool (`fleet.system_machine_type`, on-demand): one node at min_replicas, its pool's
  maximum of SYSTEM_POOL_MAX_NODES at most at max_replicas.
- Not counted: boot disks, the Gateway's load balancer and forwarding rule, egress, logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuserve.facts import (
    GKE_CLUSTER_USD_PER_HOUR,
    GKE_FREE_TIER_USD_PER_MONTH,
    HOURS_PER_MONTH,
    MACHINE_USD_PER_HOUR,
    PRICES_USD_PER_CHIP_HOUR,
)
from tpuserve.planner.arithmetic import Plan, ThroughputCell, usd_per_million_tokens
from tpuserve.prices import STANDIN_PREFIX

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

# The fleet stack's system node pool autoscales from 1 to 3 nodes (research 6.2: the EPP, the
# metrics adapter and kube-system run there).
SYSTEM_POOL_MIN_NODES = 1
SYSTEM_POOL_MAX_NODES = 3
FIRST, LAST = "first_choice", "last_choice"
PLACEMENTS = (FIRST, LAST)
BOUNDS = ("min", "max")

ASSUMPTIONS = (
    ("replicas fill the TPU node pools in fleet.provisioning order: all in the first-choice "
    "pool while it has capacity (the headline); all in the last-choice pool is the other bound"),
    ("N replicas serve N x the measured single-chip tok/s of the same clients-per-replica cell "
    "(independent servers, no tensor parallelism): load assumed evenly spread by the Gateway"),
    ("GKE cluster management fee at list price, computed without the free tier (its monthly "
    f"${GKE_FREE_TIER_USD_PER_MONTH:.2f} credit covers one zonal cluster per billing account)"),
    (f"system node pool on demand at list price: {SYSTEM_POOL_MIN_NODES} node at min_replicas, "
    f"its maximum of {SYSTEM_POOL_MAX_NODES} at max_replicas"),
    "not counted: boot disks, the Gateway's load balancer, egress, logging",
)
# ASSUMPTIONS[1] where the plan's table is derived (another model or slice than SPEC 6's).
DERIVED_REPLICAS = (
    "N replicas serve N x the derived one-replica tok/s of the same clients-per-replica cell "
    "(scaled from measured SPEC 6 by bytes per decode step and bandwidth; independent "
    "servers): load assumed evenly spread by the Gateway")


@dataclass(frozen=True)
class FleetCost:
    """One fleet size with every replica in one pool."""

    replicas: int
    pool: str
    chips: int
    tpu_usd_per_hour: float
    cluster_usd_per_hour: float
    system_nodes: int
    system_usd_per_hour: float | None  # None: no list price for the machine type
    hours_per_month: float

    @property
    def usd_per_hour(self) -> float:
        return self.tpu_usd_per_hour + self.cluster_usd_per_hour + (self.system_usd_per_hour or 0)

    @property
    def usd_per_month(self) -> float:
        return self.usd_per_hour * self.hours_per_month

    def as_json(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "pool": self.pool, "chips": self.chips,
                "tpu_usd_per_hour": round(self.tpu_usd_per_hour, 6),
                "cluster_usd_per_hour": self.cluster_usd_per_hour,
                "system_nodes": self.system_nodes,
                "system_usd_per_hour": None if self.system_usd_per_hour is None
                else round(self.system_usd_per_hour, 6),
                "usd_per_hour": round(self.usd_per_hour, 6),
                "usd_per_month": round(self.usd_per_month, 2)}


@dataclass(frozen=True)
class FleetCell:
    """One measured cell, scaled to the fleet's replicas."""

    cell: ThroughputCell
    # {bound: (replicas, aggregate tok/s, {placement: $/M output tokens})}
    at: Mapping[str, tuple[int, float, Mapping[str, float]]]

    def as_json(self) -> dict[str, Any]:
        return {
            "context": self.cell.context,
            "clients_per_replica": self.cell.clients,
            "output_tokens_per_s_per_replica": self.cell.output_tokens_per_s,
            **{bound: {"replicas": n, "clients": n * self.cell.clients,
                       "output_tokens_per_s": round(tok_s, 3),
                       "usd_per_million_output_tokens": {p: round(v, 4) for p, v in usd.items()}}
               for bound, (n, tok_s, usd) in self.at.items()},
        }


@dataclass(frozen=True)
class FleetPlan:
    min_replicas: int
    max_replicas: int
    chips_per_replica: int
    provisioning: tuple[str, ...]
    usd_per_chip_hour: Mapping[str, float]
    system_machine_type: str
    system_usd_per_node_hour: float | None
    costs: Mapping[str, Mapping[str, FleetCost]]  # {bound: {placement: cost}}
    cells: tuple[FleetCell, ...]
    kv_wall: tuple[tuple[int, int], ...]  # (context, clients per replica)
    single_node_usd_per_hour: float  # one node of the same chips in the first-choice pool
    peak: ThroughputCell
    hours_per_month: float
    # None: the plan's table is measured (SPEC 6 or a bench); else how it was derived.
    throughput_source: str | None = None
    # Each pool's $/chip-hour source (tpuserve/prices' Price.source); {}: not given.
    price_sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def standins(self) -> dict[str, str]:
        """The pools no source prices (a stand-in $/chip-hour), with their source."""
        return {p: s for p, s in self.price_sources.items() if s.startswith(STANDIN_PREFIX)}

    @property
    def assumptions(self) -> tuple[str, ...]:
        """ASSUMPTIONS, the throughput one saying derived where the plan's table is."""
        if self.throughput_source is None:
            return ASSUMPTIONS
        return tuple(DERIVED_REPLICAS if a == ASSUMPTIONS[1] else a for a in ASSUMPTIONS)

    @property
    def replicas(self) -> Mapping[str, int]:
        return {"min": self.min_replicas, "max": self.max_replicas}

    def overhead_usd_per_hour(self, bound: str) -> float:
        c = self.costs[bound][FIRST]
        return c.cluster_usd_per_hour + (c.system_usd_per_hour or 0)

    def cell(self, context: int, clients: int) -> FleetCell | None:
        return next((c for c in self.cells
                     if (c.cell.context, c.cell.clients) == (context, clients)), None)

    @property
    def choose_when(self) -> str:
        """When the fleet beats one node, from the numbers."""
        peak, first = self.peak, self.provisioning[0]
        wall_ctx, wall = max(self.kv_wall) if self.kv_wall else (None, None)
        at_min = self.costs["min"][FIRST]
        extra = at_min.usd_per_hour - self.single_node_usd_per_hour * self.min_replicas
        top = self.cell(peak.context, peak.clients)
        single_usd_m = usd_per_million_tokens(self.single_node_usd_per_hour,
                                              peak.output_tokens_per_s)
        if self.throughput_source is None:
            text = (f"choose the fleet when the offered load exceeds one chip's measured peak "
                    f"({peak.output_tokens_per_s:,.1f} tok/s at {peak.context:,} ctx x "
                    f"{peak.clients} clients, SPEC 6)")
        else:
            text = (f"choose the fleet when the offered load exceeds one replica's derived peak "
                    f"({peak.output_tokens_per_s:,.1f} tok/s at {peak.context:,} ctx x "
                    f"{peak.clients} clients, scaled from SPEC 6: see the plan's throughput)")
        if wall is not None:
            text += (f" or needs more concurrent requests than one chip's KV wall ({wall:,} at "
                     f"{wall_ctx:,} ctx)")
        if first in self.standins:
            # The comparison would be the stand-in against itself: dropped, saying why.
            return text + (f", or when self-healing and autoscaling are worth their overhead; "
                           f"no $ comparison with {first} nodes: {self.standins[first]} "
                           f"(set [pricing] {first})")
        text += (f", or when self-healing and autoscaling are worth "
                 f"${extra:.4f}/h: at {self.min_replicas} replica(s) the fleet costs "
                 f"${at_min.usd_per_hour:.4f}/h against "
                 f"${self.single_node_usd_per_hour * self.min_replicas:.4f}/h for "
                 f"{self.min_replicas} {first} node(s) serving the same")
        if top is not None:
            n, tok_s, usd = top.at["max"]
            text += (f"; at {n} replicas it serves {tok_s:,.0f} tok/s at "
                     f"${usd[FIRST]:.3f}/M output tokens (one {first} node: "
                     f"${single_usd_m:.3f}/M)")
        return text

    @property
    def prices_note(self) -> str:
        text = ("list prices (tpuserve/facts.py) for the cluster fee and the system nodes, not "
                "measured; $/chip-hour as the plan's (SPEC 2, [pricing])")
        if self.standins:
            text += ("; no source prices pool(s) " + ", ".join(self.standins) + ": their "
                     "$/chip-hour is a stand-in (price_sources), and so is every $ figure of "
                     "them")
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "assumptions": list(self.assumptions),
            "prices": self.prices_note,
            "price_sources": dict(self.price_sources),
            "replicas": dict(self.replicas),
            "chips_per_replica": self.chips_per_replica,
            "provisioning": list(self.provisioning),
            "usd_per_chip_hour": dict(self.usd_per_chip_hour),
            "cluster_usd_per_hour": GKE_CLUSTER_USD_PER_HOUR,
            "cluster_free_tier_usd_per_month": GKE_FREE_TIER_USD_PER_MONTH,
            "cluster_free_tier_applied": False,
            "system_machine_type": self.system_machine_type,
            "system_usd_per_node_hour": self.system_usd_per_node_hour,
            "hours_per_month": self.hours_per_month,
            "cost": {bound: {p: c.as_json() for p, c in by.items()}
                     for bound, by in self.costs.items()},
            "overhead_usd_per_hour": {b: round(self.overhead_usd_per_hour(b), 6)
                                      for b in BOUNDS},
            "throughput": [c.as_json() for c in self.cells],
            "kv_wall": {str(ctx): {"per_replica": n, "min": n * self.min_replicas,
                                   "max": n * self.max_replicas} for ctx, n in self.kv_wall},
            "single_node": {
                "pool": self.provisioning[0],
                "usd_per_hour": round(self.single_node_usd_per_hour, 6),
                "peak_output_tokens_per_s": self.peak.output_tokens_per_s,
                "peak_cell": self.peak.key,
            },
            "choose_fleet_when": self.choose_when,
        }


def overhead_floor_usd_per_hour(system_machine_type: str) -> float | None:
    """What a fleet's cluster bills besides its TPU nodes while it exists, at least: the GKE fee
    (list price, no free tier) and the system pool's one node at list price; None without a
    list price for the machine type. The system pool may have scaled up to its maximum."""
    price = MACHINE_USD_PER_HOUR.get(system_machine_type)
    return None if price is None else GKE_CLUSTER_USD_PER_HOUR + SYSTEM_POOL_MIN_NODES * price


def _cost(replicas: int, pool: str, chips: int, price: float, system_nodes: int,
          system_price: float | None, hours: float) -> FleetCost:
    return FleetCost(
        replicas=replicas, pool=pool, chips=replicas * chips,
        tpu_usd_per_hour=replicas * chips * price,
        cluster_usd_per_hour=GKE_CLUSTER_USD_PER_HOUR,
        system_nodes=system_nodes,
        system_usd_per_hour=None if system_price is None else system_nodes * system_price,
        hours_per_month=hours,
    )


def fleet_plan(
    plan: Plan,
    *,
    min_replicas: int,
    max_replicas: int,
    provisioning: Sequence[str],
    prices: Mapping[str, float] = PRICES_USD_PER_CHIP_HOUR,
    system_machine_type: str = "e2-standard-4",
    hours_per_month: float = HOURS_PER_MONTH,
    throughput_source: str | None = None,
    price_sources: Mapping[str, str] | None = None,
) -> FleetPlan:
    """The fleet's cost at min and max replicas (each pool bound) and its throughput, from the
    one-replica plan (its throughput table, KV wall and chips per replica); `throughput_source`
    names how the plan's table was derived (None: it is measured)."""
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"replicas: need 1 <= min ({min_replicas}) <= max ({max_replicas})")
    if not provisioning:
        raise ValueError("provisioning: at least one pool")
    missing = [p for p in provisioning if p not in prices]
    if missing:
        raise ValueError(f"no $/chip-hour for pool(s) {missing}")
    if not plan.throughput.cells:
        raise ValueError("the throughput table is empty")
    chips = plan.chip.chips
    system_price = MACHINE_USD_PER_HOUR.get(system_machine_type)
    pools = {FIRST: provisioning[0], LAST: provisioning[-1]}
    sizes = {"min": (min_replicas, SYSTEM_POOL_MIN_NODES),
             "max": (max_replicas, SYSTEM_POOL_MAX_NODES)}
    costs = {bound: {p: _cost(n, pools[p], chips, prices[pools[p]], nodes, system_price,
                              hours_per_month) for p in PLACEMENTS}
             for bound, (n, nodes) in sizes.items()}
    cells = tuple(
        FleetCell(cell, {
            bound: (n, n * cell.output_tokens_per_s,
                    {p: usd_per_million_tokens(costs[bound][p].usd_per_hour,
                                               n * cell.output_tokens_per_s)
                     for p in PLACEMENTS})
            for bound, (n, _) in sizes.items()
        })
        for cell in plan.throughput.cells
    )
    measured = set(plan.throughput.contexts)
    return FleetPlan(
        min_replicas=min_replicas, max_replicas=max_replicas, chips_per_replica=chips,
        provisioning=tuple(provisioning),
        usd_per_chip_hour={p: prices[p] for p in provisioning},
        system_machine_type=system_machine_type, system_usd_per_node_hour=system_price,
        costs=costs, cells=cells,
        kv_wall=tuple((c, n) for c, n in plan.kv_wall if c in measured),
        single_node_usd_per_hour=chips * prices[provisioning[0]],
        peak=max(plan.throughput.cells, key=lambda c: c.output_tokens_per_s),
        hours_per_month=hours_per_month, throughput_source=throughput_source,
        price_sources={p: price_sources[p] for p in provisioning if p in price_sources}
        if price_sources else {},
    )


def fleet_for(d: Deployment, plan: Plan, throughput_source: str | None = None) -> FleetPlan:
    """`fleet_plan` with the deployment's [fleet] and [pricing] (the fleet stack only)."""
    f = d.fleet
    # price_for: [pricing] set, the book for this chip and region, else a stand-in (its source
    # says so, and the plan says so of every figure built on it).
    priced = {p: d.price_for(p) for p in f.provisioning}
    prices = {**PRICES_USD_PER_CHIP_HOUR, **{p: x.usd_per_chip_hour for p, x in priced.items()}}
    return fleet_plan(plan, min_replicas=f.min_replicas, max_replicas=f.max_replicas,
                      provisioning=f.provisioning, prices=prices,
                      price_sources={p: x.source for p, x in priced.items()},
                      system_machine_type=f.system_machine_type,
                      hours_per_month=plan.hours_per_month,
                      throughput_source=throughput_source)
