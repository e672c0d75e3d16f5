"""The base and a serving stack through a whole life, with real Terraform and real boots.

`cdktf deploy base`, then `deploy flex`, a boot, `destroy flex`, `deploy flex` again and a
second boot on a new node, a config change, and the teardown. Terraform runs the stacks'
built-in part for real (tests/terraform_support.OfflineStack: the provisioners run
`python -m tpuserve.queued_resource` and `python -m tpuserve.base_check` against the fakes); the
base's google-beta resources, which no provider can create offline, are created in the fakes
from the base's synthesized JSON (every secret, bucket and service account it declares). The
boots are the rendered boot script run by bash (tests/render/boot/support.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.container import FakeContainer
from tests.fakes.iam import FakeIam
from tests.fakes.metadata import FakeMetadata
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.storage import FakeStorage
from tests.fakes.tpu_api import ZERO_DURATIONS, FakeTpuApi
from tests.ports import free_port
from tests.render.boot.support import Cloud
from tests.terraform_support import TERRAFORM, OfflineStack
from tpuserve.render.boot_script import render_startup
from tpuserve.settings import Deployment, from_raw, load_raw

pytestmark = pytest.mark.skipif(
    TERRAFORM is None, reason="the terraform CLI is not installed; these tests apply the "
    "stacks' built-in resources with it")

TOKEN = "ya29.lifecycle-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory, deployments) -> tuple[Deployment, dict]:
    """flex with a vLLM setting changed: only the boot script (node metadata) differs."""
    import main

    raw = load_raw(environ={})
    raw["stacks"] = {"flex": {**raw["stacks"]["flex"], "vllm": {"max_model_len": 16384}}}
    d = from_raw(raw).deployments["flex"]
    assert d.vllm.max_model_len != deployments["flex"].vllm.max_model_len
    out = tmp_path_factory.mktemp("flex-metadata")
    main.build_app({"flex": d}, outdir=str(out)).synth()
    return d, json.loads((out / "stacks/flex/cdk.tf.json").read_text())


class Project:
    """The fakes of one project (empty: nothing deployed) and the environment for Terraform."""

    def __init__(self, root: Path, d: Deployment) -> None:
        self.d = d
        self.root = root
        self.metadata = FakeMetadata(access_token=TOKEN).start()
        self.secrets = FakeSecretManager(project=d.gcp.project, access_token=TOKEN).start()
        # The fake's one object-holding bucket carries the cache bucket's name (buckets.get
        # finds it from the start: the missing base below is told by its secrets).
        self.storage = FakeStorage(bucket=d.cache_bucket, access_token=TOKEN).start()
        self.iam = FakeIam(project=d.gcp.project, access_token=TOKEN).start()
        self.tpu = FakeTpuApi(token=TOKEN, durations=ZERO_DURATIONS).start()
        # The teardown guard looks for the fleet's GKE cluster too (none here: flex only).
        self.gke = FakeContainer(project=d.gcp.project, access_token=TOKEN).start()
        self.env = {
            **os.environ, **self.tpu.environ(),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": self.secrets.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": self.storage.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": self.iam.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": self.gke.endpoint,
            "CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN,
            "TPUSERVE_PYTHON": sys.executable,
            "TPUSERVE_QR_POLL_SECONDS": "0",
            "TPUSERVE_TIME_SCALE": "0.001",
        }
        self.cloud = Cloud(d, TOKEN, "hf_" + os.urandom(16).hex(), "tpk-" + os.urandom(20).hex(),
                           self.metadata, self.secrets, self.storage, self.tpu, free_port(),
                           free_port(), root / "nodes")

    def create_base_resources(self, base_doc: dict[str, Any]) -> None:
        """What google-beta would create from the base's JSON, created in the fakes."""
        res = base_doc["resource"]
        for secret in res["google_secret_manager_secret"].values():
            self.secrets.create_secret(secret["secret_id"])
        for bucket in res["google_storage_bucket"].values():
            self.storage.add_bucket(bucket["name"])
        for account in res["google_service_account"].values():
            self.iam.create_account(account["account_id"])

    def boot(self, d: Deployment) -> dict[str, str]:
        """A new TPU VM of stack `d` boots with the rendered script: its guest attributes."""
        node = self.cloud.node(d)
        node.run()
        return node.attrs()

    def stop(self) -> None:
        for node in self.cloud.nodes:
            node.stop()
        for fake in (self.metadata, self.secrets, self.storage, self.iam, self.tpu, self.gke):
            fake.stop()


@pytest.fixture
def project(tmp_path: Path, deployments) -> Iterator[Project]:
    p = Project(tmp_path, deployments["flex"])
    yield p
    p.stop()


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_destroy_flex_keeps_the_base_and_the_next_node_boots_warm(
        project: Project, synthesized, changed, tmp_path: Path) -> None:
    d = project.d
    qr_name = d.queued_resource_name
    base = OfflineStack(tmp_path, "base", project.env)
    base.use(synthesized["base"])
    flex = OfflineStack(tmp_path, "flex", project.env)
    flex.use(synthesized["flex"])

    # 0. No base yet: the plan's preflight stops `deploy flex` in one line, nothing created.
    failed = flex.apply(ok=False)
    said = one_line(failed.stderr)
    assert said.startswith("tpuserve: the base of deployment 'tpuserve' is not deployed in "
                           "project 'tpuserve-placeholder' (region us-west4): missing secret "
                           "tpuserve-hf-token, tpuserve-api-key")
    assert said.endswith("Create it first: cdktf deploy base")
    assert project.tpu.state_of(qr_name) is None and not project.tpu.calls("POST")

    # 1. deploy base (once), and the user adds the two secret versions (once).
    base.apply()
    project.create_base_resources(synthesized["base"])
    project.secrets.add_version(d.hf_token_secret_id, project.cloud.hf_token.encode())
    project.secrets.add_version(d.api_key_secret_id, project.cloud.api_key.encode())
    base_state = base.state()
    assert base_state == ["terraform_data.teardown_guard"]

    # 2. deploy flex: the QR; converge finds the node booting with this very metadata.
    done = flex.apply()
    assert "metadata unchanged" in done.stdout or "nothing to do" in done.stdout, done.stdout
    assert project.tpu.state_of(qr_name) == "ACTIVE"
    first = project.boot(d)
    assert first["cache"].startswith("miss"), first
    assert first["cache_publish"].startswith("published"), first
    [cache_object] = project.storage.objects
    published = project.storage.objects[cache_object].data

    # 3. destroy flex: the QR goes (its node powers off); the base, its secrets and the cache
    # stay.
    flex.destroy()
    project.cloud.nodes[-1].stop()
    assert project.tpu.queued_resource(qr_name) is None
    assert base.state() == base_state
    assert project.storage.objects[cache_object].data == published

    # 4. deploy flex again, a new node: no secret to add, and it boots warm from the cache.
    flex.apply()
    assert project.tpu.state_of(qr_name) == "ACTIVE"
    second = project.boot(d)
    assert second["cache"].startswith("hit"), second
    assert "published" not in second["cache_publish"], second
    assert list(project.storage.objects) == [cache_object]

    # 5. a vLLM setting changes: the running node's metadata is patched, the QR (and its
    # capacity) stays: its input is updated in place (no provisioner runs), node_metadata is
    # replaced and its converge step patches the node.
    posts, deletes = len(project.tpu.calls("POST")), len(project.tpu.calls("DELETE"))
    flex.use(changed[1])
    done = flex.apply()
    assert "Resources: 1 added, 1 changed, 1 destroyed" in done.stdout, done.stdout
    assert "terraform_data.queued_resource: Modifying" in done.stdout
    assert "metadata updated in place" in done.stdout
    assert len(project.tpu.calls("POST")) == posts
    assert len(project.tpu.calls("DELETE")) == deletes
    assert [r.query["updateMask"] for r in project.tpu.calls("PATCH")] == ["metadata"]
    node = project.tpu.node_json(d.node_name)
    assert node["metadata"]["startup-script"] == render_startup(changed[0])

    # 6. destroy base while flex still serves: refused, naming the command; nothing goes.
    refused = base.destroy(ok=False)
    assert refused.returncode != 0
    assert "cdktf destroy flex" in refused.stdout + refused.stderr
    assert base.state() == base_state

    # 7. destroy flex; while the deployment's GKE cluster (a fleet stack, as its synthesized
    # JSON declares it) is up, or a zone of the region does not answer the cluster list, the
    # base stays; then it may go.
    flex.destroy()
    declared = synthesized["fleet"]["resource"]["google_container_cluster"]["cluster"]
    cluster = project.gke.add_cluster(declared["location"], "tpuserve-fleet",
                                      labels=declared["resource_labels"])
    refused = base.destroy(ok=False)
    said = " ".join((refused.stdout + refused.stderr).split())  # Terraform wraps its error
    assert refused.returncode != 0
    assert ("tpuserve: serving stack 'fleet' is still up: GKE cluster projects/"
            f"{d.gcp.project}/locations/{d.gcp.zone}/clusters/tpuserve-fleet (RUNNING); remove "
            "it with `cdktf destroy fleet`") in said
    project.gke.remove_cluster(cluster.location, cluster.name)
    project.gke.missing_zones.add(d.gcp.zone)
    refused = base.destroy(ok=False)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0
    assert (f"zone(s) {d.gcp.zone} of {d.gcp.region} did not answer (missingZones): the list "
            "may be missing their clusters; the base of deployment 'tpuserve'") in said
    assert "was NOT destroyed" in said
    assert base.state() == base_state
    project.gke.missing_zones.clear()
    gone = base.destroy()
    assert "the base may go" in gone.stdout
    assert base.state() == []
