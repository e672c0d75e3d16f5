"""Ordering from the API's point of view: Terraform orders resources only by
references and `depends_on`; an API refuses a call that names something not yet created. This
walks the synthesized fleet stack and fails when a resource names what another resource of the
stack creates without a dependency path to it:
- the Workload Identity pool `<project>.svc.id.goog`, which exists once a Workload Identity
  cluster does (IAM: "Identity Pool does not exist", terraform-google-kubernetes-engine #916);
- the cluster's and the pools' names (`cluster = ...`, the bundle's ComputeClass pools);
- the kinds GKE installs with the cluster's add-ons (the bundle's Gateway, InferencePool,
  PodMonitoring, SecretProviderClass, ComputeClass, policies): only the cluster brings them;
- any other literal `name` a google resource of the stack gets (the address the Gateway names,
  the certificate), named as a whole token in another resource's strings.
Network tags (`tags`, `target_tags`) are labels, not names of resources, and are not walked;
nor are the plan-time checks (`data.external`), which look things up and take their absence as
an answer (tpuserve.gcp.fleet_check asks whether the cluster exists yet).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import synth
from tpuserve.settings import from_raw, load_raw

IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
# Kinds the cluster's add-ons and GKE itself install (not the bundle): their CRDs come with it.
CLUSTER_KINDS = ("Gateway", "HTTPRoute", "InferencePool", "PodMonitoring", "ClusterPodMonitoring",
                 "SecretProviderClass", "ComputeClass", "HealthCheckPolicy", "GCPBackendPolicy",
                 "GCPGatewayPolicy")
NOT_NAMES = ("tags", "target_tags")
_REF = re.compile(r"\$\{[^}]*?\b((?:data\.)?[a-z0-9_]+\.[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    raw = load_raw(environ={})
    raw["stacks"]["fleet"] = {
        "provisioning_model": "fleet", "vllm": {"image": IMAGE},
        "fleet": {"provisioning": ["flex", "spot", "ondemand"], "domain": "llm.example.com"}}
    d = from_raw(raw).deployments["fleet"]
    return synth({"fleet": d}, Path(tmp_path_factory.mktemp("ordering")))["fleet"]


def nodes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every resource and data source by its Terraform address."""
    out = {f"{kind}.{name}": body for kind, items in doc.get("resource", {}).items()
           for name, body in items.items()}
    out.update({f"data.{kind}.{name}": body for kind, items in doc.get("data", {}).items()
                for name, body in items.items()})
    return out


def strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, string) for every string leaf, network tags left out."""
    if key in NOT_NAMES:
        return
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v, key)


def edges(body: dict[str, Any], known: set[str]) -> set[str]:
    """The addresses one resource depends on: depends_on and ${...} references."""
    out = {dep for dep in body.get("depends_on", []) if dep in known}
    for _key, text in strings({k: v for k, v in body.items() if k != "depends_on"}):
        out |= {ref for ref in _REF.findall(text) if ref in known}
    return out


def created_names(graph: dict[str, dict[str, Any]]) -> dict[str, list[re.Pattern[str]]]:
    """creator address -> patterns of what it creates, as others would name it."""
    made: dict[str, list[re.Pattern[str]]] = {}
    for addr, body in graph.items():
        if addr.startswith("data.") or not addr.startswith("google_"):
            continue
        pats = []
        name = body.get("name")
        if isinstance(name, str) and "${" not in name:
            pats.append(re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])"))
        if addr.startswith("google_container_cluster."):
            pool = body.get("workload_identity_config", {}).get("workload_pool")
            if pool:
                pats.append(re.compile(re.escape(pool)))
            pats.append(re.compile(rf"^kind: (?:{'|'.join(CLUSTER_KINDS)})$", re.M))
        made[addr] = pats
    return made


def violations(doc: dict[str, Any]) -> list[str]:
    graph = nodes(doc)
    known = set(graph)
    deps = {addr: edges(body, known) for addr, body in graph.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            cur = todo.pop()
            if cur == goal:
                return True
            if cur not in seen:
                seen.add(cur)
                todo.extend(deps.get(cur, ()))
        return False

    found = []
    for creator, pats in created_names(graph).items():
        for addr, body in graph.items():
            if addr == creator or addr.startswith("data.external."):
                continue
            if reaches(addr, creator):
                continue
            for pat in pats:
                key = next((k for k, text in strings(body) if pat.search(text)), None)
                if key is not None:
                    found.append(f"{addr} ({key}) names what {creator} creates "
                                 f"({pat.pattern}) without depending on it")
    return sorted(set(found))


def test_nothing_names_what_the_stack_creates_before_it_exists(doc) -> None:
    assert violations(doc) == []


def test_the_walk_sees_the_identity_pool_grants_and_the_bundle_kinds(doc) -> None:
    """The check can fail: the grants as they were (after the preflight only), and a bundle
    that no longer waits for the cluster, are both reported."""
    grants = list(doc["resource"]["google_secret_manager_secret_iam_member"])
    assert grants
    broken = copy.deepcopy(doc)
    for body in broken["resource"]["google_secret_manager_secret_iam_member"].values():
        body["depends_on"] = ["data.external.base_preflight"]
    found = violations(broken)
    assert len(found) == len(grants), found
    assert all("google_container_cluster.cluster" in line and "svc\\.id\\.goog" in line
               for line in found), found

    broken = copy.deepcopy(doc)
    for body in broken["resource"]["terraform_data"].values():
        body["depends_on"] = []
        body["triggers_replace"].pop("cluster_id")
    found = violations(broken)
    assert any(line.startswith("terraform_data.k8s_teardown (bundle) names what "
                               "google_container_cluster.cluster creates") for line in found), found
    # The kinds only the cluster's add-ons install (InferencePool, Gateway, ...).
    assert any("InferencePool" in line and line.startswith("terraform_data.k8s_bundle")
               for line in found), found
    # ... and the pools the bundle's ComputeClass names, and the Gateway's address.
    assert any("google_container_node_pool.tpu_pool_flex" in line for line in found), found
    assert any("google_compute_address.fleet_ip" in line for line in found), found
