"""`tpuserve wait fleet`: until a replica is Ready, the picker serves and the Gateway has an
address, then /health through it answers 200."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tpuserve.gcp import kube
from tpuserve.render.fleet_bundle import DEPLOYMENT, NAMESPACE
from tpuserve.settings import Deployment

from . import server
from .bounded_http import within
from .errors import EXIT_TIMEOUT, OpsError
from .fleet_gateway import gateway_not_serving, picker_problem, picker_view
from .fleet_status import read_fleet
from .server import ServerTarget


@dataclass(frozen=True)
class FleetWaitResult:
    stack: str
    endpoint: str
    address: str | None
    ready: int
    desired: int
    elapsed_s: float
    phases: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "ready": True, "endpoint": self.endpoint,
                "openai_base_url": self.endpoint + "/v1", "gateway_address": self.address,
                "replicas_ready": self.ready, "replicas_desired": self.desired,
                "elapsed_s": round(self.elapsed_s, 1),
                "phases": {k: round(v, 1) for k, v in self.phases.items()}}


PHASE_REPLICAS, PHASE_PICKER, PHASE_GATEWAY, PHASE_HEALTH = (
    "replicas", "picker", "gateway", "health")


def wait_for_fleet(
    d: Deployment, *, http: httpx.Client, timeout_s: float, poll_s: float,
    on_event: Callable[[str, str, float, bool], None] = lambda *_a: None,
    connect: Callable[[Deployment], kube.Kube] = kube.connect,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> FleetWaitResult:
    """Until >= 1 replica is Ready and the Gateway has an address, then GET /health through
    it answers 200. OpsError exit 3 when TIMEOUT_S passes; exit 1 when there is no Deployment."""
    start = clock()
    done: dict[str, float] = {}
    last: dict[str, str] = {}

    def report(phase: str, state: str, finished: bool = False) -> None:
        elapsed = clock() - start
        if phase in done:
            return
        if finished:
            done[phase] = elapsed
            on_event(phase, state, elapsed, True)
        elif last.get(phase) != state:
            on_event(phase, state, elapsed, False)
        last[phase] = state

    def check_time() -> None:
        elapsed = clock() - start
        if elapsed >= timeout_s:
            phase = next((p for p in (PHASE_REPLICAS, PHASE_PICKER, PHASE_GATEWAY, PHASE_HEALTH)
                          if p not in done), PHASE_HEALTH)
            raise OpsError(f"{d.name}: not serving after {elapsed:.0f} s (timeout); "
                           f"{phase}: {last.get(phase, 'no answer')}",
                           hint=f"`tpuserve status {d.name}` shows each pod and why it waits",
                           exit_code=EXIT_TIMEOUT)

    # The kubeconfig's credential plugin runs in connect(): it ends with the timeout too.
    k = within(timeout_s, lambda: connect(d), lambda: OpsError(
        f"{d.name}: not serving after {timeout_s:g} s (timeout): the kubeconfig's credentials "
        "were still loading", exit_code=EXIT_TIMEOUT))
    k.deadline = time.monotonic() + timeout_s  # every Kubernetes call ends with the timeout
    while True:
        try:
            s = read_fleet(d, k)
        except OpsError:
            check_time()  # a read cut by the timeout: the timeout, and what was last seen
            raise
        k.truncated.clear()
        if s.deployment is None:
            raise OpsError(f"{d.name}: no Deployment {NAMESPACE}/{DEPLOYMENT} in cluster "
                           f"{kube.cluster_name(d)}",
                           hint=f"deploy it: npx cdktf deploy {d.name}")
        waiting = [p for p in s.pods if p.state != "ready"]
        state = f"{s.ready}/{s.desired} ready"
        if waiting:
            p = waiting[0]
            state += f"; {p.name}: {p.state}" + (f" ({p.reason})" if p.reason else "")
        report(PHASE_REPLICAS, state, finished=s.ready >= 1)
        picker_line = picker_problem(s.picker)
        pv = picker_view(s.picker)
        report(PHASE_PICKER, picker_line or f"{pv['ready']}/{pv['desired']} ready",
               finished=picker_line is None)
        not_serving = gateway_not_serving(s.gateway) if s.gateway is not None else [
            "no Gateway yet"]
        base = s.endpoint if s.address and not not_serving else None
        report(PHASE_GATEWAY, "; ".join(not_serving) or s.address or "no address yet",
               finished=base is not None)
        if s.ready >= 1 and base is not None and picker_line is None:
            ok, detail = server.health(http, ServerTarget(base))
            report(PHASE_HEALTH, f"{base}/health {detail}", finished=ok)
            if ok:
                return FleetWaitResult(d.name, base, s.address, s.ready, s.desired,
                                       clock() - start, dict(done))
        check_time()
        sleep(max(0.0, min(poll_s, timeout_s - (clock() - start))))
        check_time()  # no time left for another read: its calls could not even start
