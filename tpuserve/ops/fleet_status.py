"""The fleet stack as the CLI sees it: replicas, the autoscaler, the Gateway, each pod's state.

The VM stacks are found through the TPU API (a node, its external IP, a pinned certificate);
the fleet through its cluster's API (tpuserve.gcp.kube) and the Gateway's address. What the
fleet's objects say is read by tpuserve.ops.fleet_pods (each pod's state and why),
fleet_autoscaler (the HPA) and fleet_gateway (the Gateway, the endpoint picker, the endpoint);
`tpuserve wait fleet` is tpuserve.ops.fleet_wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tpuserve.gcp import kube
from tpuserve.planner.fleet_cost import overhead_floor_usd_per_hour
from tpuserve.render.fleet_bundle import DEPLOYMENT, EPP, GATEWAY, HPA, NAMESPACE
from tpuserve.settings import Deployment

from . import server
from .errors import OpsError
from .fleet_autoscaler import HpaView, MetricView, hpa_view
from .fleet_gateway import (
    endpoint_url,
    fleet_target,
    gateway_address,
    gateway_conditions,
    gateway_not_serving,
    picker_problem,
    picker_view,
    programmed,
)
from .fleet_pods import (
    EVENTS_PER_POD,
    MAX_EVENT_LOOKUPS,
    PodView,
    classify,
    label_selector,
    unscheduled,
)
from .kube_fields import as_int as _int
from .kube_fields import dig as _d
from .kube_fields import parse_quantity
from .server import ServerTarget
from .status_model import (
    KindJson,
    StatusFacts,
    StatusModel,
    StatusTable,
    SubTable,
    health_line,
    status_json,
)

# What the CLI and the other modules have always read from here.
__all__ = ["FleetStatus", "HpaView", "MetricView", "PodView", "classify", "endpoint_url",
           "fleet_status", "fleet_target", "gateway_address", "gateway_conditions",
           "gateway_not_serving", "hpa_view", "label_selector", "parse_quantity",
           "picker_problem", "picker_view", "programmed", "read_fleet", "unscheduled"]


@dataclass
class FleetStatus:
    d: Deployment
    deployment: dict[str, Any] | None = None
    hpa: HpaView | None = None
    gateway: dict[str, Any] | None = None
    picker: dict[str, Any] | None = None  # the endpoint picker's Deployment
    pods: list[PodView] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    health_ok: bool | None = None
    health_detail: str = "not checked"
    error: str | None = None  # the cluster could not be read (status of every stack)
    no_credentials: bool = False

    recoverable = False  # GKE replaces lost nodes and pods itself: `status --recover` skips it

    @property
    def deployed(self) -> bool:
        return self.deployment is not None

    @property
    def desired(self) -> int:
        return _int(_d(self.deployment, "spec", "replicas"))

    @property
    def ready(self) -> int:
        return _int(_d(self.deployment, "status", "readyReplicas"))

    @property
    def address(self) -> str | None:
        return gateway_address(self.gateway)

    @property
    def endpoint(self) -> str | None:
        return endpoint_url(self.d, self.gateway) if self.gateway is not None else None

    @property
    def billed_replicas(self) -> int:
        """Pods on a TPU node: each holds one chip (a pod waiting for capacity costs nothing)."""
        return sum(1 for p in self.pods if p.node and p.state not in ("succeeded", "failed"))

    @property
    def usd_per_hour(self) -> float:
        return self.billed_replicas * self.d.usd_per_hour

    @property
    def problems(self) -> list[str]:
        out = []
        if self.error:
            out.append(self.error)
        for p in self.pods:
            if p.state == "failing":
                out.append(f"pod {p.name} is failing: {p.reason}")
            elif p.state == "quota":
                out.append(f"pod {p.name} waits on quota: {p.reason}; raise the TPU quota "
                           "(IAM & Admin > Quotas) or lower fleet.max_replicas")
        if self.deployed:
            if (line := picker_problem(self.picker)) is not None:
                out.append(line)
            if self.gateway is None:
                out.append(f"no Gateway {NAMESPACE}/{GATEWAY}")
            else:
                out += gateway_not_serving(self.gateway)
        if self.ready and self.health_ok is False:
            out.append(f"{self.ready} replica(s) ready but /health through the Gateway fails "
                       f"({self.health_detail})")
        return out

    @property
    def spend_usd_per_hour(self) -> float | None:
        """What bills now: the replicas on TPU nodes, and the cluster that answered (its fee
        and its system pool's node: tpuserve.planner.fleet_cost). None when the pods were not
        all read (the cluster could not be read, or the list was cut at kube.MAX_LIST_ITEMS):
        a count of some proves nothing."""
        if self.error is not None or self.no_credentials or any(
                what.startswith("pods ") for what in self.truncated):
            return None
        overhead = overhead_floor_usd_per_hour(self.d.fleet.system_machine_type)
        return None if overhead is None else self.usd_per_hour + overhead

    def model(self) -> StatusModel:
        d = self.d
        status = _d(self.deployment, "status") or {}
        facts = StatusFacts.of(
            d, deployed=self.deployed, endpoint=self.endpoint, health_ok=self.health_ok,
            health_detail=self.health_detail, spend_usd_per_hour=self.spend_usd_per_hour,
            problems=self.problems, recoverable=self.recoverable)
        kind = KindJson(
            identity={"cluster": kube.cluster_name(d), "kube_context": kube.context_name(d)},
            state={
                "replicas": {"desired": self.desired, "ready": self.ready,
                             "updated": _int(status.get("updatedReplicas")),
                             "available": _int(status.get("availableReplicas"))},
                "autoscaler": self.hpa.to_json() if self.hpa else None,
                "gateway": {"name": GATEWAY, "address": self.address,
                            "programmed": programmed(self.gateway),
                            "conditions": gateway_conditions(self.gateway)}
                if self.gateway else None,
                "picker": picker_view(self.picker) if self.deployed else None,
            },
            detail={
                "pods": [p.to_json() for p in self.pods],
                "pending": self.pending,
                "billed_replicas": self.billed_replicas,
                "usd_per_replica_hour": round(d.usd_per_hour, 4),
                "usd_per_hour": round(self.usd_per_hour, 4),  # a spend rate here (a VM: price)
                "truncated": self.truncated,
            },
        )
        return StatusModel(facts, kind, self._table(facts))

    @property
    def pending(self) -> dict[str, int]:
        return {s: sum(1 for p in self.pods if p.state == s)
                for s in ("capacity", "quota", "unschedulable")}

    def _table(self, f: StatusFacts) -> StatusTable:
        d = self.d
        title = f"[bold]{d.name}[/] (GKE cluster {kube.cluster_name(d)}, {d.gcp.zone})"
        if self.no_credentials:
            return StatusTable(title, summary="not deployed, or no credentials for it: "
                               f"{kube.credentials_command(d)}", wrap_summary=True)
        if self.error is None and not self.deployed:
            return StatusTable(title, summary="not deployed")
        pods = SubTable(("pod", "phase", "state", "why"),
                        [(p.name, p.phase, p.state, p.reason or "-") for p in self.pods])
        return StatusTable(title, rows=self._rows(f) if self.error is None else [],
                           tables=[pods])

    def _rows(self, f: StatusFacts) -> list[tuple[str, str]]:
        status = self.deployment.get("status") if isinstance(self.deployment, dict) else None
        updated = status.get("updatedReplicas", 0) if isinstance(status, dict) else 0
        rows = [("replicas", f"{self.ready}/{self.desired} ready ({updated} updated)")]
        if self.hpa is None:
            rows.append(("autoscaler", "no HorizontalPodAutoscaler"))
        else:
            h = self.hpa
            rows.append(("autoscaler", (f"{h.current_replicas} current, {h.desired_replicas} "
                         f"desired (min {h.min_replicas}, max {h.max_replicas})")))
            for m in h.metrics:
                cur = "unknown" if m.current is None else f"{m.current:g}"
                tgt = "?" if m.target is None else f"{m.target:g}"
                # prometheus.googleapis.com|vllm:num_requests_waiting|gauge: the middle part
                name = m.name.split("|")[1] if m.name.count("|") == 2 else m.name
                rows.append(("metric", f"{name}: {cur} / target {tgt} ({m.target_type})"))
        conds = ", ".join(f"{c['type']}={c['status']}" for c in gateway_conditions(self.gateway)
                          if c["type"] in ("Accepted", "Programmed"))
        rows.append(("gateway", (self.address or "no address yet")
                     + (f" ({conds})" if conds else "")))
        p = picker_view(self.picker)
        rows.append(("picker", (f"{p['ready']}/{p['desired']} ready "
                                f"({p['image'] or 'no Deployment'})")))
        rows.append(("endpoint", f"{f.endpoint}/v1" if f.endpoint else "-"))
        rows.append(("health", health_line(f.health_ok, f.health_detail)))
        pending = {k: v for k, v in self.pending.items() if v}
        if pending:
            rows.append(("pending", ", ".join(f"{v} {k}" for k, v in pending.items())))
        rows.append(("cost", (f"${self.usd_per_hour:,.4f}/h: {self.billed_replicas} replica(s) "
                     f"on TPU nodes at ${self.d.usd_per_hour:.4f}/h "
                     f"({self.d.fleet.provisioning[0]} price)")))
        rows.extend(("truncated", f"{what}: only the first {kube.MAX_LIST_ITEMS} read")
                    for what in self.truncated)
        return rows

    def to_json(self) -> dict[str, Any]:
        return status_json(self.model())


def read_fleet(d: Deployment, k: kube.Kube, *, http: httpx.Client | None = None) -> FleetStatus:
    """Everything `status fleet` shows, from one client of the cluster."""
    s = FleetStatus(d)
    s.deployment = k.deployment(NAMESPACE, DEPLOYMENT)
    if s.deployment is None:
        return s
    hpa = k.hpa(NAMESPACE, HPA)
    s.hpa = hpa_view(hpa) if hpa else None
    s.gateway = k.gateway(NAMESPACE, GATEWAY)
    s.picker = k.deployment(NAMESPACE, EPP)
    pods = k.pods(NAMESPACE, label_selector())
    looked = 0
    for pod in pods:
        events: list[dict[str, Any]] = []
        if unscheduled(pod) and looked < MAX_EVENT_LOOKUPS:
            looked += 1
            name = _d(pod, "metadata", "name")
            events = k.events(NAMESPACE, f"involvedObject.kind=Pod,involvedObject.name={name}",
                              limit=EVENTS_PER_POD)
        s.pods.append(classify(pod, events))
    s.truncated = list(k.truncated)
    if http is not None and s.endpoint and s.address:
        s.health_ok, s.health_detail = server.health(http, ServerTarget(s.endpoint))
    elif s.endpoint is None or s.address is None:
        s.health_detail = "the Gateway has no address yet"
    return s


def fleet_status(d: Deployment, *, http: httpx.Client | None = None,
                 connect: Callable[[Deployment], kube.Kube] = kube.connect,
                 strict: bool = True) -> FleetStatus:
    """STRICT (the fleet asked for by name): a cluster that cannot be read is an error;
    otherwise (`status` of every stack) it is this stack's problem, and a kubeconfig without
    the fleet's context means it is not deployed."""
    try:
        return read_fleet(d, connect(d), http=http)
    except kube.NoContext:
        if strict:
            raise
        return FleetStatus(d, no_credentials=True)
    except OpsError as exc:
        if strict:
            raise
        return FleetStatus(d, error=exc.line)

