"""Where one deployed stack stands: node (and queued resource), boot, health, time and money."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.gcp.tpu.queued_resources import (
    DEAD_STATES,
    KNOWN_STATES,
    MISSING,
    QueuedResource,
    ref_for,
)
from tpuserve.planner.arithmetic import cost_for_hours
from tpuserve.render.dashboard import dashboard_url
from tpuserve.settings import Deployment
from tpuserve.settings.base import parse_duration

from . import server, tls
from .boot_phases import NAMESPACE, BootReport, parse_boot, parse_time
from .errors import OpsError
from .reconverge import Reconverge, parse_reconverge
from .served_config import ServedConfig, deployed_sha256, parse_served

# Node states that end a node's life: only a new node (a redeploy) brings the server back.
LOST_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING"})
# Spot: issue 5's recover deletes and redeploys. A TERMINATED spot VM cannot be started again,
# so it is recovered the same way as a PREEMPTED one (issue 11).
RECOVERABLE_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED"})
RECOVERABLE_QR_STATES = frozenset({"SUSPENDED", "FAILED"})  # flex: issue 5's recover
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
    def is_flex(self) -> bool:
        return self.d.stack.provisioning_model == "flex"

    @property
    def qr_state(self) -> str | None:
        if not self.is_flex:
            return None
        return self.qr.state if self.qr else MISSING

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
    def ends_at(self) -> tuple[dt.datetime | None, str]:
        """When the node stops billing by itself, and the rule that says so."""
        created = self.node.create_time if self.node else None
        if self.is_flex:
            run = (self.qr.raw.get("runDuration") or {}) if self.qr else {}
            if run.get("terminationTime"):
                return parse_time(str(run["terminationTime"])), "flex termination time"
            text = str(run.get("maxRunDuration") or "")
            seconds = float(text[:-1]) if text.endswith("s") else parse_duration(
                self.d.stack.max_run_duration
            )
            rule = f"flex max run duration {format_duration(seconds)}"
            return (created + dt.timedelta(seconds=seconds) if created else None), rule
        hours = self.d.stack.max_run_hours
        if self.boot.guard_deadline is not None:
            return self.boot.guard_deadline, "billing guard"
        if hours <= 0:
            return None, "none: billing guard off (stack.max_run_hours = 0)"
        if created is None:
            return None, f"billing guard {hours:g} h"
        # The guard's Cloud Tasks task fires at exactly this time (tpuserve.gcp.billing_guard);
        # nodes booted by an older script may still report their own deadline (above).
        return created + dt.timedelta(hours=hours), (
            f"billing guard {hours:g} h (createTime + max_run_hours)")

    @property
    def ends_in_s(self) -> float | None:
        if not self.billing:
            return None
        at, _ = self.ends_at
        return None if at is None else (at - self.now).total_seconds()

    @property
    def recoverable(self) -> bool:
        if self.is_flex:
            return self.qr is not None and self.qr.state in RECOVERABLE_QR_STATES
        return self.node is not None and self.node.state in RECOVERABLE_NODE_STATES

    @property
    def problems(self) -> list[str]:
        out: list[str] = []
        name = self.d.name
        if self.is_flex and self.qr is not None and self.qr.state in DEAD_STATES:
            why = f": {self.qr.failure}" if self.qr.failure else ""
            out.append(
                f"queued resource {self.qr.state}{why}; `tpuserve recover {name}` replaces it"
            )
        if self.is_flex and self.qr is not None and self.qr.state not in KNOWN_STATES:
            out.append(
                f"queued resource state unknown ({self.qr.state}): neither live nor dead as "
                "far as tpuserve can tell; nothing is replaced; check again in a minute"
            )
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

    def to_json(self) -> dict[str, Any]:
        at, rule = self.ends_at
        n = self.node
        return {
            "stack": self.d.name,
            "provisioning_model": self.d.stack.provisioning_model,
            "project": self.d.gcp.project,
            "zone": self.d.gcp.zone,
            "node_name": self.d.node_name,
            "deployed": self.deployed,
            "queued_resource_state": self.qr_state,
            "queued_resource_failure": self.qr.failure if self.qr else None,
            "node_state": n.state if n else None,
            "node_health": n.health if n else None,
            "external_ip": n.external_ip if n else None,
            "endpoint": self.endpoint,
            "health": {"ok": self.health_ok, "detail": self.health_detail},
            "boot": self.boot.to_json(),
            "created_at": n.create_time.isoformat() if n and n.create_time else None,
            "running_s": _round(self.running_s),
            "usd_per_hour": round(self.d.usd_per_hour, 4),
            "spent_usd": _round(self.spent_usd, 4),
            "ends_at": at.isoformat() if at else None,
            "ends_in_s": _round(self.ends_in_s),
            "end_rule": rule,
            "recoverable": self.recoverable,
            "problems": self.problems,
            "config": (self.served or ServedConfig(deployed_sha256(self.d))).to_json(),
            "reconverge": self.reconverge.to_json() if self.reconverge else None,
            "dashboard_url": dashboard_url(self.d.gcp.project, self.d.gcp.deployment),
        }


def _round(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = int(abs(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{sign}{d}d{h:02d}h"
    if h:
        return f"{sign}{h}h{m:02d}m"
    if m:
        return f"{sign}{m}m{s:02d}s"
    return f"{sign}{s}s"


def stack_status(
    d: Deployment,
    *,
    tpu: TpuSource,
    http: httpx.Client,
    now: Now = utcnow,
) -> StackStatus:
    """Ask the TPU API (and the server's /health when there is a READY node) about one stack."""
    qr = tpu.get_queued_resource(ref_for(d)) if d.stack.provisioning_model == "flex" else None
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
