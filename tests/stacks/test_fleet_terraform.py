"""The fleet stack's Kubernetes bundle through REAL Terraform: its provisioners run
`python -m tpuserve.kubectl` against a fake `gcloud` and `kubectl` on PATH
(tests/fakes/kubectl/: each records its argv, stdin and KUBECONFIG).

tests/terraform_support.OfflineStack keeps the stack's `terraform_data` resources exactly as
synthesized. Two things are set aside, each covered elsewhere: the base preflight
(`data.external.base_preflight`, tests/stacks/test_base_lifecycle.py), and the cluster, which
no provider can create offline: its id (in both resources' triggers) is played by a built-in
`terraform_data.cluster` whose generation the test sets. The bundle renderer is replaced by a
few small objects (tpuserve/render/fleet_bundle.py is tested on its own).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gcp.test_fleet_check import PROJECT, REGION, SPOT, fleet_cloud
from tests.terraform_support import TERRAFORM, OfflineStack
from tpuserve.paths import REPO_ROOT
from tpuserve.render import fleet_bundle
from tpuserve.settings import from_raw, load_raw
from tpuserve.settings.fleet import ADAPTER_IMAGE_TAG, PICKER_IMAGE_TAG, PLACEHOLDER_DIGEST

pytestmark = pytest.mark.skipif(
    TERRAFORM is None, reason="the terraform CLI is not installed; these tests apply the "
    "stack's built-in resources with it")

FAKES = REPO_ROOT / "tests" / "fakes" / "kubectl"
IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
CLUSTER_REF = "${google_container_cluster.cluster.id}"


def objects(image: str, replicas: int, picker: bool = False) -> list[dict[str, Any]]:
    out = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tpuserve"}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "vllm", "namespace": "tpuserve"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "vllm", "namespace": "tpuserve"},
         "spec": {"replicas": replicas, "template": {"spec": {"containers": [
             {"name": "vllm", "image": image}]}}}},
    ]
    if picker:  # what the apply waits for: the picker available, the Gateway Programmed
        out += [
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": fleet_bundle.EPP, "namespace": "tpuserve"},
             "spec": {"replicas": 1, "template": {"spec": {"containers": [
                 {"name": "epp", "image": PICKER}]}}}},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
             "metadata": {"name": fleet_bundle.GATEWAY, "namespace": "tpuserve"},
             "spec": {"gatewayClassName": "gke-l7-regional-external-managed",
                      "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}},
        ]
    return out


PICKER = f"{PICKER_IMAGE_TAG}@sha256:{'cd' * 32}"
ADAPTER = f"{ADAPTER_IMAGE_TAG}@sha256:{'ef' * 32}"


def fleet_raw(image: str, picker: str = PICKER) -> dict[str, Any]:
    raw = load_raw(environ={})
    raw["stacks"]["fleet"] = {"provisioning_model": "fleet", "vllm": {"image": image},
                              "fleet": {"picker_image": picker, "adapter_image": ADAPTER}}
    return raw


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict[str, Any]]]:
    """{variant: (its bundle, the fleet stack's JSON)}: a first bundle, a changed one, and one
    whose image carries the placeholder digest."""
    import main

    placeholder = "vllm/vllm-tpu:nightly@" + PLACEHOLDER_DIGEST
    picker_placeholder = f"{PICKER_IMAGE_TAG}@{PLACEHOLDER_DIGEST}"
    variants = {"first": (IMAGE, 1, PICKER), "changed": (IMAGE, 2, PICKER),
                "placeholder": (placeholder, 1, PICKER),
                "picker-placeholder": (IMAGE, 1, picker_placeholder),
                "with-picker": (IMAGE, 1, PICKER)}
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, (image, replicas, picker) in variants.items():
        with_picker = name == "with-picker"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fleet_bundle, "render_objects",
                       lambda d, image=image, replicas=replicas, p=with_picker, **_:
                       objects(image, replicas, p))
            d = from_raw(fleet_raw(image, picker)).deployments["fleet"]
            bundle = fleet_bundle.render_bundle(d)
            outdir = tmp_path_factory.mktemp(f"fleet-{name}")
            main.build_app({"fleet": d}, outdir=str(outdir)).synth()
        out[name] = (bundle, json.loads((outdir / "stacks/fleet/cdk.tf.json").read_text()))
    return out


def offline(doc: dict[str, Any], cluster_generation: str = "1",
            keep_data: tuple[str, ...] = ()) -> dict[str, Any]:
    """The stack's terraform_data, the cluster played by a built-in stand-in; of its
    data.external sources only `keep_data`."""
    doc = copy.deepcopy(doc)
    sources = doc.pop("data", {}).get("external", {})
    if keep_data:
        doc["data"] = {"external": {k: sources[k] for k in keep_data}}
    data = doc["resource"]["terraform_data"]
    for res in data.values():
        assert res["triggers_replace"]["cluster_id"] == CLUSTER_REF
        res["triggers_replace"]["cluster_id"] = "${terraform_data.cluster.id}"
    data["cluster"] = {"triggers_replace": cluster_generation}
    return doc


class Kube:
    """The fake tools' record."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def calls(self) -> list[dict[str, Any]]:
        path = self.log / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def kubectl(self) -> list[dict[str, Any]]:
        return [c for c in self.calls() if c["tool"] == "kubectl"]

    def clear(self) -> None:
        (self.log / "calls.jsonl").unlink(missing_ok=True)


@pytest.fixture
def kube(tmp_path: Path) -> Kube:
    log = tmp_path / "kube-log"
    log.mkdir()
    return Kube(log)


@pytest.fixture
def env(tmp_path: Path, kube: Kube) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "PATH": f"{FAKES}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(home), "TPUSERVE_PYTHON": sys.executable,
            # The provisioners run from the stack's root (here tmp_path): this checkout's code.
            "PYTHONPATH": str(REPO_ROOT),
            "FAKE_KUBE_PYTHON": sys.executable, "FAKE_KUBE_LOG": str(kube.log)}


def step_says(run) -> list[str]:
    """What the provisioner printed (Terraform prefixes each of its lines, and wraps the same
    text into its own error on stderr)."""
    marker = "(local-exec): tpuserve:"
    return [ln.split("(local-exec): ", 1)[1] for ln in run.stdout.splitlines() if marker in ln]


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_apply_reapply_and_delete(docs, kube: Kube, env, tmp_path: Path) -> None:
    bundle, doc = docs["first"]
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc))

    # deploy: credentials into a private kubeconfig, then exactly the bundle, server-side.
    done = tf.apply()
    assert "applied 3 objects to tpuserve-fleet" in done.stdout, done.stdout
    gcloud, kubectl = kube.calls()
    assert gcloud["tool"] == "gcloud"
    assert gcloud["argv"] == ["container", "clusters", "get-credentials", "tpuserve-fleet",
                              "--zone", "us-west4-a", "--project", "tpuserve-placeholder"]
    config = gcloud["kubeconfig"]
    assert config and not config.startswith(env["HOME"])  # never the user's ~/.kube/config
    assert kubectl["kubeconfig"] == config
    assert kubectl["kubeconfig_text"] == "current-context: gke_tpuserve-fleet\n"
    assert kubectl["argv"] == ["apply", "--server-side", "--force-conflicts",
                               "--field-manager=tpuserve", "-f", "-"]
    assert kubectl["stdin"] == bundle
    assert not Path(config).exists()  # removed after the run
    assert sorted(tf.state()) == ["terraform_data.cluster", "terraform_data.k8s_bundle",
                                  "terraform_data.k8s_teardown"]

    # an unchanged stack plans nothing and calls nothing.
    kube.clear()
    done = tf.apply()
    assert "0 added, 0 changed, 0 destroyed" in done.stdout, done.stdout
    assert kube.calls() == []

    # a changed bundle re-applies, in place: nothing is deleted in between.
    changed, changed_doc = docs["changed"]
    assert changed != bundle
    tf.use(offline(changed_doc))
    done = tf.apply()
    assert "Resources: 1 added, 1 changed, 1 destroyed" in done.stdout, done.stdout
    assert "terraform_data.k8s_teardown: Modifying" in done.stdout
    [call] = kube.kubectl()
    assert call["argv"][:2] == ["apply", "--server-side"]
    assert call["stdin"] == changed

    # destroy: the latest bundle's objects go, namespace last.
    kube.clear()
    done = tf.destroy()
    assert "deleted the bundle's 3 objects from tpuserve-fleet" in done.stdout, done.stdout
    calls = kube.calls()
    assert calls[0]["tool"] == "gcloud"
    deletes = [c for c in calls if c["tool"] == "kubectl"]
    assert [c["argv"][:2] for c in deletes] == [["delete", "--ignore-not-found"]] * 2
    first, last = (list(yaml.safe_load_all(c["stdin"])) for c in deletes)
    assert [o["kind"] for o in first] == ["Deployment", "ServiceAccount"]
    assert [o["kind"] for o in last] == ["Namespace"]
    assert first[0]["spec"]["replicas"] == 2  # the latest bundle's
    assert tf.state() == []


def test_a_new_cluster_gets_the_bundle_again(docs, kube: Kube, env, tmp_path: Path) -> None:
    bundle, doc = docs["first"]
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc, cluster_generation="1"))
    tf.apply()
    kube.clear()
    tf.use(offline(doc, cluster_generation="2"))
    tf.apply()
    kubectl = kube.kubectl()
    # the old cluster's objects are deleted before it goes; the new one gets the bundle.
    assert [c["argv"][0] for c in kubectl] == ["delete", "delete", "apply"]
    assert kubectl[-1]["stdin"] == bundle


def test_the_placeholder_digest_fails_the_plan_before_anything_exists(
        docs, kube: Kube, env, tmp_path: Path) -> None:
    _bundle, doc = docs["placeholder"]
    assert doc["data"]["external"]["image_preflight"]["query"] == {
        "image": "vllm/vllm-tpu:nightly@" + PLACEHOLDER_DIGEST, "picker_image": PICKER,
        "adapter_image": ADAPTER}
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc, keep_data=("image_preflight",)))
    failed = tf.apply(ok=False)  # the data source's program: terraform never got to apply
    assert failed.returncode == 2
    line = one_line(failed.stderr)
    assert line.startswith("tpuserve: vllm.image = ") and "placeholder digest" in line
    assert "crane digest vllm/vllm-tpu:nightly`" in line
    assert failed.stdout == ""
    assert kube.calls() == []
    assert not (tf.dir / "terraform.tfstate").exists()


def test_the_apply_step_reads_the_cluster_through_its_private_kubeconfig(
        docs, kube: Kube, env, tmp_path: Path) -> None:
    """Under Terraform, the step's waits reach the API through the kubeconfig gcloud wrote
    (here: the fake Kubernetes API): the Gateway API's CRD, the picker, the Gateway."""
    from tests.fakes import kubernetes as k8s

    _bundle, doc = docs["with-picker"]
    with k8s.FakeKubernetes() as api:
        api.put(k8s.crd("gateways.gateway.networking.k8s.io"))
        api.put(k8s.deployment("tpuserve", fleet_bundle.EPP, desired=1, ready=1,
                               labels=fleet_bundle.EPP_LABEL))
        api.put(k8s.gateway("tpuserve", fleet_bundle.GATEWAY, address="203.0.113.7"))
        tf = OfflineStack(tmp_path, "fleet",
                          {**env, "FAKE_KUBECONFIG_TEXT": api.kubeconfig("gke_p_z_c")})
        tf.use(offline(doc))
        done = tf.apply()
        paths = [p for _m, p, _q in api.requests]
    assert "applied 5 objects to tpuserve-fleet" in done.stdout, done.stdout
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
    gws = "/apis/gateway.networking.k8s.io/v1/namespaces/tpuserve/gateways/"
    assert paths == [crd + "gateways.gateway.networking.k8s.io",
                     f"/apis/apps/v1/namespaces/tpuserve/deployments/{fleet_bundle.EPP}",
                     gws + fleet_bundle.GATEWAY]
    applies = [[o["kind"] for o in yaml.safe_load_all(c["stdin"])]
               for c in kube.kubectl() if c["argv"][0] == "apply"]
    assert applies == [["Namespace", "ServiceAccount", "Deployment", "Deployment"], ["Gateway"]]


def test_the_pickers_placeholder_digest_fails_the_plan(
        docs, kube: Kube, env, tmp_path: Path) -> None:
    """No upstream records the picker's digest: the default's placeholder stops the plan."""
    _bundle, doc = docs["picker-placeholder"]
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc, keep_data=("image_preflight",)))
    failed = tf.apply(ok=False)
    assert failed.returncode == 2
    line = one_line(failed.stderr)
    assert line.startswith(f"tpuserve: fleet.picker_image = '{PICKER_IMAGE_TAG}@")
    assert "placeholder digest" in line and "in [fleet]" in line
    assert kube.calls() == []


def test_a_pinned_image_passes_the_preflight(docs, kube: Kube, env, tmp_path: Path) -> None:
    _bundle, doc = docs["first"]
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc, keep_data=("image_preflight",)))
    results, failed = tf.read_data()
    assert failed is None
    assert results == {"image_preflight": {"image": IMAGE}}


def test_the_apply_step_refuses_the_placeholder_too(
        docs, kube: Kube, env, tmp_path: Path) -> None:
    """A stack synthesized before the preflight existed still never applies it."""
    _bundle, doc = docs["placeholder"]
    tf = OfflineStack(tmp_path, "fleet", env)
    tf.use(offline(doc))
    failed = tf.apply(ok=False)
    assert failed.returncode != 0
    said = step_says(failed)
    assert len(said) == 1, failed.stdout
    assert "vllm.image" in said[0] and "placeholder digest" in said[0]
    assert "crane digest vllm/vllm-tpu:nightly`" in said[0]
    assert "Traceback" not in failed.stdout + failed.stderr
    assert kube.calls() == []  # no credentials fetched, nothing applied
    # Terraform keeps the failed step's resource tainted: the next apply tries again.
    assert "terraform_data.k8s_bundle is tainted" in tf.run("plan").stdout


def test_a_kubectl_failure_is_one_line(docs, kube: Kube, env, tmp_path: Path) -> None:
    _bundle, doc = docs["first"]
    tf = OfflineStack(tmp_path, "fleet", {**env, "FAKE_KUBECTL_FAIL": "the server is down"})
    tf.use(offline(doc))
    failed = tf.apply(ok=False)
    assert failed.returncode != 0
    assert step_says(failed) == [
        "tpuserve: kubectl apply failed (exit 1): error: the server is down"], failed.stdout
    assert "Traceback" not in failed.stderr


@pytest.mark.parametrize(("image", "words"), [
    ("vllm/vllm-tpu:nightly", "has no digest"),
    ("vllm/vllm-tpu:nightly@" + PLACEHOLDER_DIGEST, "carries the placeholder digest"),
])
def test_the_client_refuses_an_unpinned_image_directly(
        image: str, words: str, kube: Kube, env, capsys) -> None:
    from tpuserve import kubectl

    code = kubectl.main(["apply", "--project", "p", "--location", "z", "--cluster", "c"],
                        {**env, kubectl.ENV_IMAGE: image})
    assert code == 2
    err = capsys.readouterr().err
    assert one_line(err).startswith(f"tpuserve: vllm.image = {image!r} {words}")
    assert kube.calls() == []


@pytest.mark.parametrize(("stdin", "words"), [
    ("not json", "stdin is not JSON"),
    ('{"image": "a@sha256:%s", "extra": "x"}' % ("ab" * 32), 'stdin must be {"image"'),
    ('{"image": 3}', 'stdin must be {"image"'),
    ('{"image": ""}', "vllm.image is not set"),
    ('{"image": "vllm/vllm-tpu:nightly"}', "has no digest"),
])
def test_the_preflight_refuses_bad_queries_in_one_line(
        stdin: str, words: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import io

    from tpuserve import kubectl

    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert kubectl.main(["preflight"], {}) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert words in one_line(out.err)


def test_a_missing_tool_is_one_line(kube: Kube, env, tmp_path: Path, capsys) -> None:
    from tpuserve import kubectl

    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(yaml.safe_dump_all(objects(IMAGE, 1)))
    code = kubectl.main(["delete", "--project", "p", "--location", "z", "--cluster", "c",
                         "--bundle-file", str(bundle)], {**env, "PATH": str(tmp_path)})
    assert code == 1
    assert one_line(capsys.readouterr().err).startswith(
        "tpuserve: gcloud not found on PATH")


def test_crds_are_applied_and_established_first(kube: Kube, env, tmp_path: Path) -> None:
    from tpuserve import kubectl

    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "inferencepools.inference.networking.k8s.io"}}
    docs_in = [crd, *objects(IMAGE, 1)]
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(yaml.safe_dump_all(docs_in, sort_keys=False))
    code = kubectl.main(["apply", "--project", "p", "--location", "z", "--cluster", "c",
                         "--image", IMAGE, "--bundle-file", str(bundle)], env)
    assert code == 0
    calls = kube.kubectl()
    assert [c["argv"][0] for c in calls] == ["apply", "wait", "apply"]
    assert [o["kind"] for o in yaml.safe_load_all(calls[0]["stdin"])] == [
        "CustomResourceDefinition"]
    assert list(yaml.safe_load_all(calls[2]["stdin"])) == docs_in[1:]
    # deletion: namespaced objects, then the namespace, then the CRD.
    kube.clear()
    assert kubectl.main(["delete", "--project", "p", "--location", "z", "--cluster", "c",
                         "--bundle-file", str(bundle)], env) == 0
    kinds = [[o["kind"] for o in yaml.safe_load_all(c["stdin"])] for c in kube.kubectl()]
    assert kinds == [["Deployment", "ServiceAccount"], ["Namespace"],
                     ["CustomResourceDefinition"]]


# ------------------------------------------------------------------ the fleet's preflight


@pytest.fixture(scope="module")
def preflight_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fleet of project PROJECT (the fakes' project), floor 2, spot then on-demand."""
    import main

    raw = fleet_raw(IMAGE)
    raw["gcp"] = {**raw["gcp"], "project": PROJECT}
    raw["stacks"]["fleet"]["fleet"] = {"provisioning": ["spot", "ondemand"], "min_replicas": 2,
                                       "max_replicas": 4}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fleet_bundle, "render_objects", lambda d, **_: objects(IMAGE, 1))
        d = from_raw(raw).deployments["fleet"]
        outdir = tmp_path_factory.mktemp("fleet-preflight")
        main.build_app({"fleet": d}, outdir=str(outdir)).synth()
    return json.loads((outdir / "stacks/fleet/cdk.tf.json").read_text())


@pytest.fixture
def cloud() -> Iterator[dict[str, Any]]:
    """Fake Compute, Container and Service Usage APIs where the fleet has all it needs."""
    with fleet_cloud() as fakes:
        yield fakes


def test_the_fleet_preflight_fails_the_plan_one_line_per_failure(
        preflight_doc, cloud, kube: Kube, env, tmp_path: Path) -> None:
    """No quota for the floor and an API off: Terraform's plan stops at the data source, with
    one line for each, before anything exists."""
    cloud["compute"].set_quota(REGION, SPOT, 1, 0)
    cloud["usage"].enabled.discard("networkservices.googleapis.com")
    tf = OfflineStack(tmp_path, "fleet", {**env, **cloud["env"]})
    tf.use(offline(preflight_doc, keep_data=("fleet_preflight",)))
    failed = tf.apply(ok=False)
    assert failed.returncode == 1 and failed.stdout == ""
    lines = failed.stderr.splitlines()
    assert len(lines) == 2, failed.stderr
    assert lines[0].startswith("tpuserve: API networkservices.googleapis.com is not proven "
                               "enabled")
    assert lines[1].startswith(f"tpuserve: quota {SPOT} in {REGION} leaves 1 chip")
    assert kube.calls() == []
    assert not (tf.dir / "terraform.tfstate").exists()


def test_the_fleet_preflight_passes_with_everything_proven(
        preflight_doc, cloud, env, tmp_path: Path) -> None:
    tf = OfflineStack(tmp_path, "fleet", {**env, **cloud["env"]})
    tf.use(offline(preflight_doc, keep_data=("fleet_preflight",)))
    results, failed = tf.read_data()
    assert failed is None
    assert results == {"fleet_preflight": {"fleet": "ok", "warnings": "0", "warning_text": ""}}
