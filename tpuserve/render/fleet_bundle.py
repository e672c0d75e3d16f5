"""The fleet's Kubernetes objects, rendered from the config (templates/fleet/).

Interface (the fleet stack, the CLI and the review use these names; the renderer behind them
is built in templates/fleet/):
- `render_objects(d) -> list[dict]`: every object, in apply order;
- `render_bundle(d) -> str`: the objects as one multi-document YAML text (what `kubectl apply
  --server-side -f -` reads, and what the stack's `terraform_data.k8s_bundle` stores);
- `bundle_sha256(text) -> str`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

# Names every consumer shares.
NAMESPACE = "tpuserve"
DEPLOYMENT = "vllm"          # the vLLM Deployment (its pods: label app=vllm)
SERVICE = "vllm"
HPA = "vllm"
KSA = "vllm"                 # the pods' Kubernetes service account (Workload Identity)
GATEWAY = "tpuserve"
APP_LABEL = {"app": "vllm"}
PROXY_PORT = 8080            # the API-key proxy sidecar: every path but /health needs the key
WEIGHTS_JOB = "stage-weights"


def render_objects(d: Deployment) -> list[dict[str, Any]]:
    raise NotImplementedError("the fleet bundle renderer is being built (issue 14)")


def render_bundle(d: Deployment) -> str:
    import yaml

    return yaml.safe_dump_all(render_objects(d), sort_keys=False)


def bundle_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
