"""Where one deployed stack stands: node (and queued resource), boot, health, time and money."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.gcp.tpu.queued_resources import QueuedResource, ref_for
from tpuserve.planner.arithmetic import cost_for_hours
from tpuserve.settings import Deployment

from . import server, tls
from .boot_phases import NAMESPACE, BootReport, parse_boot
from .errors import OpsError
from .reconverge import Reconverge, parse_reconverge
from .served_config import ServedConfig, deployed_sha256, parse_served
from .status_kinds import (
    LOST_NODE_STATES,
    RECOVERABLE_NODE_STATES,
    RECOVERABLE_QR_STATES,
    NodeKind,
    node_kind,
)
from .status_model import (
    KindJson,
    StatusFacts,
    StatusModel,
    StatusTable,
    SubTable,
    format_duration,
    health_line,
    status_json,
)
from .status_model import round_or_none as _round

__all__ = ["HEALTH_TIMEOUT_S", "LOST_NODE_STATES", "RECOVERABLE_NODE_STATES",
           "RECOVERABLE_QR_STATES", "StackStatus", "TpuSource", "format_duration",
           "stack_status"]

HEALTH_TIMEOUT_S = 5.0

Now = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class TpuSource(Protocol):
    """What status and wait read of the TPU client (tpuserve.gcp.tpu.client.TpuClient)."""

    def get_node(self, d: Deployment) -> NodeView | None: ...
    def guest_attributes(self, d: Deployment, namespace: str) -> dict[str, str]: ...
    def get_queued_resource(self, ref: Any) -> QueuedResource | None: ...


@dataclass
class StackStatus:
    """A VM stack's status (spot, ondemand, flex): its node, and flex's queued resource."""

    d: Deployment = field(repr=False)
    node: NodeView | None
    qr: QueuedResource | None
    boot: BootReport
    health_ok: bool | None  # None: not checked (no READY node with an IP)
    health_detail: str
    now: dt.datetime
    # Which config the running server uses, beside the deployed one (None: not asked).
    served: ServedConfig | None = None
    # The node watcher's last word (ops/reconverge.py); None: it recorded none, or not read.
    reconverge: Reconverge | None = None

    @property
    def kind(self) -> NodeKind:
        return node_kind(self.d)

    @property
    def qr_state(self) -> str | None:
        return self.kind.qr_state(self.qr)

    @property
    def deployed(self) -> bool:
        return self.node is not None or (self.qr is not None)

    @property
    def endpoint(self) -> str | None:
        if self.node is None or not self.node.external_ip:
            return None
        scheme = "https" if self.d.access.tls_on else "http"
        return f"{scheme}://{self.node.external_ip}:{self.d.vllm.port}"

    @property
    def billing(self) -> bool:
        """A node exists and is not lost (a PREEMPTED or deleted node stops billing)."""
        return self.node is not None and self.node.state not in LOST_NODE_STATES

    @property
    def running_s(self) -> float | None:
        """Since the node's creation, while it bills; None once it is lost or absent."""
        if not self.billing or self.node is None or self.node.create_time is None:
            return None
        return max(0.0, (self.now - self.node.create_time).total_seconds())

    @property
    def spent_usd(self) -> float | None:
        """Money spent by the node so far at the stack's list price (pricing x chips)."""
        running = self.running_s
        return None if running is None else cost_for_hours(self.d.usd_per_hour, running / 3600)

    @property
    def spend_usd_per_hour(self) -> float:
        """What bills now: the node's price while it bills (the TPU API bills a node from its
        creation until it is lost or deleted), nothing before or after."""
        return self.d.usd_per_hour if self.billing else 0.0

    @property
    def ends_at(self) -> tuple[dt.datetime | None, str]:
        """When the node stops billing by itself, and the rule that says so."""
        return self.kind.ends_at(self)

    @property
    def ends_in_s(self) -> float | None:
        if not self.billing:
            return None
        at, _ = self.ends_at
        return None if at is None else (at - self.now).total_seconds()

    @property
    def recoverable(self) -> bool:
        return self.kind.recoverable(self)

    @property
    def problems(self) -> list[str]:
        out = self.kind.queue_problems(self)
        name = self.d.name
        if self.node is not None and self.node.state in LOST_NODE_STATES:
            hint = (f"`tpuserve recover {name}` deletes it and redeploys"
                    if self.node.state in RECOVERABLE_NODE_STATES
                    else f"redeploy: npx cdktf deploy {name}")
            out.append(f"node {self.node.state}; {hint}")
        if self.boot.state == "failed":
            out.append(f"boot failed: {self.boot.reason or 'no reason recorded'}")
        if self.boot.guard.startswith("failed"):
            out.append(f"billing guard {self.boot.guard}: delete the node yourself when done")
        if self.health_ok is False and self.boot.state == "ready":
            out.append(f"server booted but /health fails ({self.health_detail})")
        if (self.served is not None and self.served.reconverge_failed
                and self.served.current is not True and self.boot.state != "failed"):
            out.append(f"the node could not apply the changed config: {self.served.reconverge}")
        return out

    def model(self) -> StatusModel:
        d, n = self.d, self.node
        facts = StatusFacts.of(
            d, deployed=self.deployed, endpoint=self.endpoint, health_ok=self.health_ok,
            health_detail=self.health_detail, spend_usd_per_hour=self.spend_usd_per_hour,
            problems=self.problems, recoverable=self.recoverable)
        at, rule = self.ends_at
        kind = KindJson(
            identity={"node_name": d.node_name},
            state={
                "queued_resource_state": self.qr_state,
                "queued_resource_failure": self.qr.failure if self.qr else None,
                "node_state": n.state if n else None,
                "node_health": n.health if n else None,
                "external_ip": n.external_ip if n else None,
            },
            detail={
                "boot": self.boot.to_json(),
                "created_at": n.create_time.isoformat() if n and n.create_time else None,
                "running_s": _round(self.running_s),
                "usd_per_hour": round(d.usd_per_hour, 4),  # a price here (the fleet: spend)
                "spent_usd": _round(self.spent_usd, 4),
                "ends_at": at.isoformat() if at else None,
                "ends_in_s": _round(self.ends_in_s),
                "end_rule": rule,
                "recoverable": facts.recoverable,
            },
            tail={
                "config": (self.served or ServedConfig(deployed_sha256(d))).to_json(),
                "reconverge": self.reconverge.to_json() if self.reconverge else None,
            },
        )
        return StatusModel(facts, kind, self._table(facts))

    def _table(self, f: StatusFacts) -> StatusTable:
        title = f"[bold]{f.stack}[/] ({f.provisioning_model}, {f.zone})"
        if not f.deployed:
            return StatusTable(title, summary="not deployed", gap_after_summary=False)
        n = self.node
        at, rule = self.ends_at
        state = "node: none"
        if n:
            state = f"node {n.state}" + (f" ({n.health.lower()})"
                                         if n.health != "HEALTH_UNSPECIFIED" else "")
        rows = [
            ("state", self.kind.state_line(self, state)),
            ("health", health_line(f.health_ok, f.health_detail)),
            ("endpoint", f"{f.endpoint}/v1" if f.endpoint else "-"),
            ("boot", self.boot.state + (f": {self.boot.reason}" if self.boot.reason else "")),
        ]
        if n and self.served is not None:
            rows.append(("config", self.served.describe()))
            reconverge = self.served.describe_reconverge()
            if reconverge:
                rows.append(("reconverge", reconverge))
        if self.running_s is not None:
            rows.append(("running", f"{format_duration(self.running_s)} since "
                         f"{n.create_time:%Y-%m-%d %H:%M} UTC" if n and n.create_time else "-"))
            rows.append(("spent", f"${self.spent_usd:,.2f} at ${self.d.usd_per_hour:.4f}/h"))
        if self.billing:
            ends = f"{format_duration(self.ends_in_s)} ({rule})" if at else rule
            rows.append(("ends in", ends))
        phases = SubTable(("boot phase", "at (UTC)", "detail"), [
            (p.label, p.at.strftime("%m-%d %H:%M:%S") if p.at else "-", p.detail)
            for p in self.boot.phases])
        return StatusTable(title, rows=rows, tables=[phases])

    def to_json(self) -> dict[str, Any]:
        return status_json(self.model())


def stack_status(
    d: Deployment,
    *,
    tpu: TpuSource,
    http: httpx.Client,
    now: Now = utcnow,
) -> StackStatus:
    """Ask the TPU API (and the server's /health when there is a READY node) about one stack."""
    qr = tpu.get_queued_resource(ref_for(d)) if node_kind(d).queued else None
    node = tpu.get_node(d)
    boot = BootReport("unknown", "", ())
    attrs: dict[str, str] = {}
    if node is not None and node.state not in ("CREATING", "DELETING"):
        attrs = tpu.guest_attributes(d, NAMESPACE)
        boot = parse_boot(attrs)
    health_ok: bool | None = None
    detail = "not checked: no READY node with an external IP"
    if node is not None and node.state == "READY" and node.external_ip:
        try:
            target = tls.stack_target(d, node.external_ip, attrs)
        except OpsError as exc:
            detail = f"not checked: {exc.message}"
        else:
            health_ok, detail = server.health(http, target)
    served = parse_served(attrs, deployed_sha256(d),
                          booting=boot.state in ("booting", "waiting", "unknown"))
    return StackStatus(d, node, qr, boot, health_ok, detail, now(), served,
                       parse_reconverge(attrs))
