"""The fleet's pods: each one's state and why it is not serving (status, conditions, events).

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
from dataclasses import dataclass
from typing import Any

from tpuserve.render.fleet_bundle import APP_LABEL

from .errors import one_line
from .kube_fields import as_int as _int
from .kube_fields import dig as _d
from .kube_fields import dig_list as _list

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


