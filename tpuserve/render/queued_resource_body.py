"""The flex-start queued resource's request body (TPU API v2alpha1), built and checked.

Pure: config in, dict out, no I/O. The flex stack hands the body to Terraform, and the
provisioner (`python -m tpuserve.queued_resource`) posts it; both build it here, so they cannot
drift.
The generation label is added at create time (`with_generation`): only the plan knows it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpuserve.facts import CLOUD_PLATFORM_SCOPE
from tpuserve.render.node_metadata import node_metadata

if TYPE_CHECKING:  # the provisioner path must not pay for pydantic
    from tpuserve.settings import Deployment

# The label that ties a QR to the Terraform plan that created it (see the provisioner's probe).
GENERATION_LABEL = "tpuserve-generation"


class BodyError(ValueError):
    """A queued-resource body that cannot be right (caught locally, before any API call)."""


def duration_json(seconds: int) -> str:
    """google.protobuf.Duration's JSON form."""
    return f"{seconds}s"


def build_body(d: Deployment, startup_script: str) -> dict[str, Any]:
    """The v2alpha1 QueuedResource create body for a flex deployment."""
    if not d.kind.queued_resource:
        raise ValueError(
            f"stack.provisioning_model = {d.stack.provisioning_model!r}: a queued-resource body "
            "is built for the flex stack only"
        )
    body: dict[str, Any] = {
        "provisioningModel": "FLEX_START",
        # SPEC 2: flex-start is the only model that accepts a max run duration.
        "runDuration": {"maxRunDuration": duration_json(d.stack.max_run_seconds)},
        "tpu": {
            "nodeSpec": [
                {
                    "parent": d.tpu_parent,
                    "nodeId": d.node_name,
                    "node": {
                        "acceleratorType": d.tpu.accelerator_type,
                        "runtimeVersion": d.tpu.runtime_version,
                        # Raw REST without enableExternalIps means no external IP.
                        "networkConfig": network_config(d),
                        "shieldedInstanceConfig": {"enableSecureBoot": True},
                        "metadata": node_metadata(startup_script),
                        "serviceAccount": {
                            "email": d.service_account_email,
                            "scope": [CLOUD_PLATFORM_SCOPE],
                        },
                        "tags": [d.network_tag],
                        "labels": dict(d.labels),
                    },
                }
            ]
        },
    }
    if d.stack.valid_until_seconds:
        body["queueingPolicy"] = {"validUntilDuration": duration_json(d.stack.valid_until_seconds)}
    return body


def network_config(d: Deployment) -> dict[str, Any]:
    """The node's networkConfig: the deployment's own network and subnet, or
    the network the user brings (gcp.network)."""
    out: dict[str, Any] = {"network": d.network_name}
    if d.subnet_name:
        out["subnetwork"] = d.subnet_name
    out["enableExternalIps"] = True
    return out


def with_generation(body: Mapping[str, Any], generation: str) -> dict[str, Any]:
    """A copy of `body` whose node labels carry the plan's generation token."""
    if not re.fullmatch(r"[a-z0-9_-]{1,63}", generation):
        raise ValueError(
            f"generation {generation!r}: a label value is 1-63 lowercase letters, digits, "
            "'-' or '_'"
        )
    out = copy.deepcopy(dict(body))
    for spec in out["tpu"]["nodeSpec"]:
        spec["node"].setdefault("labels", {})[GENERATION_LABEL] = generation
    return out


def check_body(parent: str, body: object) -> dict[str, Any]:
    """Reject a body the API would reject for reasons we can see locally; `parent` is the
    queued resource's own projects/P/locations/Z."""
    if not isinstance(body, dict):
        raise BodyError(f"queued resource body: must be a JSON object, got {type(body).__name__}")
    specs = body.get("tpu", {}).get("nodeSpec") if isinstance(body.get("tpu"), dict) else None
    if not isinstance(specs, list) or not specs:
        raise BodyError("queued resource body: tpu.nodeSpec must be a non-empty list")
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("node"), dict):
            raise BodyError(f"queued resource body: tpu.nodeSpec[{i}].node must be an object")
        if spec.get("parent") != parent:
            raise BodyError(
                f"queued resource body: tpu.nodeSpec[{i}].parent = {spec.get('parent')!r}: must "
                f"be {parent!r} (the queued resource's own project and zone)"
            )
        if not spec.get("nodeId"):
            raise BodyError(f"queued resource body: tpu.nodeSpec[{i}].nodeId is required")
    return body


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if len(text) > 60:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return f"<{len(text)} chars, sha256 {digest}>"
    return repr(value)


def spec_differences(wanted: object, actual: object, path: str = "") -> list[str]:
    """Fields of `wanted` that `actual` lacks or holds differently (output-only fields and
    server-side defaults in `actual` are ignored)."""
    if isinstance(wanted, dict):
        if not isinstance(actual, dict):
            return [f"{path or '(body)'}: {_short(actual)}, want an object"]
        out: list[str] = []
        for key, value in wanted.items():
            sub = f"{path}.{key}" if path else key
            if key not in actual:
                out.append(f"{sub}: missing, want {_short(value)}")
            else:
                out.extend(spec_differences(value, actual[key], sub))
        return out
    if isinstance(wanted, list) and wanted and all(isinstance(w, dict) for w in wanted):
        if not isinstance(actual, list) or len(actual) != len(wanted):
            return [f"{path}: {_short(actual)}, want {len(wanted)} item(s)"]
        return [d for i, w in enumerate(wanted) for d in spec_differences(w, actual[i],
                                                                         f"{path}[{i}]")]
    if path.endswith(("networkConfig.network", "networkConfig.subnetwork")) and isinstance(
        actual, str
    ):
        # The API may return the network and subnet as full URLs; the name is what matters.
        actual = actual.rsplit("/", 1)[-1]
        wanted = str(wanted).rsplit("/", 1)[-1]
    if wanted != actual:
        return [f"{path}: {_short(actual)}, want {_short(wanted)}"]
    return []


def body_metadata(body: Mapping[str, Any]) -> dict[str, str]:
    """The node metadata the body asks for (tpu.nodeSpec[0].node.metadata; {} when none): what
    can change on a running node in place (TPU API nodes.patch, updateMask=metadata)."""
    specs = body.get("tpu", {}).get("nodeSpec") or [{}]
    return dict(specs[0].get("node", {}).get("metadata") or {})


def body_without_metadata(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `body` without any node's metadata: what only a new queued resource can
    change (the flex stack hashes it to decide a replacement; `body_metadata` is the rest)."""
    out = copy.deepcopy(dict(body))
    for spec in out.get("tpu", {}).get("nodeSpec") or []:
        if isinstance(spec, dict) and isinstance(spec.get("node"), dict):
            spec["node"].pop("metadata", None)
    return out
