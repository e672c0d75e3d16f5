"""What `tpuserve status` says of one stack, whatever its kind, and its one rendering to JSON.

A kind's status (tpuserve.ops.stack_status for the VM kinds, tpuserve.ops.fleet_status for the
fleet) builds a StatusModel: the facts every kind has (StatusFacts), the kind's own JSON keys
and the lines of its table. `status_json` renders every kind's JSON, `tpuserve.cli.status`
every kind's table, each from the model alone.

Money, in two keys every kind has:
  price_usd_per_hour  one server at the stack's list price (pricing x chips): a VM stack's
                      node, the fleet's replica in its first-choice pool (deployed or not)
  spend_usd_per_hour  what bills now: the VM's price while its node bills (it exists and is not
                      lost), else 0; the fleet's price x its replicas on a TPU node plus its
                      cluster's fee and system node (the cluster answered, so it exists); null
                      when it is not known (the cluster could not be read, the pod list was cut)
The older `usd_per_hour` keeps its kind-dependent meaning: a price for a VM stack, the spend
rate for the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuserve.render.dashboard import stack_dashboard_url
from tpuserve.settings import Deployment


@dataclass(frozen=True)
class StatusFacts:
    """The facts every serving kind has."""

    stack: str
    provisioning_model: str
    project: str
    zone: str
    deployed: bool
    endpoint: str | None  # the server's root URL (no /v1); None until it has one
    health_ok: bool | None  # None: not checked
    health_detail: str
    price_usd_per_hour: float  # one server's
    spend_usd_per_hour: float | None  # billed now; None: not known
    problems: list[str]
    recoverable: bool  # `status --watch --recover` replaces it
    dashboard_url: str

    @classmethod
    def of(cls, d: Deployment, *, deployed: bool, endpoint: str | None, health_ok: bool | None,
           health_detail: str, spend_usd_per_hour: float | None, problems: list[str],
           recoverable: bool) -> StatusFacts:
        """The facts the settings give, and those the kind's status read."""
        return cls(stack=d.name, provisioning_model=d.stack.provisioning_model,
                   project=d.gcp.project, zone=d.gcp.zone, deployed=deployed, endpoint=endpoint,
                   health_ok=health_ok, health_detail=health_detail,
                   price_usd_per_hour=d.usd_per_hour, spend_usd_per_hour=spend_usd_per_hour,
                   problems=problems, recoverable=recoverable,
                   dashboard_url=stack_dashboard_url(d))


@dataclass(frozen=True)
class KindJson:
    """A kind's own `status --json` keys, in the order they sit between the common ones."""

    identity: dict[str, Any] = field(default_factory=dict)  # after stack, ..., zone
    state: dict[str, Any] = field(default_factory=dict)  # after deployed
    detail: dict[str, Any] = field(default_factory=dict)  # after endpoint and health
    tail: dict[str, Any] = field(default_factory=dict)  # after problems


@dataclass(frozen=True)
class SubTable:
    """A table under the facts (boot phases, pods); not shown when it has no rows."""

    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]


@dataclass(frozen=True)
class StatusTable:
    """The lines of one stack in the `tpuserve status` table."""

    title: str  # rich markup
    # Said after the title instead of everything below (not deployed, no credentials).
    summary: str | None = None
    wrap_summary: bool = False
    gap_after_summary: bool = True  # a blank line after it
    # The facts grid (key, value), shown when it has rows; the renderer ends it with the rows
    # every kind has (the dashboard).
    rows: list[tuple[str, str]] = field(default_factory=list)
    tables: list[SubTable] = field(default_factory=list)


@dataclass(frozen=True)
class StatusModel:
    facts: StatusFacts
    json: KindJson
    table: StatusTable


def status_json(m: StatusModel) -> dict[str, Any]:
    """One stack's `status --json` object: today's keys in today's order, then the two money
    keys every kind has."""
    f, k = m.facts, m.json
    return {
        "stack": f.stack,
        "provisioning_model": f.provisioning_model,
        "project": f.project,
        "zone": f.zone,
        **k.identity,
        "deployed": f.deployed,
        **k.state,
        "endpoint": f.endpoint,
        "health": {"ok": f.health_ok, "detail": f.health_detail},
        **k.detail,
        "problems": f.problems,
        **k.tail,
        "dashboard_url": f.dashboard_url,
        "price_usd_per_hour": round(f.price_usd_per_hour, 4),
        "spend_usd_per_hour": round_or_none(f.spend_usd_per_hour, 4),
    }


def round_or_none(x: float | None, nd: int = 1) -> float | None:
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


def health_line(ok: bool | None, detail: str) -> str:
    """The table's health value: the detail alone when not checked."""
    return detail if ok is None else f"{'ok' if ok else 'failing'} ({detail})"
