"""The fleet stack as the CLI sees it: replicas, the autoscaler, the Gateway, each pod's state.

The VM stacks are found through the TPU API (a node, its external IP, a pinned certificate);
the fleet through its cluster's API (tpuserve.ops.kube) and the Gateway's address. Its
endpoint is `http://ADDRESS` (the Gateway's HTTP listener), or `https://DOMAIN` with
`fleet.domain` (a Google-managed certificate: the system's CAs verify it, nothing is pinned).

Why a pod is not serving, from its status, conditions and events:
  capacity    unscheduled: no TPU node yet (the cluster autoscaler is scaling up, a flex-start
              request is waiting for capacity, the zone is out of chips, the pool is at max)
  quota       unscheduled: a scale-up failed on quota (GCE quota, GPUS_ALL_REGIONS, TPU quota)
  unschedulable  unscheduled for another reason (the message says which)
  restoring   an init container runs (the XLA cache restore)
  starting    containers are being created (image pull)
  compiling   vLLM runs but its startup probe has not passed: weights load, XLA compiles
  not ready   started, readiness failing
  failing     a container is crash-looping or cannot start
  ready       serving
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tpuserve.gcp import kube
from tpuserve.render.dashboard import dashboard_url
from tpuserve.render.fleet_bundle import APP_LABEL, DEPLOYMENT, EPP, GATEWAY, HPA, NAMESPACE
from tpuserve.settings import Deployment

from . import server
from .bounded_http import within
from .errors import EXIT_TIMEOUT, EXIT_USAGE, OpsError, one_line
from .server import ServerTarget

# Pending pods whose events are read (one list call each).
MAX_EVENT_LOOKUPS = 10
EVENTS_PER_POD = 50
_QUOTA = re.compile(r"quota|GPUS_ALL_REGIONS", re.I)
_CAPACITY = re.compile(
    r"no nodes available|nodes are available|insufficient google\.com/tpu|scale[- ]?up|"
    r"flex|out of resources|stockout|resource pool exhausted|ZONE_RESOURCE_POOL_EXHAUSTED|"
    r"max node group size|waiting for|provisioning", re.I)
_CAPACITY_REASONS = {"FailedScaleUp", "TriggeredScaleUp", "NotTriggerScaleUp"}
_FAILING = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
            "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
VLLM_CONTAINER = "vllm"


def label_selector() -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(APP_LABEL.items()))


def parse_quantity(text: object) -> float | None:
    """A Kubernetes quantity ('3', '3500m', '1.5k', '2Ki') as a number; None if it is not one."""
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", text.strip())
    if not m:
        return None
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10,
             "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    try:
        return float(m.group(1)) * scale
    except ValueError:
        return None


def _d(obj: Any, *path: str) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


def _list(obj: Any, *path: str) -> list[Any]:
    value = _d(obj, *path)
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ------------------------------------------------------------------ pods


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str
    ready: bool
    state: str  # see the module docstring
    reason: str  # one line: why (the scheduler's or autoscaler's message, a container reason)
    node: str | None
    restarts: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "ready": self.ready,
                "state": self.state, "reason": self.reason, "node": self.node,
                "restarts": self.restarts}


def unscheduled(pod: dict[str, Any]) -> bool:
    if _d(pod, "status", "phase") != "Pending" or _d(pod, "spec", "nodeName"):
        return False
    sched = next((c for c in _list(pod, "status", "conditions")
                  if isinstance(c, dict) and c.get("type") == "PodScheduled"), None)
    return sched is None or sched.get("status") != "True"


def _newest_first(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def when(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or
                   _d(e, "metadata", "creationTimestamp") or "")

    return sorted(events, key=when, reverse=True)


def classify(pod: dict[str, Any], events: list[dict[str, Any]]) -> PodView:
    """One pod's state and why (its events: those whose involvedObject is the pod)."""
    st = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    phase = str(st.get("phase") or "Unknown")
    conds = {c.get("type"): c for c in _list(st, "conditions") if isinstance(c, dict)}
    ready = _d(conds, "Ready", "status") == "True"
    restarts = sum(_int(c.get("restartCount")) for c in _list(st, "containerStatuses")
                   if isinstance(c, dict))
    view = {"name": str(_d(pod, "metadata", "name") or "?"), "phase": phase, "ready": ready,
                "node": _d(pod, "spec", "nodeName") or None, "restarts": restarts}

    def out(state: str, reason: object = "") -> PodView:
        return PodView(state=state, reason=one_line(reason or "", 240), **view)

    if _d(pod, "metadata", "deletionTimestamp"):
        return out("terminating")
    if phase in ("Succeeded", "Failed"):
        return out(phase.lower(), st.get("message") or st.get("reason") or "")
    if unscheduled(pod):
        sched_msg = str(_d(conds, "PodScheduled", "message") or "")
        texts = [(str(e.get("reason") or ""), str(e.get("message") or ""))
                 for e in _newest_first(events)]
        texts.append(("Unschedulable", sched_msg))
        quota = next((f"{r}: {m}" for r, m in texts if _QUOTA.search(m)), None)
        if quota:
            return out("quota", quota)
        capacity = next((f"{r}: {m}" for r, m in texts
                         if r in _CAPACITY_REASONS or _CAPACITY.search(m)), None)
        if capacity:
            return out("capacity", capacity)
        return out("unschedulable", sched_msg or "not scheduled yet")
    for c in _list(st, "initContainerStatuses"):
        if not isinstance(c, dict):
            continue
        waiting = _d(c, "state", "waiting")
        if isinstance(waiting, dict) and waiting.get("reason") in _FAILING:
            return out("failing", f"init container {c.get('name')}: {waiting.get('reason')}: "
                       f"{waiting.get('message') or ''}")
        if _d(c, "state", "running") is not None:
            return out("restoring", f"init container {c.get('name')} running")
    containers = [c for c in _list(st, "containerStatuses") if isinstance(c, dict)]
    for c in containers:
        waiting = _d(c, "state", "waiting")
        if isinstance(waiting, dict) and waiting.get("reason") in _FAILING:
            last = _d(c, "lastState", "terminated")
            why = f"exit {last.get('exitCode')}" if isinstance(last, dict) else ""
            return out("failing", f"{c.get('name')}: {waiting.get('reason')}"
                       + (f" ({why})" if why else "")
                       + (f": {waiting.get('message')}" if waiting.get("message") else ""))
    if ready:
        return out("ready")
    if phase == "Pending" or any(isinstance(_d(c, "state", "waiting"), dict)
                                 for c in containers):
        waiting = next((_d(c, "state", "waiting") for c in containers
                        if isinstance(_d(c, "state", "waiting"), dict)), {})
        return out("starting", waiting.get("reason") or "containers being created")
    vllm = next((c for c in containers if c.get("name") == VLLM_CONTAINER), None)
    if vllm is not None and _d(vllm, "state", "running") is not None and not vllm.get("started"):
        return out("compiling", "vLLM running, startup probe not passed yet (loading weights, "
                   "compiling XLA graphs; a cold boot takes ~14 min)")
    return out("not ready", str(_d(conds, "Ready", "message") or "readiness probe failing"))


# ------------------------------------------------------------------ the HPA


@dataclass(frozen=True)
class MetricView:
    name: str
    kind: str  # Pods, External, Object, Resource
    current: float | None
    target: float | None
    target_type: str  # AverageValue, Value, Utilization

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "current": self.current,
                "target": self.target, "target_type": self.target_type}


@dataclass(frozen=True)
class HpaView:
    min_replicas: int
    max_replicas: int
    current_replicas: int
    desired_replicas: int
    metrics: list[MetricView]

    def to_json(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "current_replicas": self.current_replicas,
                "desired_replicas": self.desired_replicas,
                "metrics": [m.to_json() for m in self.metrics]}


def _metric_source(m: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    kind = str(m.get("type") or "")
    key = kind[:1].lower() + kind[1:]  # Pods -> pods, ContainerResource -> containerResource
    src = m.get(key) if isinstance(m.get(key), dict) else {}
    name = _d(src, "metric", "name") or src.get("name") or "?"
    return kind, str(name), src


def _value(block: Any) -> tuple[float | None, str]:
    if not isinstance(block, dict):
        return None, ""
    if "averageUtilization" in block:
        return parse_quantity(block.get("averageUtilization")), "Utilization"
    for key, label in (("averageValue", "AverageValue"), ("value", "Value")):
        if key in block:
            return parse_quantity(block.get(key)), label
    return None, str(block.get("type") or "")


def hpa_view(obj: dict[str, Any]) -> HpaView:
    current = {}
    for m in _list(obj, "status", "currentMetrics"):
        if isinstance(m, dict):
            kind, name, src = _metric_source(m)
            current[(kind, name)] = _value(src.get("current"))[0]
    metrics = []
    for m in _list(obj, "spec", "metrics")[:10]:
        if isinstance(m, dict):
            kind, name, src = _metric_source(m)
            target, ttype = _value(src.get("target"))
            metrics.append(MetricView(name, kind, current.get((kind, name)), target, ttype))
    return HpaView(
        min_replicas=_int(_d(obj, "spec", "minReplicas")) or 1,
        max_replicas=_int(_d(obj, "spec", "maxReplicas")),
        current_replicas=_int(_d(obj, "status", "currentReplicas")),
        desired_replicas=_int(_d(obj, "status", "desiredReplicas")),
        metrics=metrics,
    )


# ------------------------------------------------------------------ the Gateway


def gateway_address(gw: dict[str, Any] | None) -> str | None:
    for a in _list(gw, "status", "addresses"):
        if isinstance(a, dict) and isinstance(a.get("value"), str) and a["value"].strip():
            return a["value"].strip()
    return None


def _listener_port(gw: dict[str, Any] | None, protocol: str) -> int | None:
    for ln in _list(gw, "spec", "listeners"):
        if isinstance(ln, dict) and ln.get("protocol") == protocol and _int(ln.get("port")):
            return _int(ln.get("port"))
    return None


def endpoint_url(d: Deployment, gw: dict[str, Any] | None) -> str | None:
    """The server's root URL through the Gateway (no /v1); None until it has an address
    (without a domain)."""
    if d.fleet.domain:
        port = _listener_port(gw, "HTTPS")
        return f"https://{d.fleet.domain}" + (f":{port}" if port not in (None, 443) else "")
    address = gateway_address(gw)
    if address is None:
        return None
    host = f"[{address}]" if ":" in address else address
    port = _listener_port(gw, "HTTP")
    return f"http://{host}" + (f":{port}" if port not in (None, 80) else "")


def gateway_conditions(gw: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The Gateway's status conditions as {type, status, reason, message} (strings)."""
    return [{k: str(c.get(k) or "") for k in ("type", "status", "reason", "message")}
            for c in _list(gw, "status", "conditions") if isinstance(c, dict)]


def gateway_not_serving(gw: dict[str, Any] | None) -> list[str]:
    """A line per condition the Gateway needs and has not True (Accepted, Programmed): an
    absent condition proves nothing and counts as not True."""
    by_type = {c["type"]: c for c in gateway_conditions(gw)}
    out = []
    for kind in ("Accepted", "Programmed"):
        c = by_type.get(kind)
        if c is None:
            out.append(f"Gateway {NAMESPACE}/{GATEWAY}: no {kind} condition yet")
        elif c["status"] != "True":
            why = ": ".join(x for x in (c["reason"], one_line(c["message"], 160)) if x)
            out.append(f"Gateway {NAMESPACE}/{GATEWAY}: {kind} is {c['status'] or 'unset'}"
                       + (f" ({why})" if why else ""))
    return out


def picker_view(dep: dict[str, Any] | None) -> dict[str, Any]:
    """The endpoint picker's Deployment as {name, ready, desired, image}."""
    containers = _list(dep, "spec", "template", "spec", "containers")
    image = next((c.get("image") for c in containers
                  if isinstance(c, dict) and c.get("name") == "epp"), None)
    return {"name": EPP, "ready": _int(_d(dep, "status", "readyReplicas")),
            "desired": _int(_d(dep, "spec", "replicas")),
            "image": image if isinstance(image, str) else None}


def picker_problem(dep: dict[str, Any] | None) -> str | None:
    v = picker_view(dep)
    if dep is None:
        return (f"no endpoint picker Deployment {NAMESPACE}/{EPP}: the Gateway's InferencePool "
                "has no picker and answers nothing (re-apply: npx cdktf deploy fleet)")
    if v["desired"] < 1 or v["ready"] < v["desired"]:
        return (f"endpoint picker {NAMESPACE}/{EPP}: {v['ready']}/{v['desired']} ready; with "
                "failureMode FailClose the Gateway answers nothing without it (`kubectl -n "
                f"{NAMESPACE} logs deploy/{EPP}`)")
    return None


def programmed(gw: dict[str, Any] | None) -> bool | None:
    for c in _list(gw, "status", "conditions"):
        if isinstance(c, dict) and c.get("type") == "Programmed":
            return c.get("status") == "True"
    return None


# ------------------------------------------------------------------ the whole fleet


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

    def to_json(self) -> dict[str, Any]:
        d = self.d
        status = _d(self.deployment, "status") or {}
        return {
            "stack": d.name,
            "provisioning_model": d.stack.provisioning_model,
            "project": d.gcp.project,
            "zone": d.gcp.zone,
            "cluster": kube.cluster_name(d),
            "kube_context": kube.context_name(d),
            "deployed": self.deployed,
            "replicas": {"desired": self.desired, "ready": self.ready,
                         "updated": _int(status.get("updatedReplicas")),
                         "available": _int(status.get("availableReplicas"))},
            "autoscaler": self.hpa.to_json() if self.hpa else None,
            "gateway": {"name": GATEWAY, "address": self.address,
                        "programmed": programmed(self.gateway),
                        "conditions": gateway_conditions(self.gateway)}
            if self.gateway else None,
            "picker": picker_view(self.picker) if self.deployed else None,
            "endpoint": self.endpoint,
            "health": {"ok": self.health_ok, "detail": self.health_detail},
            "pods": [p.to_json() for p in self.pods],
            "pending": {s: sum(1 for p in self.pods if p.state == s)
                        for s in ("capacity", "quota", "unschedulable")},
            "billed_replicas": self.billed_replicas,
            "usd_per_replica_hour": round(d.usd_per_hour, 4),
            "usd_per_hour": round(self.usd_per_hour, 4),
            "truncated": self.truncated,
            "problems": self.problems,
            "dashboard_url": dashboard_url(self.d.gcp.project, self.d.gcp.deployment),
        }


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


# ------------------------------------------------------------------ smoke, bench: the target


def fleet_target(d: Deployment, api_key: str | None, *, key_hint: str, pinned: bool = False,
                 connect: Callable[[Deployment], kube.Kube] = kube.connect) -> ServerTarget:
    """The fleet's endpoint as a server: plain HTTP, or https to the domain verified with the
    system's CAs (no pinned certificate: the Gateway's is Google-managed). PINNED: the user
    gave --fingerprint or --cacert, which go with --endpoint."""
    if pinned:
        raise OpsError("--fingerprint and --cacert go with --endpoint; the fleet's Gateway "
                       "serves plain HTTP or a Google-managed certificate (nothing to pin)",
                       exit_code=EXIT_USAGE)
    k = connect(d)
    if k.deployment(NAMESPACE, DEPLOYMENT) is None:
        raise OpsError(f"{d.name}: no Deployment {NAMESPACE}/{DEPLOYMENT} in cluster "
                       f"{kube.cluster_name(d)}", hint=f"deploy it: npx cdktf deploy {d.name}")
    base = endpoint_url(d, k.gateway(NAMESPACE, GATEWAY))
    if base is None:
        raise OpsError(f"{d.name}: the Gateway {NAMESPACE}/{GATEWAY} has no address yet",
                       hint=f"`tpuserve wait {d.name}` blocks until it serves")
    if d.access.api_key_proxy and not api_key:
        raise OpsError(f"{d.name}: the API-key proxy is on and no key was given",
                       hint=key_hint, exit_code=EXIT_USAGE)
    return ServerTarget(base, api_key or None)


# ------------------------------------------------------------------ wait


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
