"""The fleet stack's Kubernetes steps against the cluster: `gcloud container clusters
get-credentials` into a private KUBECONFIG (a temporary file of this run, removed after, never
the user's ~/.kube/config), `kubectl apply --server-side` and `kubectl delete` of the bundle
(tpuserve.gcp.kube_bundle reads it), and the apply's waits for what GKE installs and what the
Gateway cannot serve without, all within one bound. `python -m tpuserve.kubectl`
(tpuserve/kubectl.py: arguments, environment, exit codes) runs them. gcloud and kubectl are
found on PATH (gcloud ships kubectl: `gcloud components install kubectl`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve.contracts import (
    ADAPTER_DEPLOYMENT,
    ADAPTER_NAMESPACE,
    EPP_DEPLOYMENT,
    FLEET_NAMESPACE,
)
from tpuserve.gcp.kube_bundle import (
    BUILTIN_GROUPS,
    KubectlError,
    delete_phases,
    dump,
    group_of,
    is_crd,
    needed_crds,
    split_documents,
)

FIELD_MANAGER = "tpuserve"
APPLY = ("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
         "-f", "-")
DELETE = ("delete", "--ignore-not-found", "--wait=true", "--timeout=20m", "-f", "-")
CRD_WAIT = ("wait", "--for=condition=Established", "-f", "-")  # + --timeout=<what is left>
# The apply, all its calls included, ends within this bound: past it the k8s_bundle
# step fails in one line naming what is still missing, Terraform keeps it tainted, and the next
# `cdktf deploy fleet` applies again.
APPLY_BOUND_S = 15 * 60
POLL_S = 10.0
# The Deployments the Gateway cannot serve without (the endpoint picker, with failureMode
# FailClose; the adapter the HPA reads): the apply waits for them to be available.
WAIT_DEPLOYMENTS = frozenset({(FLEET_NAMESPACE, EPP_DEPLOYMENT),
                              (ADAPTER_NAMESPACE, ADAPTER_DEPLOYMENT)})
INSTALL_HINT = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    "kubectl": "install it with `gcloud components install kubectl` (and "
               "gke-gcloud-auth-plugin)",
}


# ----------------------------------------------------------------------------- commands


def _tool(name: str, environ: Mapping[str, str]) -> str:
    path = shutil.which(name, path=environ.get("PATH", os.defpath))
    if path is None:
        raise KubectlError(f"{name} not found on PATH: {INSTALL_HINT[name]}")
    return path


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _run(argv: list[str], env: Mapping[str, str], *, stdin: str | None = None,
         what: str, timeout: float | None = None) -> None:
    try:
        feed: dict[str, Any] = ({"input": stdin} if stdin is not None
                                else {"stdin": subprocess.DEVNULL})
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, check=False,
                              timeout=timeout, **feed)
    except subprocess.TimeoutExpired:
        raise KubectlError(f"{what}: no answer within the apply's bound ({timeout:.0f} s "
                           f"left of {APPLY_BOUND_S // 60} min): the next `cdktf deploy fleet` "
                           "applies again") from None
    except OSError as exc:
        raise KubectlError(f"{what}: {exc.strerror}") from None
    if done.stdout:  # kubectl's one line per object: the deploy log shows what changed
        sys.stdout.write(done.stdout)
        sys.stdout.flush()
    if done.returncode != 0:
        raise KubectlError(f"{what} failed (exit {done.returncode}): "
                           f"{_last_line(done.stderr or done.stdout)}")


class Cluster:
    """A cluster reached through a private KUBECONFIG (a temporary file of this run)."""

    def __init__(self, project: str, location: str, name: str,
                 environ: Mapping[str, str]) -> None:
        self.project, self.location, self.name = project, location, name
        self.environ = environ
        self._dir: str | None = None
        self.env: dict[str, str] = {}
        self.kubeconfig = ""
        self.deadline: float | None = None  # monotonic; every call ends by it when set

    def left(self) -> float | None:
        """Seconds to the apply's deadline (None: no deadline); none left is the step's end."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise KubectlError(f"k8s_bundle: the apply's {APPLY_BOUND_S // 60} min bound passed "
                               "before its next call (the next `cdktf deploy fleet` applies "
                               "again)")
        return left

    def __enter__(self) -> Cluster:
        gcloud = _tool("gcloud", self.environ)
        self.kubectl = _tool("kubectl", self.environ)
        self._dir = tempfile.mkdtemp(prefix="tpuserve-kube-")  # mode 0700
        self.kubeconfig = os.path.join(self._dir, "config")
        self.env = {**self.environ, "KUBECONFIG": self.kubeconfig}
        _run([gcloud, "container", "clusters", "get-credentials", self.name,
              "--zone", self.location, "--project", self.project], self.env,
             what=f"gcloud container clusters get-credentials {self.name}", timeout=self.left())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def kubectl_run(self, args: Sequence[str], stdin: str) -> None:
        _run([self.kubectl, *args], self.env, stdin=stdin, what=f"kubectl {args[0]}",
             timeout=self.left())


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    conds = status.get("conditions") if isinstance(status.get("conditions"), list) else []
    return {str(c.get("type")): c for c in conds if isinstance(c, dict)}


def _true(obj: dict[str, Any], kind: str) -> bool:
    return _conditions(obj).get(kind, {}).get("status") == "True"


def crd_missing(crd: dict[str, Any] | None, name: str, versions: set[str]) -> str | None:
    """What keeps the CRD from being usable (None: Established, serving every version)."""
    if crd is None:
        return f"CRD {name} absent"
    if not _true(crd, "Established"):
        cond = _conditions(crd).get("Established", {})
        return f"CRD {name} not Established ({cond.get('reason') or 'no condition'})"
    spec = crd.get("spec") if isinstance(crd.get("spec"), dict) else {}
    served = {v.get("name") for v in spec.get("versions") or [] if isinstance(v, dict)
              and v.get("served") is True}
    if not versions <= served:
        return f"CRD {name} does not serve {', '.join(sorted(versions - served))}"
    return None


def deployment_missing(dep: dict[str, Any] | None, ns: str, name: str) -> str | None:
    if dep is None:
        return f"deployment {ns}/{name} absent"
    spec, status = dep.get("spec") or {}, dep.get("status") or {}
    want = spec.get("replicas", 1)
    avail = status.get("availableReplicas") or 0
    current = (status.get("observedGeneration") or 0) >= (dep.get("metadata") or {}).get(
        "generation", 1)
    if not (current and isinstance(want, int) and want >= 1 and avail >= want
            and (status.get("updatedReplicas") or 0) >= want and _true(dep, "Available")):
        return f"deployment {ns}/{name} {avail}/{want} available"
    return None


def gateway_missing(gw: dict[str, Any] | None, ns: str, name: str) -> str | None:
    if gw is None:
        return f"gateway {ns}/{name} absent"
    cond = _conditions(gw).get("Programmed")
    gen = (gw.get("metadata") or {}).get("generation", 1)
    stale = (cond or {}).get("observedGeneration", gen) < gen
    if cond is None or cond.get("status") != "True" or stale:
        what = "no condition" if cond is None else \
            f"{cond.get('status')}, {cond.get('reason') or 'no reason'}"
        return f"gateway {ns}/{name} not Programmed ({what})"
    return None


def _api(cluster: Cluster) -> Any:
    from tpuserve.gcp import kube

    try:
        return kube.connect_file(cluster.kubeconfig, deadline=cluster.deadline)
    except Exception as exc:  # OpsError: one line
        raise KubectlError(f"the cluster's API: {exc}") from None


def _poll(cluster: Cluster, api: Any, checks: list[Any], *, what: str,
          sleep: Any = time.sleep, poll_s: float = POLL_S) -> None:
    """Run CHECKS (each: api -> a line of what is missing, or None) until none is missing or
    the apply's deadline passes; then fail in one line naming what is still missing."""
    from tpuserve.ops_error import OpsError

    assert cluster.deadline is not None
    while True:
        try:
            missing = [m for m in (check(api) for check in checks) if m]
        except OpsError as exc:  # an unreachable API proves nothing: keep polling, say why
            missing = [str(exc)]
        if not missing:
            return
        if time.monotonic() + poll_s >= cluster.deadline:
            raise KubectlError(
                f"k8s_bundle: after {APPLY_BOUND_S // 60} min {what}, still missing: "
                f"{'; '.join(missing)} (the next `cdktf deploy fleet` applies again)")
        sleep(poll_s)


def apply(cluster: Cluster, bundle: str, *, bound_s: float = APPLY_BOUND_S,
          sleep: Any = time.sleep, poll_s: float = POLL_S) -> int:
    """Apply BUNDLE; the number of objects applied. Bundled CRDs first, Established; the
    built-in kinds; then, once the CRDs GKE installs are Established, the objects of those
    kinds; then the picker and the adapter available and every Gateway Programmed. All of it
    within BOUND_S; a bundle of built-in kinds only, with nothing to wait for, goes in one call
    as is."""
    docs = split_documents(bundle)
    crds = [d for d in docs if is_crd(d)]
    needed = needed_crds(docs)
    custom = [d for d in docs if not is_crd(d) and group_of(d) not in BUILTIN_GROUPS]
    plain = [d for d in docs if not is_crd(d) and group_of(d) in BUILTIN_GROUPS]
    deployments = [(d["metadata"].get("namespace", "default"), d["metadata"]["name"])
                   for d in plain if d.get("kind") == "Deployment"]
    waits = [k for k in deployments if k in WAIT_DEPLOYMENTS]
    gateways = [(d["metadata"].get("namespace", "default"), d["metadata"]["name"])
                for d in custom if d.get("kind") == "Gateway"]
    cluster.deadline = time.monotonic() + bound_s
    with cluster:
        if crds:
            cluster.kubectl_run(APPLY, dump(crds))
            cluster.kubectl_run((*CRD_WAIT[:-2], f"--timeout={max(1, int(cluster.left() or 0))}s",
                                 *CRD_WAIT[-2:]), dump(crds))
        if not custom and not waits and not crds:
            cluster.kubectl_run(APPLY, bundle)
        elif plain:
            cluster.kubectl_run(APPLY, dump(plain))
        api = _api(cluster) if needed or waits or gateways else None
        if needed:
            checks = [lambda a, n=n, v=v: crd_missing(a.crd(n), n, v)
                      for n, v in sorted(needed.items())]
            _poll(cluster, api, checks, what="waiting for the CRDs GKE installs",
                  sleep=sleep, poll_s=poll_s)
        if custom:
            cluster.kubectl_run(APPLY, dump(custom))
        checks = [lambda a, ns=ns, n=n: deployment_missing(a.deployment(ns, n), ns, n)
                  for ns, n in waits]
        checks += [lambda a, ns=ns, n=n: gateway_missing(a.gateway(ns, n), ns, n)
                   for ns, n in gateways]
        if checks:
            _poll(cluster, api, checks, what="waiting for the picker, the adapter and the "
                  "Gateway", sleep=sleep, poll_s=poll_s)
    return len(docs)


def delete(cluster: Cluster, bundle: str) -> int:
    docs = split_documents(bundle)
    with cluster:
        for phase in delete_phases(docs):
            cluster.kubectl_run(DELETE, dump(phase))
    return len(docs)
