"""The fleet's Kubernetes bundle as the `python -m tpuserve.kubectl` steps read it: the image
check (plan time and apply), the bundle from the step's environment or a file, its documents,
the order they are deleted in, and the CRDs it needs from GKE's add-ons. No call: everything
here is refused before one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tpuserve.settings.fleet import PLACEHOLDER_DIGEST

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


class KubectlError(Exception):
    """One line for the user; `code` is the exit status (2: bad input)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


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


def is_crd(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == "CustomResourceDefinition"


def delete_phases(docs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Deletion order: everything else in reverse apply order, then the namespaces (whose
    deletion takes whatever is left in them), then the CRDs (whose deletion takes every
    object of their kinds)."""
    rest = [d for d in reversed(docs) if d.get("kind") != "Namespace" and not is_crd(d)]
    namespaces = [d for d in docs if d.get("kind") == "Namespace"]
    crds = [d for d in reversed(docs) if is_crd(d)]
    return [phase for phase in (rest, namespaces, crds) if phase]


def group_of(doc: dict[str, Any]) -> str:
    api = str(doc.get("apiVersion", ""))
    return api.rpartition("/")[0] if "/" in api else ""


def needed_crds(docs: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """{CRD name: the versions the bundle's objects use} for the kinds GKE installs; a kind
    neither built in, nor bundled, nor known is refused before any call."""
    bundled = {(c.get("spec", {}).get("group"), c.get("spec", {}).get("names", {}).get("kind"))
               for c in docs if is_crd(c)}
    out: dict[str, set[str]] = {}
    for doc in docs:
        group, kind = group_of(doc), str(doc.get("kind"))
        if group in BUILTIN_GROUPS or (group, kind) in bundled:
            continue
        name = CRD_OF_KIND.get((group, kind))
        if name is None:
            raise KubectlError(f"the bundle holds a {kind} ({doc.get('apiVersion')}), a kind no "
                               "add-on of the fleet's cluster installs and the bundle does not "
                               "define", 2)
        out.setdefault(name, set()).add(str(doc["apiVersion"]).rpartition("/")[2])
    return out
