"""The fleet stack's provisioners: `python -m tpuserve.kubectl apply|delete` runs `main` here.

    python -m tpuserve.kubectl apply    # the bundle, server-side, as field manager `tpuserve`
    python -m tpuserve.kubectl delete   # what the bundle made, namespaces and CRDs last
    python -m tpuserve.kubectl preflight   # hashicorp/external: {"image": ...} on stdin

preflight runs at plan time (the fleet stack's `data.external.image_preflight`): an image
without a real digest fails the plan before the cluster or anything else is created, in one
line. apply checks again, for a stack synthesized before this check existed.

The cluster comes from $TPUSERVE_K8S_PROJECT, $TPUSERVE_K8S_LOCATION (its zone) and
$TPUSERVE_K8S_CLUSTER (or --project, --location, --cluster); the bundle (multi-document YAML)
from $TPUSERVE_K8S_BUNDLE_GZ, gzipped and base64-encoded (Terraform's base64gzip: Linux caps one
environment variable at 128 KiB), or --bundle-file. apply also reads the vLLM image
($TPUSERVE_K8S_IMAGE or --image) and refuses, before any call, one without a real digest.

Credentials: `gcloud container clusters get-credentials` writes into a private KUBECONFIG
(a temporary file of this run, removed after), never the user's ~/.kube/config. gcloud and
kubectl are found on PATH (gcloud ships kubectl: `gcloud components install kubectl`).
An error prints one line to stderr and exits 1 (bad input: 2); never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve.settings.fleet import PLACEHOLDER_DIGEST

# The fleet stack's Terraform passes these to the provisioners (stacks/fleet.py).
ENV_PROJECT = "TPUSERVE_K8S_PROJECT"
ENV_LOCATION = "TPUSERVE_K8S_LOCATION"
ENV_CLUSTER = "TPUSERVE_K8S_CLUSTER"
ENV_BUNDLE_GZ = "TPUSERVE_K8S_BUNDLE_GZ"
ENV_IMAGE = "TPUSERVE_K8S_IMAGE"
FIELD_MANAGER = "tpuserve"
APPLY = ("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
         "-f", "-")
DELETE = ("delete", "--ignore-not-found", "--wait=true", "--timeout=20m", "-f", "-")
CRD_WAIT = ("wait", "--for=condition=Established", "-f", "-")  # + --timeout=<what is left>
# The apply, all its calls included, ends within this bound (issue 23): past it the k8s_bundle
# step fails in one line naming what is still missing, Terraform keeps it tainted, and the next
# `cdktf deploy fleet` applies again.
APPLY_BOUND_S = 15 * 60
POLL_S = 10.0
# The kinds GKE installs the CRDs of with its add-ons (Gateway API, Inference Gateway, managed
# Prometheus, Secret Manager, node auto-provisioning/ComputeClass, the load balancer policies):
# (group, kind) -> the CRD's name. An object of any other non-built-in kind is refused.
CRD_OF_KIND = {
    ("gateway.networking.k8s.io", "Gateway"): "gateways.gateway.networking.k8s.io",
    ("gateway.networking.k8s.io", "HTTPRoute"): "httproutes.gateway.networking.k8s.io",
    ("inference.networking.k8s.io", "InferencePool"):
        "inferencepools.inference.networking.k8s.io",
    ("monitoring.googleapis.com", "PodMonitoring"): "podmonitorings.monitoring.googleapis.com",
    ("secrets-store.csi.x-k8s.io", "SecretProviderClass"):
        "secretproviderclasses.secrets-store.csi.x-k8s.io",
    ("cloud.google.com", "ComputeClass"): "computeclasses.cloud.google.com",
    ("networking.gke.io", "HealthCheckPolicy"): "healthcheckpolicies.networking.gke.io",
    ("networking.gke.io", "GCPBackendPolicy"): "gcpbackendpolicies.networking.gke.io",
}
# The API groups every cluster serves (no CRD to wait for).
BUILTIN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "rbac.authorization.k8s.io",
    "networking.k8s.io", "apiregistration.k8s.io", "apiextensions.k8s.io",
    "scheduling.k8s.io", "storage.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
})
# The Deployments the Gateway cannot serve without (the endpoint picker, with failureMode
# FailClose; the adapter the HPA reads): the apply waits for them to be available.
WAIT_DEPLOYMENTS = frozenset({("tpuserve", "vllm-epp"),
                              ("custom-metrics", "custom-metrics-stackdriver-adapter")})
INSTALL_HINT = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    "kubectl": "install it with `gcloud components install kubectl` (and "
               "gke-gcloud-auth-plugin)",
}


class KubectlError(Exception):
    """One line for the user; `code` is the exit status (2: bad input)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- input


def check_image(image: str | None, setting: str = "vllm.image",
                section: str = "[stacks.fleet]") -> None:
    """The fleet runs one image on every node: it must be pinned by a real digest."""
    name = (image or "IMAGE").split("@", 1)[0]
    how = (f"pin it as {name}@sha256:<digest> in "
           f"{section} (the digest: `crane digest {name}` or `docker buildx imagetools "
           f"inspect {name}`)")
    if not image:
        raise KubectlError(f"{setting} is not set: {how}", 2)
    if image.endswith("@" + PLACEHOLDER_DIGEST):
        raise KubectlError(f"{setting} = {image!r} carries the placeholder digest: {how}", 2)
    if "@sha256:" not in image:
        raise KubectlError(f"{setting} = {image!r} has no digest: {how}", 2)


# The preflight's query: the vLLM image and, from stacks synthesized after the picker and the
# adapter became settings, theirs (no upstream records their digests: the defaults carry the
# placeholder, refused here at plan time).
PREFLIGHT_IMAGES = {"image": ("vllm.image", "[stacks.fleet]"),
                    "picker_image": ("fleet.picker_image", "[fleet]"),
                    "adapter_image": ("fleet.adapter_image", "[fleet]")}


def preflight(stdin: str) -> str:
    """The external data source's protocol: a JSON object of strings in, one out."""
    try:
        query = json.loads(stdin)
    except json.JSONDecodeError as exc:
        raise KubectlError(f"preflight: stdin is not JSON ({exc})", 2) from None
    if not isinstance(query, dict) or "image" not in query \
            or not set(query) <= set(PREFLIGHT_IMAGES) \
            or not all(isinstance(v, str) for v in query.values()):
        raise KubectlError('preflight: stdin must be {"image": "<name>@sha256:<digest>"} '
                           '(and optionally "picker_image", "adapter_image")', 2)
    for key, (setting, section) in PREFLIGHT_IMAGES.items():
        if key in query:
            check_image(query[key], setting, section)
    return json.dumps({"image": query["image"]})


def placeholder_line(bundle: str) -> str:
    """Which images of the bundle carry the placeholder digest, and the settings to set."""
    images = sorted({ln.split("image:", 1)[1].strip().strip("'\"")
                     for ln in bundle.splitlines()
                     if "image:" in ln and PLACEHOLDER_DIGEST in ln})
    return (f"the bundle carries the placeholder digest in {', '.join(images) or 'an object'}: "
            "set the real digest (vllm.image in [stacks.fleet]; fleet.picker_image, "
            "fleet.adapter_image in [fleet])")


def decode_bundle(encoded: str) -> str:
    try:
        return gzip.decompress(base64.b64decode(encoded, validate=True)).decode()
    except (binascii.Error, OSError, EOFError, UnicodeDecodeError) as exc:
        raise KubectlError(f"${ENV_BUNDLE_GZ} is not a gzipped, base64-encoded bundle "
                           f"({exc})", 2) from None


def read_bundle(bundle_file: str | None, environ: Mapping[str, str]) -> str:
    if bundle_file:
        try:
            with open(bundle_file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise KubectlError(f"cannot read the bundle {bundle_file}: {exc.strerror}",
                               2) from None
    elif environ.get(ENV_BUNDLE_GZ):
        text = decode_bundle(environ[ENV_BUNDLE_GZ])
    else:
        raise KubectlError(f"no bundle: set ${ENV_BUNDLE_GZ} or pass --bundle-file", 2)
    if not text.strip():
        raise KubectlError("the bundle is empty: nothing to apply", 2)
    return text


def split_documents(text: str) -> list[dict[str, Any]]:
    import yaml

    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KubectlError(f"the bundle is not YAML: {first}", 2) from None
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise KubectlError("the bundle holds a document that is not a Kubernetes object", 2)
    return docs


def dump(docs: Sequence[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(list(docs), sort_keys=False)


def _is_crd(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == "CustomResourceDefinition"


def delete_phases(docs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Deletion order: everything else in reverse apply order, then the namespaces (whose
    deletion takes whatever is left in them), then the CRDs (whose deletion takes every
    object of their kinds)."""
    rest = [d for d in reversed(docs) if d.get("kind") != "Namespace" and not _is_crd(d)]
    namespaces = [d for d in docs if d.get("kind") == "Namespace"]
    crds = [d for d in reversed(docs) if _is_crd(d)]
    return [phase for phase in (rest, namespaces, crds) if phase]


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
        for setting, value in (("project", project), ("location", location),
                               ("cluster", name)):
            if not value:
                raise KubectlError(f"no {setting}: set $TPUSERVE_K8S_{setting.upper()} or "
                                   f"pass --{setting}", 2)
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


def _group(doc: dict[str, Any]) -> str:
    api = str(doc.get("apiVersion", ""))
    return api.rpartition("/")[0] if "/" in api else ""


def needed_crds(docs: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """{CRD name: the versions the bundle's objects use} for the kinds GKE installs; a kind
    neither built in, nor bundled, nor known is refused before any call."""
    bundled = {(c.get("spec", {}).get("group"), c.get("spec", {}).get("names", {}).get("kind"))
               for c in docs if _is_crd(c)}
    out: dict[str, set[str]] = {}
    for doc in docs:
        group, kind = _group(doc), str(doc.get("kind"))
        if group in BUILTIN_GROUPS or (group, kind) in bundled:
            continue
        name = CRD_OF_KIND.get((group, kind))
        if name is None:
            raise KubectlError(f"the bundle holds a {kind} ({doc.get('apiVersion')}), a kind no "
                               "add-on of the fleet's cluster installs and the bundle does not "
                               "define", 2)
        out.setdefault(name, set()).add(str(doc["apiVersion"]).rpartition("/")[2])
    return out


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
    from tpuserve.ops import kube

    try:
        return kube.connect_file(cluster.kubeconfig, deadline=cluster.deadline)
    except Exception as exc:  # OpsError: one line
        raise KubectlError(f"the cluster's API: {exc}") from None


def _poll(cluster: Cluster, api: Any, checks: list[Any], *, what: str,
          sleep: Any = time.sleep, poll_s: float = POLL_S) -> None:
    """Run CHECKS (each: api -> a line of what is missing, or None) until none is missing or
    the apply's deadline passes; then fail in one line naming what is still missing."""
    from tpuserve.ops.errors import OpsError

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
          sleep: Any = time.sleep, poll_s: float = POLL_S) -> None:
    """Bundled CRDs first, Established; the built-in kinds; then, once the CRDs GKE installs
    are Established, the objects of those kinds; then the picker and the adapter available
    and every Gateway Programmed. All of it within BOUND_S; a bundle of built-in kinds only,
    with nothing to wait for, goes in one call as is."""
    docs = split_documents(bundle)
    crds = [d for d in docs if _is_crd(d)]
    needed = needed_crds(docs)
    custom = [d for d in docs if not _is_crd(d) and _group(d) not in BUILTIN_GROUPS]
    plain = [d for d in docs if not _is_crd(d) and _group(d) in BUILTIN_GROUPS]
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
    print(f"tpuserve: applied {len(docs)} objects to {cluster.name}", flush=True)


def delete(cluster: Cluster, bundle: str) -> None:
    docs = split_documents(bundle)
    with cluster:
        for phase in delete_phases(docs):
            cluster.kubectl_run(DELETE, dump(phase))
    print(f"tpuserve: deleted the bundle's {len(docs)} objects from {cluster.name}", flush=True)


# ----------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m tpuserve.kubectl")
    parser.add_argument("action", choices=("apply", "delete", "preflight"))
    parser.add_argument("--project", default=env.get(ENV_PROJECT, ""))
    parser.add_argument("--location", default=env.get(ENV_LOCATION, ""),
                        help="the cluster's zone")
    parser.add_argument("--cluster", default=env.get(ENV_CLUSTER, ""))
    parser.add_argument("--image", default=env.get(ENV_IMAGE))
    parser.add_argument("--bundle-file")
    args = parser.parse_args(argv)
    try:
        if args.action == "preflight":
            print(preflight(sys.stdin.read()), flush=True)
            return 0
        if args.action == "apply":
            check_image(args.image)  # before anything else: no call with a wrong image
        bundle = read_bundle(args.bundle_file, env)
        if args.action == "apply" and PLACEHOLDER_DIGEST in bundle:
            raise KubectlError(placeholder_line(bundle), 2)
        cluster = Cluster(args.project, args.location, args.cluster, env)
        (apply if args.action == "apply" else delete)(cluster, bundle)
    except KubectlError as exc:
        print(f"tpuserve: {exc}", file=sys.stderr, flush=True)
        return exc.code
    except KeyboardInterrupt:
        print("tpuserve: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0
