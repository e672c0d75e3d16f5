"""The flex stack: its synthesized JSON, and a REAL Terraform run of its queued-resource part.

The Terraform run is offline: the stack's google-beta resources and the hashicorp/external
data source need providers that cannot be downloaded here, so the test extracts the
`terraform_data.queued_resource` resource (built in to Terraform) into a standalone config
and replaces the one reference to `data.external.qr_probe.result.generation` by a variable.
The test computes that variable exactly as the external provider would: it runs the data
source's own `program` (from the synthesized JSON, Terraform's `$${` escapes resolved) in its
own `working_dir`, with the data source's `query` as a JSON object on stdin, and reads the
JSON object of strings it prints. Everything else (the provisioners, their commands,
environment and working_dir, triggers_replace) is the synthesized JSON, unchanged, and the
provisioners really run `python -m tpuserve.queued_resource` against the fake TPU API.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.flex import metadata_sha256, spec_sha256
from tests.fakes.tpu_api import ZERO_DURATIONS, FakeTpuApi
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import render_startup
from tpuserve.render.queued_resource_body import GENERATION_LABEL, build_body, with_generation
from tpuserve.settings import Deployment, from_raw, load_raw

TERRAFORM = shutil.which("terraform")
QR = "projects/tpuserve-placeholder/locations/us-west4-a/queuedResources/tpuserve-flex"
PROBE_REF = "${data.external.qr_probe.result.generation}"


def changed_flex(base: Deployment) -> Deployment:
    """The 'changed' flex deployment: a 2h run instead of 4h."""
    raw = load_raw(environ={})
    raw["stacks"] = {"flex": {**raw["stacks"]["flex"], "max_run_duration": "2h"}}
    changed = from_raw(raw).deployments["flex"]
    assert changed.stack.max_run_duration != base.stack.max_run_duration
    return changed


@pytest.fixture(scope="module")
def flex(
    tmp_path_factory: pytest.TempPathFactory, deployments, synthesized
) -> dict[str, Any]:
    """{variant: (deployment, doc)}: the session's synthesized flex stack, and the changed one
    synthesized once for the module."""
    import main

    base = deployments["flex"]
    changed = changed_flex(base)
    outdir = tmp_path_factory.mktemp("flex-changed")
    main.build_app({"flex": changed}, outdir=str(outdir)).synth()
    return {
        "base": (base, synthesized["flex"]),
        "changed": (changed, json.loads((outdir / "stacks/flex/cdk.tf.json").read_text())),
    }


def untemplate(text: str) -> str:
    """What Terraform makes of a literal string: `$${` -> `${`, `%%{` -> `%{`."""
    assert "${" not in text.replace("$${", ""), f"an interpolation in a literal: {text!r}"
    return text.replace("$${", "${").replace("%%{", "%{")


def untemplate_all(value: Any) -> Any:
    if isinstance(value, str):
        return untemplate(value)
    if isinstance(value, dict):
        return {k: untemplate_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untemplate_all(v) for v in value]
    return value


# ---------------------------------------------------------------- the synthesized stack


def test_the_queued_resource_carries_the_whole_body(flex) -> None:
    d, doc = flex["base"]
    qr = doc["resource"]["terraform_data"]["queued_resource"]
    body = build_body(d, render_startup(d))
    assert qr["input"]["name"] == QR
    # Read literally by Terraform, the input is exactly the client's body (script included).
    assert untemplate_all(qr["input"]["body"]) == body
    assert "$${" in json.dumps(qr["input"]["body"])  # the bash script's ${...} are escaped
    assert qr["triggers_replace"] == {"spec_sha256": spec_sha256(QR, body),
                                      "generation": PROBE_REF}
    # Nothing is created before the plan-time check that the base exists.
    assert qr["depends_on"] == ["data.external.base_preflight", "data.external.qr_probe"]
    # The node's metadata converges apart from the QR: a new boot script is no new QR.
    meta = doc["resource"]["terraform_data"]["node_metadata"]
    assert meta["triggers_replace"] == {"metadata_sha256": metadata_sha256(body),
                                        "queued_resource": "${terraform_data.queued_resource.id}"}
    assert untemplate_all(meta["input"]["body"]) == body
    [step] = meta["provisioner"]
    assert step["local-exec"]["command"].endswith("-m tpuserve.queued_resource converge")


def test_provisioners_read_only_self(flex) -> None:
    _, doc = flex["base"]
    create, destroy = (p["local-exec"]
                       for p in doc["resource"]["terraform_data"]["queued_resource"]
                       ["provisioner"])
    python = "$${TPUSERVE_PYTHON:-.venv/bin/python}"
    assert create["command"] == f"{python} -m tpuserve.queued_resource create"
    assert create["environment"] == {
        "TPUSERVE_QR_NAME": "${self.input.name}",
        "TPUSERVE_QR_BODY_GZ": "${base64gzip(jsonencode(self.input.body))}",
        "TPUSERVE_QR_GENERATION": "${self.triggers_replace.generation}",
    }
    assert destroy == {"when": "destroy", "command": f"{python} -m tpuserve.queued_resource delete",
                       "environment": {"TPUSERVE_QR_NAME": "${self.input.name}"},
                       "working_dir": "${path.module}/../../.."}
    assert create["working_dir"] == "${path.module}/../../.."  # the repo root: .venv/bin/python


def test_probe_is_an_external_data_source(flex) -> None:
    _, doc = flex["base"]
    probe = doc["data"]["external"]["qr_probe"]
    command = "exec $${TPUSERVE_PYTHON:-.venv/bin/python} -m tpuserve.queued_resource probe"
    assert probe["program"] == ["sh", "-c", command]
    assert probe["query"] == {"name": QR}
    assert doc["terraform"]["required_providers"]["external"] == {
        "source": "hashicorp/external", "version": "~> 2.3"}


def test_outputs_say_how_to_reach_the_node(flex) -> None:
    _, doc = flex["base"]
    out = {k: v["value"] for k, v in doc["output"].items()}
    assert out == {"node_name": "tpuserve-flex", "zone": "us-west4-a",
                   "queued_resource_id": "tpuserve-flex", "usd_per_hour": 0.6,
                   "max_run_duration": "4h", "max_run_cost_usd": 2.4,
                   "endpoint_command": "tpuserve wait flex",
                   "dashboard_url": "https://console.cloud.google.com/monitoring/dashboards/"
                                    "custom/tpuserve-serving?project=tpuserve-placeholder"}
    assert "tpuserve endpoint flex" in doc["output"]["endpoint_command"]["description"]


def test_a_changed_body_changes_the_replacement_trigger(flex) -> None:
    triggers = [doc["resource"]["terraform_data"]["queued_resource"]["triggers_replace"]
                for _, doc in flex.values()]
    assert triggers[0]["spec_sha256"] != triggers[1]["spec_sha256"]


# ---------------------------------------------------------------- real Terraform


class Terraform:
    """The queued-resource part of a synthesized flex stack, applied by the terraform CLI."""

    def __init__(self, root: Path, api: FakeTpuApi) -> None:
        # The path the real stack has (cdktf.out/stacks/flex), so ${path.module}/../../.. is
        # `root`, as it is the repo root for `cdktf deploy`.
        self.dir = root / "cdktf.out" / "stacks" / "flex"
        self.dir.mkdir(parents=True)
        cli_config = root / "terraformrc"
        cli_config.write_text("")
        self.env = {
            **os.environ, **api.environ(),
            "TPUSERVE_PYTHON": sys.executable,
            "TPUSERVE_QR_POLL_SECONDS": "0",  # the fake answers at once: no waiting
            "TPUSERVE_TIME_SCALE": "0.001",  # retry pauses (Retry-After too) in milliseconds
            "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0",
            "TF_CLI_CONFIG_FILE": str(cli_config),
        }
        self.doc: dict[str, Any] = {}

    def use(self, doc: dict[str, Any]) -> None:
        """Write the standalone config: the terraform_data resource, the probe as a variable."""
        self.doc = doc
        resource = copy.deepcopy(doc["resource"]["terraform_data"]["queued_resource"])
        resource.pop("//", None)
        resource.pop("depends_on")  # google-beta resources: not part of this offline run
        assert resource["triggers_replace"]["generation"] == PROBE_REF
        resource["triggers_replace"]["generation"] = "${var.qr_generation}"
        config = {"variable": {"qr_generation": {"type": "string"}},
                  "resource": {"terraform_data": {"queued_resource": resource}}}
        (self.dir / "main.tf.json").write_text(json.dumps(config, indent=1))

    def probe(self) -> dict[str, str]:
        """Exactly what hashicorp/external does with data.external.qr_probe."""
        source = self.doc["data"]["external"]["qr_probe"]
        program = [untemplate(arg) for arg in source["program"]]
        cwd = source["working_dir"].replace("${path.module}", str(self.dir))
        done = subprocess.run(program, input=json.dumps(source["query"]), cwd=cwd,
                              env=self.env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert all(isinstance(v, str) for v in result.values())  # the protocol's rule
        return result

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([TERRAFORM, *args, "-no-color"], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)
        if ok:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def apply(self, *, ok: bool = True) -> tuple[str, subprocess.CompletedProcess[str]]:
        generation = self.probe()["generation"]
        done = self.run("apply", "-auto-approve", f"-var=qr_generation={generation}", ok=ok)
        return generation, done


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi(durations=ZERO_DURATIONS) as server:
        yield server


def labels(api: FakeTpuApi) -> dict[str, str]:
    qr = api.queued_resource(QR)
    assert qr is not None
    return qr["tpu"]["nodeSpec"][0]["node"]["labels"]


def writes(api: FakeTpuApi) -> list[str]:
    return [r.method for r in api.requests if r.method in ("POST", "DELETE")]


@pytest.mark.skipif(TERRAFORM is None, reason="the terraform CLI is not installed; this test "
                    "applies the flex stack's queued-resource part with it")
def test_terraform_drives_the_queued_resource_lifecycle(flex, api, tmp_path) -> None:
    (d, base), (_, changed) = flex["base"], flex["changed"]
    body = build_body(d, render_startup(d))
    tf = Terraform(tmp_path, api)
    tf.use(base)
    tf.run("init", "-input=false")

    # 0. a create the API refuses: the provisioner says so in one line, and Terraform fails.
    api.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied",
                  method="POST")
    _, done = tf.apply(ok=False)
    assert done.returncode != 0 and api.state_of(QR) is None
    [said] = [ln.split("(local-exec): ", 1)[1] for ln in done.stdout.splitlines()
              if "(local-exec): " in ln and "(local-exec): Executing:" not in ln]
    assert said.startswith(f"tpuserve: create queued resource {QR}: 403 PERMISSION_DENIED: "
                           "Permission 'tpu.queuedResources.create' denied -> check IAM")

    # 1. apply: the tainted resource is replaced (Terraform runs no destroy provisioner for a
    # tainted resource: create cleans up after itself instead), one create with the plan's
    # generation in the labels; it returns once the QR is accepted.
    gen1, done = tf.apply()
    assert "1 added, 0 changed, 1 destroyed" in done.stdout
    assert f"tpuserve: created {QR}" in done.stdout
    post = api.calls("POST")[-1]
    assert post.query == {"queuedResourceId": "tpuserve-flex"} and post.authorized
    assert post.body == with_generation(body, gen1)
    assert api.state_of(QR) == "ACTIVE"
    assert writes(api) == ["POST", "POST"]  # the refused one, then this one

    # 2. re-apply with no change: the probe answers the live QR's own token, nothing happens.
    gen2, done = tf.apply()
    assert gen2 == gen1
    assert "No changes." in done.stdout and writes(api) == ["POST", "POST"]

    # 3. change the body (max run 4h -> 2h): replaced, delete (force) first, then create.
    tf.use(changed)
    gen3, done = tf.apply()
    assert gen3 == gen1 and "1 added, 0 changed, 1 destroyed" in done.stdout
    assert writes(api)[2:] == ["DELETE", "POST"]
    assert api.calls("DELETE")[0].query == {"force": "true"}
    assert api.queued_resource(QR)["runDuration"] == {"maxRunDuration": "7200s"}

    # 4. the run duration ended (SUSPENDED, node deleted): the plan replaces it.
    api.set_state(QR, "SUSPENDED")
    gen4, done = tf.apply()
    assert gen4 != gen1 and "1 added, 0 changed, 1 destroyed" in done.stdout
    assert writes(api)[2:] == ["DELETE", "POST", "DELETE", "POST"]
    assert labels(api)[GENERATION_LABEL] == gen4 and api.state_of(QR) == "ACTIVE"

    # 5. deleted by hand: replaced too; the destroy step finds nothing and that is success.
    api.remove_queued_resource(QR)
    gen5, done = tf.apply()
    assert gen5 != gen4 and f"already gone: {QR}" in done.stdout
    assert writes(api)[-1:] == ["POST"] and labels(api)[GENERATION_LABEL] == gen5

    # 6. destroy: delete with force, wait until gone; the state is empty.
    gen6 = tf.probe()["generation"]
    assert gen6 == gen5
    done = tf.run("destroy", "-auto-approve", f"-var=qr_generation={gen6}")
    assert f"tpuserve: deleted {QR}" in done.stdout
    assert writes(api)[-1] == "DELETE" and api.queued_resource(QR) is None
    assert tf.run("state", "list").stdout.strip() == ""
    assert all(r.authorized for r in api.requests)


@pytest.mark.skipif(TERRAFORM is None, reason="the terraform CLI is not installed")
def test_a_429_burst_while_terraform_creates_still_ends_in_one_active_qr(
    flex, api, tmp_path
) -> None:
    _, base = flex["base"]
    tf = Terraform(tmp_path, api)
    tf.use(base)
    tf.run("init", "-input=false")
    # The plan's probe and the create's first look pass; then every status read is throttled
    # more times than one read retries (with and without Retry-After), and a gateway page.
    qr_path = f"/queuedResources/{QR.rsplit('/', 1)[1]}"
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Read requests'",
                  method="GET", path_contains=qr_path, times=4, retry_after="2", skip=2)
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Rate limited", method="GET",
                  path_contains=qr_path, times=4)
    api.html_next(502, method="GET", path_contains=qr_path)
    _, done = tf.apply()
    assert "1 added" in done.stdout and f"tpuserve: created {QR}" in done.stdout
    assert writes(api) == ["POST"]  # one create, and nothing deleted: the position is kept
    assert len(api.calls("GET", qr_path)) >= 2 + 4 + 4 + 1 + 1  # every fault was served
    assert api.state_of(QR) == "ACTIVE" and len(api.queued_resources) == 1
    assert tf.run("state", "list").stdout.split() == ["terraform_data.queued_resource"]


def test_a_body_too_big_for_the_environment_is_refused_at_synth(
    flex, monkeypatch, tmp_path: Path
) -> None:
    import stacks.serving
    from stacks.cdk import App
    from stacks.flex import FlexStack

    d, _ = flex["base"]
    # Incompressible text: the limit is on what reaches the environment, gzipped and base64-coded.
    noise = base64.b64encode(random.Random(7).randbytes(112_500)).decode()
    monkeypatch.setattr(stacks.serving, "render_startup", lambda _d: "#!/bin/bash\n#" + noise)
    with pytest.raises(ValueError, match=r"body is 1\d\d,\d{3} characters gzipped and "
                                         r"base64-coded: at most 100,000"):
        FlexStack(App(outdir=str(tmp_path)), d)  # no outdir: it would land in the repo


REPO = REPO_ROOT


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(),
                    reason="no .venv in the repo: `./dev setup` makes the interpreter the "
                           "provisioners default to")
def test_the_probe_runs_with_nothing_on_path(flex, api, tmp_path) -> None:
    """A user who types `cdktf deploy flex` has neither pipenv nor our venv on PATH:
    the synthesized program still finds the project's interpreter."""
    _, doc = flex["base"]
    source = doc["data"]["external"]["qr_probe"]
    program = [untemplate(arg) for arg in source["program"]]
    # ${path.module}/../../.. from cdktf.out/stacks/flex is the repo root.
    assert source["working_dir"] == "${path.module}/../../.."
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **api.environ()}
    done = subprocess.run(program, input=json.dumps(source["query"]), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "generation" in json.loads(done.stdout)


# ----------------------------------------------------- converge gives up nothing silently
def with_new_script(doc: dict[str, Any], tag: str) -> dict[str, Any]:
    """The flex stack as synthesized with another boot script (metadata only): both bodies
    and node_metadata's trigger change, the queued resource's spec_sha256 does not."""
    out = copy.deepcopy(doc)
    data = out["resource"]["terraform_data"]
    for name in ("queued_resource", "node_metadata"):
        meta = data[name]["input"]["body"]["tpu"]["nodeSpec"][0]["node"]["metadata"]
        meta["startup-script"] += f"\n# {tag}\n"
    body = untemplate_all(data["node_metadata"]["input"]["body"])
    data["node_metadata"]["triggers_replace"]["metadata_sha256"] = metadata_sha256(body)
    assert data["queued_resource"]["triggers_replace"] == doc["resource"]["terraform_data"][
        "queued_resource"]["triggers_replace"]
    return out


class FlexTerraform(Terraform):
    """The queued resource AND its node_metadata step, as synthesized."""

    def use(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        data = copy.deepcopy(doc["resource"]["terraform_data"])
        qr, meta = data["queued_resource"], data["node_metadata"]
        for resource in (qr, meta):
            resource.pop("//", None)
        qr.pop("depends_on")  # google-beta resources: not part of this offline run
        qr["triggers_replace"]["generation"] = "${var.qr_generation}"
        assert meta["input"]["generation"] == PROBE_REF
        meta["input"]["generation"] = "${var.qr_generation}"
        config = {"variable": {"qr_generation": {"type": "string"}},
                  "resource": {"terraform_data": {"queued_resource": qr, "node_metadata": meta}}}
        (self.dir / "main.tf.json").write_text(json.dumps(config, indent=1))


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln.split("(local-exec): ", 1)[1] for ln in done.stdout.splitlines()
            if "(local-exec): tpuserve: " in ln]


ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
RATE_LIMITED = [{"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com",
                 "metadata": {"service": "tpu.googleapis.com"}}]
OVER_QUOTA = [*RATE_LIMITED, {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                              "violations": [{"subject": "project:tpuserve-placeholder",
                                              "description": "TPU v5 lite chips"}]}]


@pytest.mark.skipif(TERRAFORM is None, reason="the terraform CLI is not installed; this test "
                    "applies the flex stack's queued-resource part with it")
def test_a_queued_qr_re_created_by_converge_is_retried_or_restored_by_the_next_deploy(
    flex, tmp_path,
) -> None:
    _, base = flex["base"]
    # A QR that waits for resources for ever: converge deletes and re-creates it.
    with FakeTpuApi(durations={"CREATING": 0, "ACCEPTED": 0, "DELETING": 0}) as api:
        tf = FlexTerraform(tmp_path, api)
        tf.use(base)
        tf.run("init", "-input=false")
        gen1, _ = tf.apply()
        assert api.state_of(QR) == "WAITING_FOR_RESOURCES"

        # 1. new metadata; the re-create is throttled once (a rate limit): retried, applied.
        tf.use(with_new_script(base, "one"))
        api.fail_next(429, "RESOURCE_EXHAUSTED", "Too many requests", method="POST",
                      details=RATE_LIMITED, retry_after="1")
        gen, done = tf.apply()
        assert gen == gen1
        assert any(line.startswith(f"tpuserve: recreated {QR} with the new metadata")
                   for line in said(done))
        assert writes(api)[1:] == ["DELETE", "POST", "POST"]

        # 2. new metadata again; the re-create is refused for quota: not retried, and the one
        # line says the QR is gone and what brings it back.
        tf.use(with_new_script(base, "two"))
        api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded", method="POST",
                      details=OVER_QUOTA)
        _, done = tf.apply(ok=False)
        assert done.returncode != 0 and api.state_of(QR) is None
        [line] = [ln for ln in said(done) if "429" in ln]
        assert (f"the queued resource {QR} (it was WAITING_FOR_RESOURCES, no capacity yet) was "
                "DELETED to change its metadata and is NOT re-created: run `cdktf deploy flex`"
                ) in line
        assert writes(api)[4:] == ["DELETE", "POST"]

        # 3. what the line says restores it: the next deploy (probe + apply) creates the QR
        # anew with the new metadata, and converge then finds nothing to change.
        gen3, done = tf.apply()
        assert gen3 != gen1
        assert f"tpuserve: created {QR}" in done.stdout
        assert any(ln.endswith("metadata unchanged (its node will boot with it)")
                   for ln in said(done))
        qr = api.queued_resource(QR)
        assert qr is not None and qr["tpu"]["nodeSpec"][0]["node"]["metadata"][
            "startup-script"].endswith("\n# two\n")
