"""The fleet's Kubernetes API: the few reads `status`, `wait` and `endpoint` make, bounded.

The official `kubernetes` client loads the kubeconfig (KUBECONFIG, else ~/.kube/config) and the
context `gcloud container clusters get-credentials` writes, `gke_<project>_<zone>_<cluster>`;
it is imported only here, so only the fleet's commands pay for it (~0.6 s). It lives beside
the Google API edge (tpuserve.gcp.api), below the operations that read through it: the
fleet's status, wait and endpoint, and the fleet stack's apply step (tpuserve.gcp.kubectl).

An API server is a peer like any other (bounded_http): every call carries `_request_timeout`
(connect, read), runs within one overall deadline, reads at most MAX_BYTES of any answer (the
error bodies too: the client's connection pool is wrapped) and lists at most `limit` items.
Failures are one line (OpsError): 401, 403, 404, connection refused, a timeout, a bad
kubeconfig. Answers are returned as the API's own JSON (camelCase dicts), not the client's
models: the same shapes for the core kinds and for the Gateway (a custom resource).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tpuserve.bounded_call import within
from tpuserve.ops_error import OpsError, one_line

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

T = TypeVar("T")

# Seconds to connect, and to wait for any one read, per call.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0
# Seconds one call may take in all, whatever the server sends (a trickle, a stalled answer).
CALL_DEADLINE_S = 20.0
# Bytes of any one answer (a list of 500 pods with their status is ~5 MB).
MAX_BYTES = 16 << 20
# Items read from one list (`limit`; the rest, if any, is reported as truncated).
MAX_LIST_ITEMS = 500
GATEWAY_GROUP, GATEWAY_VERSION = "gateway.networking.k8s.io", "v1"


def cluster_name(d: Deployment) -> str:
    """The GKE cluster the fleet stack creates: named like every serving stack's node
    (`<deployment>-fleet`, stacks/fleet.py), from the one property both read."""
    return d.node_name


def context_name(d: Deployment) -> str:
    """The kubeconfig context `gcloud container clusters get-credentials` writes."""
    return f"gke_{d.gcp.project}_{d.gcp.zone}_{cluster_name(d)}"


def credentials_command(d: Deployment) -> str:
    return (f"gcloud container clusters get-credentials {cluster_name(d)} "
            f"--zone={d.gcp.zone} --project={d.gcp.project}")


def kubeconfig_path() -> str:
    """KUBECONFIG (a list of files, merged, as kubectl reads it) or ~/.kube/config; read at
    call time, not at import (the client's own default is fixed when it is imported)."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


class _CappedResponse:
    """A urllib3 response whose body is read at most MAX_BYTES at a time in all: what the
    client's REST layer reads for errors (`.data`) and what we read for answers."""

    def __init__(self, inner: Any, max_bytes: int) -> None:
        self._inner = inner
        self._max = max_bytes
        self._data: bytes | None = None
        self.status = inner.status
        self.reason = inner.reason
        self.headers = inner.headers

    @property
    def data(self) -> bytes:
        if self._data is None:
            chunks, total = [], 0
            try:
                while True:
                    chunk = self._inner.read(64 << 10)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > self._max:
                        raise ResponseTooLarge(self._max)
                    chunks.append(chunk)
            finally:
                self._inner.release_conn()
            self._data = b"".join(chunks)
        return self._data

    def read(self, *_args: Any, **_kwargs: Any) -> bytes:
        return self.data

    def getheaders(self) -> Any:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)

    def close(self) -> None:
        self._inner.close()

    def release_conn(self) -> None:
        self._inner.release_conn()


class ResponseTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer exceeded {limit:,} bytes")


class _CappedPool:
    """The client's urllib3 PoolManager, every answer wrapped in _CappedResponse."""

    def __init__(self, inner: Any, max_bytes: int) -> None:
        self._inner = inner
        self._max = max_bytes

    def request(self, method: str, url: str, **kwargs: Any) -> _CappedResponse:
        kwargs["preload_content"] = False
        return _CappedResponse(self._inner.request(method, url, **kwargs), self._max)

    def clear(self) -> None:
        self._inner.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Kube:
    """Reads of one cluster. Build it with `connect(d)`; tests may build it on any ApiClient."""

    def __init__(self, api_client: Any, *, where: str) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.where = where  # the server's URL, for messages
        self._apps = client.AppsV1Api(api_client)
        self._autoscaling = client.AutoscalingV2Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._ext = client.ApiextensionsV1Api(api_client)
        self.truncated: list[str] = []  # lists cut at MAX_LIST_ITEMS
        # A monotonic deadline every call ends by (the apply's bound), on top of the per-call one.
        self.deadline: float | None = None

    # -- reads (None: the object does not exist)
    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"deployment {namespace}/{name}",
                         lambda **kw: self._apps.read_namespaced_deployment(name, namespace, **kw))

    def hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"horizontalpodautoscaler {namespace}/{name}",
            lambda **kw: self._autoscaling.read_namespaced_horizontal_pod_autoscaler(
                name, namespace, **kw))

    def gateway(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"gateway {namespace}/{name}",
            lambda **kw: self._custom.get_namespaced_custom_object(
                GATEWAY_GROUP, GATEWAY_VERSION, namespace, "gateways", name, **kw),
            missing_kind_hint="the Gateway API is not enabled on the cluster "
                              "(gateway_api_config of the fleet stack)")

    def crd(self, name: str) -> dict[str, Any] | None:
        return self._get(f"customresourcedefinition {name}",
                         lambda **kw: self._ext.read_custom_resource_definition(name, **kw))

    def pods(self, namespace: str, label_selector: str,
             limit: int = MAX_LIST_ITEMS) -> list[dict[str, Any]]:
        return self._list(f"pods in {namespace} ({label_selector})", limit,
                          lambda **kw: self._core.list_namespaced_pod(
                              namespace, label_selector=label_selector, limit=limit, **kw))

    def events(self, namespace: str, field_selector: str,
               limit: int = MAX_LIST_ITEMS) -> list[dict[str, Any]]:
        return self._list(f"events in {namespace} ({field_selector})", limit,
                          lambda **kw: self._core.list_namespaced_event(
                              namespace, field_selector=field_selector, limit=limit, **kw))

    # -- plumbing
    def _get(self, what: str, call: Callable[..., Any],
             missing_kind_hint: str = "") -> dict[str, Any] | None:
        try:
            doc = self._call(what, call)
        except _NotFound as exc:
            # A missing object answers a Status with details.name; a missing kind (no CRD)
            # answers the bare 404 page "404 page not found".
            if missing_kind_hint and not exc.is_status:
                raise OpsError(f"Kubernetes API at {self.where}: {what}: 404, no such resource "
                               "kind", hint=missing_kind_hint) from None
            return None
        if not isinstance(doc, dict):
            raise OpsError(f"Kubernetes API at {self.where}: {what}: not an object: "
                           f"{one_line(doc, 120)}")
        return doc

    def _list(self, what: str, limit: int, call: Callable[..., Any]) -> list[dict[str, Any]]:
        try:
            doc = self._call(what, call)
        except _NotFound:
            return []
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise OpsError(f"Kubernetes API at {self.where}: {what}: not a list: "
                           f"{one_line(doc, 120)}")
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        if len(items) > limit or meta.get("continue"):
            self.truncated.append(what)
        return [i for i in items[:limit] if isinstance(i, dict)]

    def _call(self, what: str, call: Callable[..., Any]) -> Any:
        from kubernetes.client.exceptions import ApiException

        limit = CALL_DEADLINE_S
        if self.deadline is not None:
            limit = max(0.1, min(limit, self.deadline - time.monotonic()))
        timeouts = (min(CONNECT_TIMEOUT_S, limit), min(READ_TIMEOUT_S, limit))

        def run() -> Any:
            resp = call(_preload_content=False, _request_timeout=timeouts)
            return resp.data

        try:
            body = within(limit, run, lambda: _Expired())
        except _Expired:
            raise OpsError(f"Kubernetes API at {self.where}: {what}: no complete answer within "
                           f"{limit:g} s",
                           hint="is the cluster's control plane up? (`kubectl get --raw /readyz`)"
                           ) from None
        except ApiException as exc:
            if exc.status == 404:
                raise _NotFound(_status_doc(exc.body) is not None) from None
            raise api_error(exc, what, self.where) from None
        except ResponseTooLarge as exc:
            raise OpsError(f"Kubernetes API at {self.where}: {what}: {exc}") from None
        except Exception as exc:
            raise transport_error(exc, what, self.where) from None
        try:
            return json.loads(body)
        except ValueError:
            raise OpsError(f"Kubernetes API at {self.where}: {what}: answered non-JSON: "
                           f"{one_line(body[:200].decode(errors='replace'), 120)}") from None


class NoContext(OpsError):
    """The kubeconfig is missing, or has no context for the fleet's cluster."""


class _Expired(Exception):
    pass


class _NotFound(Exception):
    def __init__(self, is_status: bool) -> None:
        self.is_status = is_status


def _status_doc(body: object) -> dict[str, Any] | None:
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None


def api_error(exc: Any, what: str, where: str) -> OpsError:
    """An API answer that is not 2xx, as one line (the Status message when there is one)."""
    status = _status_doc(exc.body)
    message = one_line(status.get("message", "") if status else (exc.body or exc.reason or ""),
                       200)
    head = f"Kubernetes API at {where}: {what}: HTTP {exc.status}"
    if exc.status == 401:
        return OpsError(f"{head} Unauthorized: the credentials were refused",
                        hint="refresh them: gcloud auth login, then `gcloud container clusters "
                        "get-credentials` (the command `tpuserve status fleet` prints)")
    if exc.status == 403:
        return OpsError(f"{head} Forbidden: {message}",
                        hint="your account needs roles/container.viewer (or RBAC get/list in "
                        "the namespace) on the cluster")
    return OpsError(f"{head}: {message}" if message else head)


def transport_error(exc: Exception, what: str, where: str) -> OpsError:
    """Connection refused, a reset, a read timeout, a TLS failure: one line."""
    text = str(exc)
    reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError carries the cause
    if reason is not None:
        text = str(reason)
    if "refused" in text.lower():
        detail = "connection refused"
    elif "timed out" in text.lower() or "timeout" in type(reason or exc).__name__.lower():
        detail = f"timed out ({one_line(text, 120)})"
    else:
        detail = f"{type(reason or exc).__name__}: {one_line(text, 160)}"
    return OpsError(f"Kubernetes API at {where}: {what}: {detail}",
                    hint="check the cluster exists and the kubeconfig's server address "
                    "(`kubectl cluster-info`)")


def connect_file(path: str, *, deadline: float | None = None) -> Kube:
    """A client of the current context of the kubeconfig at PATH (the apply's private one,
    written by `gcloud container clusters get-credentials`), every call ending by DEADLINE."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        within(CALL_DEADLINE_S,
               lambda: config.load_kube_config(config_file=path, client_configuration=cfg,
                                               persist_config=False),
               lambda: _Expired())
    except _Expired:
        raise OpsError(f"kubeconfig {path}: loading it took more than {CALL_DEADLINE_S:g} s "
                       "(its credential plugin did not answer)") from None
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise OpsError(f"kubeconfig {path}: {one_line(exc, 200)}") from None
    cfg.retries = 0
    api = client.ApiClient(cfg)
    api.rest_client.pool_manager = _CappedPool(api.rest_client.pool_manager, MAX_BYTES)
    kube = Kube(api, where=cfg.host)
    kube.deadline = deadline
    return kube


def connect(d: Deployment, *, context: str | None = None) -> Kube:
    """A client of the fleet's cluster from the kubeconfig's context for it."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    ctx = context or context_name(d)
    path = kubeconfig_path()
    cfg = client.Configuration()
    try:
        # An exec credential plugin (gke-gcloud-auth-plugin) runs here: bounded too.
        within(CALL_DEADLINE_S,
               lambda: config.load_kube_config(config_file=path, context=ctx,
                                               client_configuration=cfg,
                                               persist_config=False),
               lambda: _Expired())
    except _Expired:
        raise OpsError(f"kubeconfig {path}: loading context {ctx} took more than "
                       f"{CALL_DEADLINE_S:g} s (its credential plugin did not answer)") from None
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        text = one_line(exc, 200)
        hint = f"fetch the cluster's credentials: {credentials_command(d)}"
        if "Expected object with name" in text or "No configuration found" in text or (
                isinstance(exc, OSError)):
            raise NoContext(f"kubeconfig {path}: no context {ctx} ({text})", hint=hint
                            ) from None
        raise OpsError(f"kubeconfig {path}: {text}", hint=hint) from None
    cfg.retries = 0  # one attempt per call: the deadline is ours, not urllib3's retries'
    api = client.ApiClient(cfg)
    api.rest_client.pool_manager = _CappedPool(api.rest_client.pool_manager, MAX_BYTES)
    return Kube(api, where=cfg.host)
