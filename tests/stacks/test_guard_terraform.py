"""The billing guard's arming resource, run by REAL Terraform against the fake APIs.

Offline, as in test_flex_terraform.py: `terraform_data.billing_guard` is taken from the
session's synthesized spot stack unchanged (provisioners, commands, environment, working_dir,
triggers_replace), except that the TPU VM it follows is played by a built-in
`terraform_data.tpu_node` whose id, like the VM's, is unknown until it is created. The
provisioners really run `python -m tpuserve.billing_guard` against the fake TPU and Cloud
Tasks APIs.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cloud_tasks import FakeCloudTasks
from tests.fakes.tpu_api import FakeTpuApi
from tpuserve.contracts import GUARD_TPU_ENDPOINT_ENV as ENV_TPU_ENDPOINT
from tpuserve.gcp.endpoints import TOKEN_ENV, TPU_API
from tpuserve.settings import Deployment

TERRAFORM = shutil.which("terraform")
NODE_REF = "${google_tpu_v2_vm.tpu_node.id}"
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Terraform:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.dir = root / "cdktf.out" / "stacks" / "spot"  # ${path.module}/../../.. = root
        self.dir.mkdir(parents=True)
        rc = root / "terraformrc"
        rc.write_text("")
        self.env = {**os.environ, **env, "TPUSERVE_PYTHON": sys.executable,
                    "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0",
                    "TF_CLI_CONFIG_FILE": str(rc)}

    def use(self, doc: dict[str, Any]) -> None:
        guard = copy.deepcopy(doc["resource"]["terraform_data"]["billing_guard"])
        guard.pop("//", None)
        guard.pop("depends_on")  # google-beta resources: not part of this offline run
        assert guard["triggers_replace"]["node_id"] == NODE_REF
        guard["triggers_replace"]["node_id"] = "${terraform_data.tpu_node.id}"
        guard["depends_on"] = ["terraform_data.tpu_node"]
        config = {
            "variable": {"node_generation": {"type": "string"}},
            "resource": {"terraform_data": {
                # The TPU VM's stand-in: replaced when the generation changes, as a recreated
                # node is; its id is unknown until then.
                "tpu_node": {"triggers_replace": "${var.node_generation}"},
                "billing_guard": guard,
            }},
        }
        (self.dir / "main.tf.json").write_text(json.dumps(config, indent=1))

    def run(self, *args: str) -> str:
        done = subprocess.run([TERRAFORM, *args, "-no-color"], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture
def fakes(deployments: dict[str, Deployment]) -> Iterator[tuple[FakeTpuApi, FakeCloudTasks,
                                                                Clock]]:
    clock = Clock(T0)
    with FakeTpuApi(token="tf-token", clock=clock) as tpu, \
            FakeCloudTasks(token="tf-token", clock=clock) as tasks:
        tasks.add_queue(deployments["spot"].guard_queue)
        yield tpu, tasks, clock


def _writes(tasks: FakeCloudTasks) -> list[str]:
    return [method for method, _path, _body in tasks.requests if method in ("POST", "DELETE")]


@pytest.mark.skipif(TERRAFORM is None, reason="the terraform CLI is not installed; this test "
                    "applies the spot stack's billing-guard resource with it")
def test_terraform_arms_re_arms_and_disarms_the_guard(synthesized, deployments, fakes,
                                                      tmp_path: Path) -> None:
    tpu, tasks, clock = fakes
    d = deployments["spot"]
    # The deploying shell points the arming calls at the fakes and carries a hostile task
    # endpoint of its own: neither may reach the task.
    tf = Terraform(tmp_path, {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu.url,
                              **tasks.environ(), TOKEN_ENV: "tf-token",
                              ENV_TPU_ENDPOINT: "https://evil.p.googleapis.com/"})
    tf.use(synthesized["spot"])
    tf.run("init", "-input=false")

    # 1. the node exists (created at T0): apply arms one task at T0 + 8 h.
    tpu.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    clock.t = T0 + 120
    out = tf.run("apply", "-auto-approve", "-var=node_generation=1")
    assert "billing guard armed: deletes the node at 2026-01-01T08:00:00Z" in out
    [task] = tasks.task_names()
    assert re.fullmatch(rf"{d.guard_queue}/tasks/tpuserve-spot-{T0}-[0-9a-f]{{8}}", task)
    assert tasks.tasks[task].schedule_time == dt.datetime(2026, 1, 1, 8, tzinfo=dt.UTC)
    assert tasks.tasks[task].http_request["url"] == f"{TPU_API}v2/{d.node_path}"

    # 2. nothing changed: the plan is empty (no timestamp in Terraform) and nothing is called.
    assert "No changes." in tf.run("plan", "-var=node_generation=1")
    calls = len(tasks.requests)
    assert "No changes." in tf.run("apply", "-auto-approve", "-var=node_generation=1")
    assert len(tasks.requests) == calls

    # 3. the node is recreated two hours later: disarmed, then armed at the new deadline.
    tpu.nodes.pop(d.node_path)
    clock.t = T0 + 7200
    tpu.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    out = tf.run("apply", "-auto-approve", "-var=node_generation=2")
    assert "billing guard disarmed (1 task(s) deleted)" in out
    assert "deletes the node at 2026-01-01T10:00:00Z" in out
    [task] = tasks.task_names()
    assert re.fullmatch(rf"{d.guard_queue}/tasks/tpuserve-spot-{T0 + 7200}-[0-9a-f]{{8}}", task)
    assert _writes(tasks) == ["POST", "DELETE", "POST"]

    # 4. destroy: disarmed, nothing left in the queue or the state.
    out = tf.run("destroy", "-auto-approve", "-var=node_generation=2")
    assert "billing guard disarmed (1 task(s) deleted)" in out
    assert tasks.task_names() == []
    assert tf.run("state", "list").strip() == ""
    # The provisioners called the node only to read it: deleting it is the task's job.
    assert tpu.calls("DELETE") == []


@pytest.mark.skipif(TERRAFORM is None, reason="the terraform CLI is not installed; this test "
                    "applies the spot stack's billing-guard resource with it")
def test_a_guard_armed_by_the_previous_stack_is_re_armed_at_googles_endpoint(
    synthesized, deployments, fakes, tmp_path: Path,
) -> None:
    """State from a guard without input.tpu_endpoint (its task aimed at the shell's
    override): the next apply replaces the resource, its destroy step disarms from the old
    state, and the new task calls Google's API; Google's network then deletes the node."""
    tpu, tasks, clock = fakes
    d = deployments["spot"]
    tf = Terraform(tmp_path, {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu.url,
                              **tasks.environ(), TOKEN_ENV: "tf-token"})
    old = copy.deepcopy(synthesized["spot"])
    guard = old["resource"]["terraform_data"]["billing_guard"]
    for block in (guard["input"], guard["triggers_replace"]):
        del block["tpu_endpoint"]
    arm_step = guard["provisioner"][0]["local-exec"]
    del arm_step["environment"][ENV_TPU_ENDPOINT]
    tf.use(old)
    tf.run("init", "-input=false")
    tpu.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    clock.t = T0 + 60
    tf.run("apply", "-auto-approve", "-var=node_generation=1")
    [first] = tasks.task_names()

    tf.use(synthesized["spot"])
    out = tf.run("apply", "-auto-approve", "-var=node_generation=1")
    assert "billing guard disarmed (1 task(s) deleted)" in out
    [task] = tasks.task_names()
    assert task != first
    assert tasks.tasks[task].http_request["url"] == f"{TPU_API}v2/{d.node_path}"
    tasks.route(TPU_API, tpu.url)
    [fired] = tasks.run_due(T0 + 8 * 3600, token_for=lambda _email: "tf-token")
    assert fired.status == 200 and tpu.nodes[d.node_path].state == "DELETING"
