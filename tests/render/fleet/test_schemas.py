"""Every rendered object against its schema, offline: core kinds with kubernetes-validate
(strict, at the target minor), custom resources with the CRD schemas tracked in
tests/k8s_schemas/ (its README names each one's source)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from tests.render.fleet.conftest import fleet_deployment
from tpuserve.contracts import MIN_MASTER_VERSION
from tpuserve.paths import REPO_ROOT
from tpuserve.render import fleet_bundle as fb

# The fleet cluster's floor's minor (its min_master_version): 1.34.
K8S_VERSION = ".".join(MIN_MASTER_VERSION.split(".")[:2])
# Tracked with the tests: a missing file is a failure, never a skip.
SCHEMAS = REPO_ROOT / "tests" / "k8s_schemas"
CUSTOM = {
    ("secrets-store.csi.x-k8s.io", "SecretProviderClass"): "secretproviderclass_v1.json",
    ("cloud.google.com", "ComputeClass"): "computeclass_v1.json",
    ("monitoring.googleapis.com", "PodMonitoring"): "podmonitoring_v1.json",
    ("inference.networking.k8s.io", "InferencePool"): "inferencepool_v1.json",
    ("gateway.networking.k8s.io", "Gateway"): "gateway_v1.json",
    ("gateway.networking.k8s.io", "HTTPRoute"): "httproute_v1.json",
    ("networking.gke.io", "HealthCheckPolicy"): "healthcheckpolicy_v1.json",
    ("networking.gke.io", "GCPBackendPolicy"): "gcpbackendpolicy_v1.json",
}


def _group(o: dict) -> str:
    return o["apiVersion"].rpartition("/")[0]


def _variants() -> list[tuple[str, dict]]:
    d = fleet_deployment()
    https = fleet_deployment(domain="llm.example.com", provisioning=["flex", "spot", "ondemand"])
    out = [("default", fb.render_objects(d)), ("https", fb.render_objects(https)),
           ("service", fb.render_objects(d, backend="service"))]
    return [(v, o) for v, objs in out for o in objs]


ALL = _variants()  # rendered once per module
CORE = [i for i in ALL if (_group(i[1]), i[1]["kind"]) not in CUSTOM]
CRS = [i for i in ALL if (_group(i[1]), i[1]["kind"]) in CUSTOM]


def _id(item: tuple[str, dict]) -> str:
    return f"{item[0]}-{item[1]['kind']}-{item[1]['metadata']['name']}"


@pytest.mark.parametrize("item", CORE, ids=_id)
def test_core_kinds_validate_strictly(item) -> None:
    kubernetes_validate.validate(item[1], K8S_VERSION, strict=True)


@pytest.mark.parametrize("item", CRS, ids=_id)
def test_custom_resources_match_their_crd_schema(item) -> None:
    o = item[1]
    path: Path = SCHEMAS / _group(o) / CUSTOM[(_group(o), o["kind"])]
    schema = json.loads(path.read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(o)


def test_every_custom_kind_is_rendered_and_covered() -> None:
    assert set(CUSTOM) <= {(_group(o), o["kind"]) for _, o in ALL}


def test_every_schema_file_is_tracked_and_named_in_its_readme() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    for (group, _), name in CUSTOM.items():
        assert (SCHEMAS / group / name).is_file()
        assert f"`{group}/{name}`" in readme
