"""A fake Kubernetes API server on 127.0.0.1 (plain HTTP): the reads the fleet's CLI makes.

Serves exactly these documented REST paths (kubernetes.io/docs/reference/kubernetes-api/ and
gateway-api.sigs.k8s.io/reference/spec/), GET only, and nothing else (404 with the API server's
bare "404 page not found", as for a path no API group serves):

  /apis/apps/v1/namespaces/NS/deployments/NAME
  /apis/autoscaling/v2/namespaces/NS/horizontalpodautoscalers/NAME
  /apis/gateway.networking.k8s.io/v1/namespaces/NS/gateways/NAME
  /apis/apiextensions.k8s.io/v1/customresourcedefinitions/NAME   (cluster-scoped)
  /api/v1/namespaces/NS/pods       ?labelSelector=k=v[,k=v]  &limit=N  (&continue=T)
  /api/v1/namespaces/NS/events     ?fieldSelector=f=v[,f=v]  &limit=N  (&continue=T)

Every request needs `Authorization: Bearer <token>` (401 Status otherwise); `forbidden` makes
every read a 403 Status naming the verb and resource, as RBAC answers. A query parameter other
than the ones listed is a 400 (the client must not drift); a field selector on a field the
events API does not index is a 400 with the API's "field label not supported" message. A named
object that is absent is a 404 Status `<resource>.<group> "<name>" not found`. Lists honour
`limit` with a `continue` token. `stall_s`: hold every request that long before answering (a
server that accepts and does not answer); `faults` (FaultQueue) for anything else.

Seed objects with `put(obj)`: its kind, metadata.namespace and metadata.name place it. The
builders below make the objects the fleet serves (Deployment, HPA, Gateway, pods, events).
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import parse_qsl

from werkzeug import Request, Response

from tests.fakes.metadata import FaultQueue, LoopbackServer

# kind -> (URL prefix, plural, group for messages, namespaced get or list)
_GETS = {
    ("apps/v1", "deployments"): ("Deployment", "deployments.apps"),
    ("autoscaling/v2", "horizontalpodautoscalers"): ("HorizontalPodAutoscaler",
                                                     "horizontalpodautoscalers.autoscaling"),
    ("gateway.networking.k8s.io/v1", "gateways"): ("Gateway",
                                                   "gateways.gateway.networking.k8s.io"),
}
_LISTS = {"pods": ("Pod", "labelSelector"), "events": ("Event", "fieldSelector")}
# Fields the events API indexes (a field selector on any other is a 400).
EVENT_FIELDS = frozenset({
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
    "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
    "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
    "metadata.name", "metadata.namespace",
})


def status(code: int, reason: str, message: str, **details: Any) -> Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return Response(json.dumps(body), code, mimetype="application/json")


def not_found_page() -> Response:
    return Response("404 page not found\n", 404, mimetype="text/plain")


def _selector(text: str) -> dict[str, str] | None:
    """'a=b,c==d' -> {a: b, c: d}; None when it is not an equality selector."""
    out: dict[str, str] = {}
    for term in text.split(","):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep or not key.strip() or "!" in key:
            return None
        out[key.strip()] = value.strip()
    return out


def _field(obj: dict[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if dotted == "source" and isinstance(cur, dict):
        return cur.get("component")
    return cur


class FakeKubernetes:
    def __init__(self, *, token: str = "fake-kube-token") -> None:
        self.token = token
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name)
        self.requests: list[tuple[str, str, str]] = []  # (method, path, query)
        self.forbidden = False
        self.stall_s = 0.0
        self.faults = FaultQueue()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    # -- lifecycle
    def start(self) -> FakeKubernetes:
        self.server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.server.stop()

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def kubeconfig(self, context: str, *, token: str | None = None) -> str:
        """A kubeconfig (JSON is YAML) whose CONTEXT points at this server with the token."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": token or self.token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        })

    # -- objects
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A namespaced object by its namespace, a cluster-scoped one (a CRD) under ""."""
        meta = obj["metadata"]
        with self._lock:
            self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self.objects.pop((kind, namespace, name), None)

    def of_kind(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return [o for (k, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0])
                    if k == kind and ns == namespace]

    # -- HTTP
    def _handle(self, request: Request) -> Response:
        self.requests.append((request.method, request.path,
                              request.query_string.decode(errors="replace")))
        if self.stall_s:
            self._stopping.wait(self.stall_s)
        fault = self.faults.take(request)
        if fault is not None:
            return fault
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        if request.method != "GET":
            return status(405, "MethodNotAllowed",
                          f"the server does not allow this method on the requested resource "
                          f"({request.method})")
        parts = request.path.strip("/").split("/")
        # /apis/apiextensions.k8s.io/v1/customresourcedefinitions/NAME (cluster-scoped)
        if parts[:4] == ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions"] \
                and len(parts) == 5:
            if request.args:
                return status(400, "BadRequest",
                              f"unknown query parameters: {', '.join(sorted(request.args))}")
            if self.forbidden:
                return status(403, "Forbidden",
                              'customresourcedefinitions.apiextensions.k8s.io "' + parts[4]
                              + '" is forbidden: User "someone@example.com" cannot get '
                              'resource "customresourcedefinitions" in API group '
                              '"apiextensions.k8s.io" at the cluster scope',
                              kind="customresourcedefinitions")
            obj = self.objects.get(("CustomResourceDefinition", "", parts[4]))
            if obj is None:
                return status(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io'
                              f' "{parts[4]}" not found', name=parts[4],
                              group="apiextensions.k8s.io", kind="customresourcedefinitions")
            return Response(json.dumps(obj), 200, mimetype="application/json")
        # /apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME
        if len(parts) == 7 and parts[0] == "apis" and parts[3] == "namespaces":
            entry = _GETS.get((f"{parts[1]}/{parts[2]}", parts[5]))
            if entry is None:
                return not_found_page()
            if request.args:
                return status(400, "BadRequest",
                              f"unknown query parameters: {', '.join(sorted(request.args))}")
            kind, resource = entry
            ns, name = parts[4], parts[6]
            if self.forbidden:
                return self._forbid("get", resource, ns)
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                group = resource.partition(".")[2]
                return status(404, "NotFound", f'{resource} "{name}" not found', name=name,
                              group=group, kind=parts[5])
            return Response(json.dumps(obj), 200, mimetype="application/json")
        # /api/v1/namespaces/NS/PLURAL
        if len(parts) == 5 and parts[:2] == ["api", "v1"] and parts[2] == "namespaces" \
                and parts[4] in _LISTS:
            return self._list(request, parts[3], parts[4])
        return not_found_page()

    def _forbid(self, verb: str, resource: str, ns: str) -> Response:
        plural, _, group = resource.partition(".")
        return status(403, "Forbidden",
                      f'{resource} is forbidden: User "someone@example.com" cannot {verb} '
                      f'resource "{plural}" in API group "{group}" in the namespace "{ns}"',
                      kind=plural)

    def _list(self, request: Request, ns: str, plural: str) -> Response:
        kind, selector_param = _LISTS[plural]
        pairs = parse_qsl(request.query_string.decode(), keep_blank_values=True)
        allowed = {selector_param, "limit", "continue"}
        unknown = sorted({k for k, _ in pairs if k not in allowed})
        if unknown or len({k for k, _ in pairs}) != len(pairs):
            return status(400, "BadRequest", f"unknown or repeated query parameters: "
                          f"{', '.join(unknown) or 'repeated'}")
        args = dict(pairs)
        if self.forbidden:
            return self._forbid("list", plural, ns)
        try:
            limit = int(args.get("limit", "0"))
            start = int(args.get("continue", "0") or "0")
        except ValueError:
            return status(400, "BadRequest", "limit and continue must be integers")
        if limit < 0 or start < 0:
            return status(400, "BadRequest", "limit must be positive")
        wanted = _selector(args[selector_param]) if selector_param in args else {}
        if wanted is None:
            return status(400, "BadRequest",
                          f"unable to parse requirement: {args[selector_param]!r}")
        if plural == "events":
            bad = sorted(set(wanted) - EVENT_FIELDS)
            if bad:
                return status(400, "BadRequest",
                              f'"{bad[0]}" is not a known field selector: only '
                              f'"{", ".join(sorted(EVENT_FIELDS))}"')
            match = [o for o in self.of_kind(kind, ns)
                     if all(str(_field(o, f)) == v for f, v in wanted.items())]
        else:
            match = [o for o in self.of_kind(kind, ns)
                     if all((o["metadata"].get("labels") or {}).get(k) == v
                            for k, v in wanted.items())]
        page = match[start:start + limit] if limit else match[start:]
        more = limit and start + limit < len(match)
        body = {"kind": f"{kind}List", "apiVersion": "v1",
                "metadata": {"resourceVersion": "1",
                             **({"continue": str(start + limit)} if more else {})},
                "items": page}
        return Response(json.dumps(body), 200, mimetype="application/json")


# ------------------------------------------------------------------ object builders

TS = "2030-01-01T10:00:00Z"


def deployment(ns: str, name: str, *, desired: int, ready: int, labels: dict[str, str],
               generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "generation": generation,
                     "creationTimestamp": TS, "uid": f"uid-deploy-{name}"},
        "spec": {"replicas": desired, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}},
        "status": {"observedGeneration": generation, "replicas": desired,
                   "updatedReplicas": desired, "readyReplicas": ready,
                   "availableReplicas": ready,
                   **({"unavailableReplicas": desired - ready} if desired > ready else {}),
                   # The Deployment controller's own conditions (apps/v1 DeploymentCondition).
                   "conditions": [
                       {"type": "Available", "status": "True" if ready >= desired else "False",
                        "reason": "MinimumReplicasAvailable" if ready >= desired
                        else "MinimumReplicasUnavailable",
                        "message": "Deployment has minimum availability." if ready >= desired
                        else "Deployment does not have minimum availability.",
                        "lastUpdateTime": TS, "lastTransitionTime": TS},
                       {"type": "Progressing", "status": "True",
                        "reason": "NewReplicaSetAvailable",
                        "message": f'ReplicaSet "{name}-5d4f" has successfully progressed.',
                        "lastUpdateTime": TS, "lastTransitionTime": TS}]},
    }


def hpa(ns: str, name: str, *, target: str, metric: str, current: str | None,
        current_replicas: int, desired_replicas: int, min_replicas: int,
        max_replicas: int) -> dict[str, Any]:
    spec_metric = {"type": "Pods", "pods": {"metric": {"name": metric},
                                            "target": {"type": "AverageValue",
                                                       "averageValue": target}}}
    status_block: dict[str, Any] = {"currentReplicas": current_replicas,
                                    "desiredReplicas": desired_replicas}
    if current is not None:
        status_block["currentMetrics"] = [
            {"type": "Pods", "pods": {"metric": {"name": metric},
                                      "current": {"averageValue": current}}}]
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": TS},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": name},
                 "minReplicas": min_replicas, "maxReplicas": max_replicas,
                 "metrics": [spec_metric]},
        "status": status_block,
    }


def gateway(ns: str, name: str, *, address: str | None, port: int = 80,
            protocol: str = "HTTP", accepted: bool = True,
            programmed: bool | None = None, message: str = "") -> dict[str, Any]:
    """Conditions as gateway.networking.k8s.io/v1 GatewayStatus defines them (Accepted,
    Programmed: type, status, reason, message, lastTransitionTime, observedGeneration)."""
    prog = bool(address) if programmed is None else programmed
    conditions = [{"type": "Accepted", "status": "True" if accepted else "False",
                   "reason": "Accepted" if accepted else "Invalid", "message": "",
                   "lastTransitionTime": TS, "observedGeneration": 1},
                  {"type": "Programmed", "status": "True" if prog else "False",
                   "reason": "Programmed" if prog else "Pending", "message": message,
                   "lastTransitionTime": TS, "observedGeneration": 1}]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns, "generation": 1, "creationTimestamp": TS},
        "spec": {"gatewayClassName": "gke-l7-regional-external-managed",
                 "listeners": [{"name": protocol.lower(), "protocol": protocol, "port": port}]},
        "status": {"addresses": [{"type": "IPAddress", "value": address}] if address else [],
                   "conditions": conditions},
    }


def crd(name: str, *, established: bool = True, versions: tuple[str, ...] = ("v1",),
        kind: str = "") -> dict[str, Any]:
    """A CustomResourceDefinition (apiextensions.k8s.io/v1) as the API server reports it:
    NamesAccepted, then Established once its names are served."""
    plural, _, group = name.partition(".")
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "generation": 1, "creationTimestamp": TS,
                     "uid": f"uid-crd-{plural}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "kind": kind or plural.rstrip("s").title()},
                 "versions": [{"name": v, "served": True, "storage": i == 0,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}
                              for i, v in enumerate(versions)]},
        "status": {"acceptedNames": {"plural": plural},
                   "storedVersions": list(versions[:1]),
                   "conditions": [
                       {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                        "message": "no conflicts found", "lastTransitionTime": TS},
                       {"type": "Established", "status": "True" if established else "False",
                        "reason": "InitialNamesAccepted" if established else "Installing",
                        "message": "the initial names have been accepted" if established
                        else "the initial names have not been accepted yet",
                        "lastTransitionTime": TS}]},
    }


def _cond(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    c = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None,
         "lastTransitionTime": TS}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def pod(ns: str, name: str, labels: dict[str, str], *, state: str,
        message: str = "", restarts: int = 0) -> dict[str, Any]:
    """STATE: ready, unschedulable (MESSAGE: the scheduler's), booting (running, startup probe
    not yet passed), restoring (an init container running), crashloop."""
    spec = {"containers": [{"name": "vllm", "image": "vllm"}, {"name": "proxy", "image": "n"}],
            "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}}
    meta = {"name": name, "namespace": ns, "labels": dict(labels), "creationTimestamp": TS,
            "uid": f"uid-{name}"}
    if state == "unschedulable":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [
                    _cond("PodScheduled", False, "Unschedulable", message)]}}
    spec = {**spec, "nodeName": f"gke-tpu-node-{name[-5:]}"}
    running = {"running": {"startedAt": TS}}
    scheduled = [_cond("PodScheduled", True)]
    if state == "restoring":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": {"phase": "Pending", "startTime": TS, "conditions": [
                    *scheduled, _cond("Initialized", False, "ContainersNotInitialized"),
                    _cond("Ready", False, "ContainersNotReady")],
                    "initContainerStatuses": [{"name": "xla-cache-restore", "ready": False,
                                               "restartCount": 0, "image": "g", "imageID": "",
                                               "state": running}],
                    "containerStatuses": [
                        {"name": c, "ready": False, "restartCount": 0, "image": c, "imageID": "",
                         "started": False,
                         "state": {"waiting": {"reason": "PodInitializing"}}}
                        for c in ("vllm", "proxy")]}}
    ready = state == "ready"
    if state == "crashloop":
        vllm_state: dict[str, Any] = {"waiting": {"reason": "CrashLoopBackOff",
                                                  "message": message or "back-off 5m0s"}}
    else:
        vllm_state = running
    statuses = [
        {"name": "vllm", "ready": ready, "started": ready, "restartCount": restarts,
         "image": "vllm", "imageID": "", "state": vllm_state},
        {"name": "proxy", "ready": True, "started": True, "restartCount": 0, "image": "n",
         "imageID": "", "state": running},
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running", "startTime": TS, "podIP": "10.96.0.9",
                       "conditions": [*scheduled, _cond("Initialized", True),
                                      _cond("ContainersReady", ready), _cond("Ready", ready)],
                       "containerStatuses": statuses}}


def event(ns: str, pod_name: str, *, reason: str, message: str, type_: str = "Warning",
          component: str = "cluster-autoscaler", n: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod_name}.{reason.lower()}{n}", "namespace": ns,
                     "creationTimestamp": TS},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name,
                           "uid": f"uid-{pod_name}", "apiVersion": "v1"},
        "reason": reason, "message": message, "type": type_, "count": 1,
        "source": {"component": component}, "firstTimestamp": TS, "lastTimestamp": TS,
        "reportingComponent": component, "reportingInstance": "",
    }
