"""`tpuserve status [STACK] [--watch [--recover]]`."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tpuserve.gcp import kube
from tpuserve.ops import fleet_status, recovery
from tpuserve.ops.fleet_status import FleetStatus
from tpuserve.ops.server import http_client
from tpuserve.ops.stack_status import (
    HEALTH_TIMEOUT_S,
    StackStatus,
    format_duration,
    stack_status,
)
from tpuserve.render.dashboard import dashboard_url

from . import common
from .common import JsonOpt, command, console, emit_json, log


def _facts(s: StackStatus) -> list[tuple[str, str]]:
    n = s.node
    at, rule = s.ends_at
    state = "node: none"
    if n:
        state = f"node {n.state}" + (f" ({n.health.lower()})" if n.health != "HEALTH_UNSPECIFIED"
                                     else "")
    if s.is_flex:
        state = f"queued resource {s.qr_state}, {state}"
    health = s.health_detail if s.health_ok is None else (
        f"{'ok' if s.health_ok else 'failing'} ({s.health_detail})")
    rows = [
        ("state", state),
        ("health", health),
        ("endpoint", f"{s.endpoint}/v1" if s.endpoint else "-"),
        ("boot", s.boot.state + (f": {s.boot.reason}" if s.boot.reason else "")),
    ]
    if n and s.served is not None:
        rows.append(("config", s.served.describe()))
        reconverge = s.served.describe_reconverge()
        if reconverge:
            rows.append(("reconverge", reconverge))
    if s.running_s is not None:
        rows.append(("running", f"{format_duration(s.running_s)} since "
                     f"{n.create_time:%Y-%m-%d %H:%M} UTC" if n and n.create_time else "-"))
        rows.append(("spent", f"${s.spent_usd:,.2f} at ${s.d.usd_per_hour:.4f}/h"))
    if s.billing:
        ends = f"{format_duration(s.ends_in_s)} ({rule})" if at else rule
        rows.append(("ends in", ends))
    rows.append(("dashboard", dashboard_url(s.d.gcp.project, s.d.gcp.deployment)))
    return rows


def _fleet_facts(s: FleetStatus) -> list[tuple[str, str]]:
    status = s.deployment.get("status") if isinstance(s.deployment, dict) else None
    updated = status.get("updatedReplicas", 0) if isinstance(status, dict) else 0
    rows = [("replicas", f"{s.ready}/{s.desired} ready ({updated} updated)")]
    if s.hpa is None:
        rows.append(("autoscaler", "no HorizontalPodAutoscaler"))
    else:
        h = s.hpa
        rows.append(("autoscaler", (f"{h.current_replicas} current, {h.desired_replicas} desired "
                     f"(min {h.min_replicas}, max {h.max_replicas})")))
        for m in h.metrics:
            cur = "unknown" if m.current is None else f"{m.current:g}"
            tgt = "?" if m.target is None else f"{m.target:g}"
            # prometheus.googleapis.com|vllm:num_requests_waiting|gauge: the middle part
            name = m.name.split("|")[1] if m.name.count("|") == 2 else m.name
            rows.append(("metric", f"{name}: {cur} / target {tgt} ({m.target_type})"))
    conds = ", ".join(f"{c['type']}={c['status']}"
                      for c in fleet_status.gateway_conditions(s.gateway)
                      if c["type"] in ("Accepted", "Programmed"))
    rows.append(("gateway", (s.address or "no address yet") + (f" ({conds})" if conds else "")))
    p = fleet_status.picker_view(s.picker)
    rows.append(("picker", f"{p['ready']}/{p['desired']} ready ({p['image'] or 'no Deployment'})"))
    rows.append(("endpoint", f"{s.endpoint}/v1" if s.endpoint else "-"))
    rows.append(("health", s.health_detail if s.health_ok is None else
                 f"{'ok' if s.health_ok else 'failing'} ({s.health_detail})"))
    pending = {k: v for k, v in s.to_json()["pending"].items() if v}
    if pending:
        rows.append(("pending", ", ".join(f"{v} {k}" for k, v in pending.items())))
    rows.append(("cost", (f"${s.usd_per_hour:,.4f}/h: {s.billed_replicas} replica(s) on TPU "
                 f"nodes at ${s.d.usd_per_hour:.4f}/h ({s.d.fleet.provisioning[0]} price)")))
    rows.extend(("truncated", f"{what}: only the first {kube.MAX_LIST_ITEMS} read")
                for what in s.truncated)
    rows.append(("dashboard", dashboard_url(s.d.gcp.project, s.d.gcp.deployment)))
    return rows


def render_fleet(s: FleetStatus) -> None:
    d = s.d
    title = (f"[bold]{d.name}[/] (GKE cluster {kube.cluster_name(d)}, {d.gcp.zone})")
    if s.no_credentials:
        console.print(f"{title}: not deployed, or no credentials for it: "
                      f"{kube.credentials_command(d)}", soft_wrap=True)
        console.print()
        return
    if s.error is None and not s.deployed:
        console.print(f"{title}: not deployed")
        console.print()
        return
    console.print(title)
    if s.error is None:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(overflow="fold")
        for key, value in _fleet_facts(s):
            grid.add_row(key, value)
        console.print(grid)
    if s.pods:
        pods = Table("pod", "phase", "state", "why", show_edge=False)
        for p in s.pods:
            pods.add_row(p.name, p.phase, p.state, p.reason or "-")
        console.print(pods)
    for problem in s.problems:
        console.print(f"[bold red]problem:[/] {problem}", soft_wrap=True, markup=True,
                      highlight=False)
    console.print()


def render(statuses: list[StackStatus | FleetStatus]) -> None:
    for s in statuses:
        if isinstance(s, FleetStatus):
            render_fleet(s)
            continue
        title = f"[bold]{s.d.name}[/] ({s.d.stack.provisioning_model}, {s.d.gcp.zone})"
        if not s.deployed:
            console.print(f"{title}: not deployed")
            continue
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(overflow="fold")
        for key, value in _facts(s):
            grid.add_row(key, value)
        console.print(title)
        console.print(grid)
        if s.boot.phases:
            phases = Table("boot phase", "at (UTC)", "detail", show_edge=False)
            for p in s.boot.phases:
                phases.add_row(p.label, p.at.strftime("%m-%d %H:%M:%S") if p.at else "-",
                               p.detail)
            console.print(phases)
        for problem in s.problems:
            console.print(f"[bold red]problem:[/] {problem}", soft_wrap=True)
        console.print()


def gather(stack: str | None) -> list[StackStatus | FleetStatus]:
    found = common.deployments()
    names = [common.load_stack(stack).name] if stack else list(found)
    # The fleet is read from its cluster (a stack named on the command line: its errors are
    # the command's; among every stack: that stack's problem).
    tpu = common.tpu_api() if any(not found[n].is_fleet for n in names) else None
    with http_client(HEALTH_TIMEOUT_S) as http:
        return [fleet_status.fleet_status(found[n], http=http, strict=stack is not None)
                if found[n].is_fleet else stack_status(found[n], tpu=tpu, http=http)
                for n in names]


@command
def status(
    stack: Annotated[str | None, typer.Argument(help="One stack; all configured stacks when "
                                                "omitted.", show_default=False)] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes (--watch).",
                                            min=0)] = 60.0,
    iterations: Annotated[int, typer.Option(help="Stop after this many refreshes (--watch; "
                                            "0: until Ctrl-C).", min=0)] = 0,
    recover: Annotated[bool, typer.Option(
        "--recover", help="With --watch: replace a PREEMPTED spot node or a SUSPENDED/FAILED "
        "flex queued resource as soon as it is seen (off by default: a flex run that reached "
        "its max run duration is SUSPENDED by design, and replacing it restarts billing).",
    )] = False,
    retries: Annotated[int, typer.Option(help="Recovery attempts per incident.", min=1)] = (
        recovery.DEFAULT_RETRIES
    ),
    json_output: JsonOpt = False,
) -> None:
    """Node (and queued resource) state, health, endpoint, boot phases, time running, money
    spent and time left, for each deployed stack. Also the config the server runs with against
    the deployed one. The fleet: replicas ready/desired, the autoscaler's metric against its
    target, the Gateway's address, each pod's state and why a pending pod waits (capacity,
    quota, compiling), and $/hour at the current replicas. Exits 1 when a deployed stack has a
    problem."""
    if recover and not watch:
        raise typer.BadParameter("--recover needs --watch (or use `tpuserve recover STACK`)")
    if not watch:
        statuses = gather(stack)
        if json_output:
            emit_json({"stacks": [s.to_json() for s in statuses]})
        else:
            render(statuses)
        if any(s.problems for s in statuses):
            raise typer.Exit(1)
        return
    n = 0
    try:
        while True:
            n += 1
            statuses = gather(stack)
            if json_output:
                emit_json({"iteration": n, "stacks": [s.to_json() for s in statuses]},
                          line=True)
            else:
                if console.is_terminal:
                    console.clear()
                console.print(time.strftime("%Y-%m-%d %H:%M:%S"), f"(every {interval:g} s, "
                              "Ctrl-C to stop)")
                render(statuses)
            if recover:
                for s in statuses:
                    if s.recoverable:
                        log(f"{s.d.name}: {s.problems[0] if s.problems else 'recoverable'}; "
                            "recovering")
                        recovery.recover(s.d, tpu=common.tpu_api(),
                                         deploy=common.deploy_runner(), retries=retries,
                                         log=log)
            if iterations and n >= iterations:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        log("stopped")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
